#include "common/security/shard_map_signature.h"

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

ShardMap ExampleMap() {
  ShardMap map;
  map.set_epoch(7);
  ShardAssignment* shard = map.add_shards();
  shard->set_shard_id(0);
  shard->set_server_name("ps-0");
  shard->set_server_address("127.0.0.1:5000");
  NodeCredential* credential = map.add_credentials();
  credential->set_node_name("worker-0");
  credential->set_role(NODE_ROLE_WORKER);
  credential->set_token_sha256(std::string(32, 'w'));
  return map;
}

TEST_CASE("a map signed by the scheduler's key verifies, and only with that key") {
  auto key = MapSigningKey::Generate();
  REQUIRE(key.ok());
  CHECK((*key)->public_key().size() == kMapKeyBytes);
  ShardMap map = ExampleMap();
  (*key)->Sign(&map);
  CHECK(map.signature().size() == kMapSignatureBytes);
  CHECK(VerifyShardMapSignature(map, (*key)->public_key()).ok());

  auto other = MapSigningKey::Generate();
  REQUIRE(other.ok());
  CHECK((*other)->public_key() != (*key)->public_key());
  const absl::Status wrong_key = VerifyShardMapSignature(map, (*other)->public_key());
  CHECK(wrong_key.code() == absl::StatusCode::kPermissionDenied);
  CHECK(wrong_key.message().find("epoch 7") != absl::string_view::npos);
  CHECK(VerifyShardMapSignature(map, "").code() == absl::StatusCode::kPermissionDenied);
}

TEST_CASE("any change to a signed map breaks its signature") {
  auto key = MapSigningKey::Generate();
  REQUIRE(key.ok());
  ShardMap map = ExampleMap();
  (*key)->Sign(&map);
  const std::string public_key = (*key)->public_key();

  ShardMap next_epoch = map;  // a forged map one epoch ahead, with the old signature
  next_epoch.set_epoch(8);
  CHECK(VerifyShardMapSignature(next_epoch, public_key).code() ==
        absl::StatusCode::kPermissionDenied);
  ShardMap other_digest = map;  // a worker's credential digest replaced
  other_digest.mutable_credentials(0)->set_token_sha256(std::string(32, 'a'));
  CHECK(VerifyShardMapSignature(other_digest, public_key).code() ==
        absl::StatusCode::kPermissionDenied);
  ShardMap flipped = map;  // one bit of the signature itself
  std::string signature = flipped.signature();
  signature[5] ^= 1;
  flipped.set_signature(signature);
  CHECK(VerifyShardMapSignature(flipped, public_key).code() == absl::StatusCode::kPermissionDenied);
  ShardMap unsigned_map = map;
  unsigned_map.clear_signature();
  CHECK(
      VerifyShardMapSignature(unsigned_map, public_key).message().find("no scheduler signature") !=
      absl::string_view::npos);
}

TEST_CASE("the digest ignores the signature and tells same-epoch maps apart") {
  auto key = MapSigningKey::Generate();
  REQUIRE(key.ok());
  ShardMap map = ExampleMap();
  const std::string unsigned_digest = ShardMapDigest(map);
  CHECK(unsigned_digest.size() == 32);
  (*key)->Sign(&map);
  CHECK(ShardMapDigest(map) == unsigned_digest);
  ShardMap moved = ExampleMap();
  moved.mutable_shards(0)->set_server_name("ps-1");
  CHECK(moved.epoch() == map.epoch());
  CHECK(ShardMapDigest(moved) != unsigned_digest);
  CHECK(ShortDigest(unsigned_digest).size() == 16);
}

}  // namespace
}  // namespace paramserver
