// Shard maps that only the scheduler can make: the scheduler process signs every map it
// publishes with an Ed25519 key it makes at start and never writes anywhere; servers
// learn the public half from the scheduler's replies (registration, heartbeats) and
// install only maps it verifies. A map is identified by its content digest, so two
// different maps with the same epoch are told apart (a conflict) rather than taken for
// one already installed.
#ifndef PARAMSERVER_COMMON_SECURITY_SHARD_MAP_SIGNATURE_H_
#define PARAMSERVER_COMMON_SECURITY_SHARD_MAP_SIGNATURE_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/scheduler.pb.h"

namespace paramserver {

// Bytes of an Ed25519 public key and of a signature.
inline constexpr size_t kMapKeyBytes = 32;
inline constexpr size_t kMapSignatureBytes = 64;

// The SHA-256 (32 raw bytes) of `map`'s deterministic serialization without its
// signature: what is signed, and what tells two maps of one epoch apart.
std::string ShardMapDigest(const ShardMap& map);

// The first 8 bytes of a digest as 16 hex digits, for log lines.
std::string ShortDigest(absl::string_view digest);

// An Ed25519 private key held in memory only. Thread-safe (signing is const).
class MapSigningKey {
 public:
  // A fresh key from the operating system's random source. INTERNAL if OpenSSL fails.
  static absl::StatusOr<std::unique_ptr<MapSigningKey>> Generate();
  ~MapSigningKey();
  MapSigningKey(const MapSigningKey&) = delete;
  MapSigningKey& operator=(const MapSigningKey&) = delete;

  // The public key, kMapKeyBytes raw bytes.
  const std::string& public_key() const { return public_key_; }

  // Sets map->signature to this key's signature of ShardMapDigest(*map).
  void Sign(ShardMap* map) const;

 private:
  struct Key;
  MapSigningKey(std::unique_ptr<Key> key, std::string public_key);
  std::unique_ptr<Key> key_;
  std::string public_key_;
};

// OK if `map` carries a valid signature by `public_key` (kMapKeyBytes raw bytes).
// PERMISSION_DENIED naming the map's epoch for a missing, malformed or wrong signature,
// or when no key is known yet (`public_key` empty).
absl::Status VerifyShardMapSignature(const ShardMap& map, absl::string_view public_key);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_SECURITY_SHARD_MAP_SIGNATURE_H_
