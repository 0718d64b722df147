#include "common/security/shard_map_signature.h"

#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/security/secrets.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "openssl/evp.h"

namespace paramserver {
namespace {

// What is signed: a fixed label and the map's digest, so that a signature over a map
// can never be taken for one over anything else.
std::string SignedMessage(const ShardMap& map) {
  return absl::StrCat("paramserver shard map v1\n", ShardMapDigest(map));
}

}  // namespace

std::string ShardMapDigest(const ShardMap& map) {
  ShardMap unsigned_map = map;
  unsigned_map.clear_signature();
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    unsigned_map.SerializeToCodedStream(&coded);
  }
  return Sha256(bytes);
}

std::string ShortDigest(absl::string_view digest) {
  return absl::BytesToHexString(digest.substr(0, 8));
}

struct MapSigningKey::Key {
  EVP_PKEY* pkey = nullptr;
  ~Key() { EVP_PKEY_free(pkey); }
};

MapSigningKey::MapSigningKey(std::unique_ptr<Key> key, std::string public_key)
    : key_(std::move(key)), public_key_(std::move(public_key)) {}

MapSigningKey::~MapSigningKey() = default;

absl::StatusOr<std::unique_ptr<MapSigningKey>> MapSigningKey::Generate() {
  auto key = std::make_unique<Key>();
  EVP_PKEY_CTX* context = EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, nullptr);
  const bool made = context != nullptr && EVP_PKEY_keygen_init(context) == 1 &&
                    EVP_PKEY_keygen(context, &key->pkey) == 1;
  EVP_PKEY_CTX_free(context);
  if (!made) return absl::InternalError("cannot make the scheduler's map-signing key (OpenSSL)");
  std::string public_key(kMapKeyBytes, '\0');
  size_t length = public_key.size();
  if (EVP_PKEY_get_raw_public_key(key->pkey, reinterpret_cast<unsigned char*>(public_key.data()),
                                  &length) != 1 ||
      length != kMapKeyBytes) {
    return absl::InternalError("cannot read the scheduler's map-signing key (OpenSSL)");
  }
  return std::unique_ptr<MapSigningKey>(new MapSigningKey(std::move(key), std::move(public_key)));
}

void MapSigningKey::Sign(ShardMap* map) const {
  const std::string message = SignedMessage(*map);
  std::string signature(kMapSignatureBytes, '\0');
  size_t length = signature.size();
  EVP_MD_CTX* context = EVP_MD_CTX_new();
  const bool signed_ok =
      context != nullptr &&
      EVP_DigestSignInit(context, nullptr, nullptr, nullptr, key_->pkey) == 1 &&
      EVP_DigestSign(context, reinterpret_cast<unsigned char*>(signature.data()), &length,
                     reinterpret_cast<const unsigned char*>(message.data()), message.size()) == 1;
  EVP_MD_CTX_free(context);
  // Ed25519 signing with a valid key cannot fail but for memory exhaustion; an unsigned
  // map is then refused by every server (and logged there), never trusted.
  map->set_signature(signed_ok && length == kMapSignatureBytes ? signature : std::string());
}

absl::Status VerifyShardMapSignature(const ShardMap& map, absl::string_view public_key) {
  if (public_key.size() != kMapKeyBytes) {
    return absl::PermissionDeniedError(absl::StrCat(
        "shard map epoch ", map.epoch(), " refused: no scheduler map key is known here yet"));
  }
  if (map.signature().size() != kMapSignatureBytes) {
    return absl::PermissionDeniedError(absl::StrCat("shard map epoch ", map.epoch(),
                                                    " refused: it carries no scheduler signature"));
  }
  EVP_PKEY* pkey = EVP_PKEY_new_raw_public_key(
      EVP_PKEY_ED25519, nullptr, reinterpret_cast<const unsigned char*>(public_key.data()),
      public_key.size());
  const std::string message = SignedMessage(map);
  EVP_MD_CTX* context = EVP_MD_CTX_new();
  const bool valid =
      pkey != nullptr && context != nullptr &&
      EVP_DigestVerifyInit(context, nullptr, nullptr, nullptr, pkey) == 1 &&
      EVP_DigestVerify(context, reinterpret_cast<const unsigned char*>(map.signature().data()),
                       map.signature().size(),
                       reinterpret_cast<const unsigned char*>(message.data()), message.size()) == 1;
  EVP_MD_CTX_free(context);
  EVP_PKEY_free(pkey);
  if (!valid) {
    return absl::PermissionDeniedError(
        absl::StrCat("shard map epoch ", map.epoch(), " (digest ", ShortDigest(ShardMapDigest(map)),
                     ") refused: its signature is not the scheduler's"));
  }
  return absl::OkStatus();
}

}  // namespace paramserver
