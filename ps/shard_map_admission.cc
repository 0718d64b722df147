#include "ps/shard_map_admission.h"

#include "absl/strings/str_cat.h"
#include "common/security/shard_map_signature.h"

namespace paramserver {

absl::StatusOr<MapAdmission> AdmitShardMap(const ShardMap& map, const ServedMap& served) {
  if (map.epoch() > served.epoch) return MapAdmission::kInstall;
  if (map.epoch() < served.epoch) {
    return absl::FailedPreconditionError(absl::StrCat("shard map epoch ", map.epoch(),
                                                      " refused: this server serves epoch ",
                                                      served.epoch, " already"));
  }
  const std::string digest = ShardMapDigest(map);
  // A server that serves no map yet (epoch 0, no digest) takes an epoch-0 map as
  // already served: there is nothing to install.
  if (served.digest.empty() || digest == served.digest) return MapAdmission::kAlreadyServed;
  return absl::AbortedError(absl::StrCat("shard map epoch ", map.epoch(), " (digest ",
                                         ShortDigest(digest), ") conflicts with the map of epoch ",
                                         served.epoch, " this server serves (digest ",
                                         ShortDigest(served.digest), "); the served map stands"));
}

}  // namespace paramserver
