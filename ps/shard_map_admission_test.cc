#include "ps/shard_map_admission.h"

#include "catch2/catch.hpp"
#include "common/security/shard_map_signature.h"

namespace paramserver {
namespace {

ShardMap MapAt(int64_t epoch, const std::string& primary) {
  ShardMap map;
  map.set_epoch(epoch);
  ShardAssignment* shard = map.add_shards();
  shard->set_shard_id(0);
  shard->set_server_name(primary);
  return map;
}

TEST_CASE("a newer map is installed, the served one again is a no-op") {
  const ShardMap served_map = MapAt(4, "ps-0");
  const ServedMap served{4, ShardMapDigest(served_map)};
  CHECK(*AdmitShardMap(MapAt(5, "ps-1"), served) == MapAdmission::kInstall);
  CHECK(*AdmitShardMap(served_map, served) == MapAdmission::kAlreadyServed);
  // The signature is not content: the same map signed anew (a scheduler that took
  // over) is the same map.
  ShardMap resigned = served_map;
  resigned.set_signature(std::string(64, 's'));
  CHECK(*AdmitShardMap(resigned, served) == MapAdmission::kAlreadyServed);
  CHECK(*AdmitShardMap(MapAt(1, "ps-0"), ServedMap{}) == MapAdmission::kInstall);
}

TEST_CASE("a same-epoch map with other content is a conflict naming both digests") {
  const ShardMap served_map = MapAt(4, "ps-0");
  const ServedMap served{4, ShardMapDigest(served_map)};
  const ShardMap other = MapAt(4, "ps-1");
  const absl::StatusOr<MapAdmission> admitted = AdmitShardMap(other, served);
  REQUIRE(admitted.status().code() == absl::StatusCode::kAborted);
  const std::string message(admitted.status().message());
  CHECK(message.find("epoch 4") != std::string::npos);
  CHECK(message.find(ShortDigest(served.digest)) != std::string::npos);
  CHECK(message.find(ShortDigest(ShardMapDigest(other))) != std::string::npos);
}

TEST_CASE("an older map (a replay) is refused naming both epochs") {
  const ServedMap served{4, ShardMapDigest(MapAt(4, "ps-0"))};
  const absl::StatusOr<MapAdmission> admitted = AdmitShardMap(MapAt(3, "ps-0"), served);
  REQUIRE(admitted.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(admitted.status().message().find("epoch 3") != absl::string_view::npos);
  CHECK(admitted.status().message().find("epoch 4") != absl::string_view::npos);
}

}  // namespace
}  // namespace paramserver
