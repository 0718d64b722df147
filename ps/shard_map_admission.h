// Whether a server takes a shard map it is offered, given the map it serves: the
// decision only (no I/O), so that forged, replayed and conflicting maps are tested
// without gRPC. The signature is checked separately, before this (common/
// shard_map_signature.h): this decides between maps that are all the scheduler's.
#ifndef PARAMSERVER_PS_SHARD_MAP_ADMISSION_H_
#define PARAMSERVER_PS_SHARD_MAP_ADMISSION_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "proto/scheduler.pb.h"

namespace paramserver {

enum class MapAdmission {
  kInstall,        // newer than the map served: install it
  kAlreadyServed,  // the very map served (the same digest): nothing to do
};

// The map a server serves: its epoch (0: none yet) and ShardMapDigest (empty: none).
struct ServedMap {
  int64_t epoch = 0;
  std::string digest;
};

// kInstall for a map of a newer epoch; kAlreadyServed for the served map again.
// ABORTED for a map of the served epoch whose digest differs (a conflict: the served
// map stands), naming the epoch and both digests; FAILED_PRECONDITION for an older
// epoch (a replayed or overtaken map), naming both epochs.
absl::StatusOr<MapAdmission> AdmitShardMap(const ShardMap& map, const ServedMap& served);

}  // namespace paramserver

#endif  // PARAMSERVER_PS_SHARD_MAP_ADMISSION_H_
