// Delivers a new shard map to the servers: first those giving shards up (they write
// handoff checkpoints), then the rest, each phase in parallel with a deadline.
#ifndef PARAMSERVER_SCHEDULER_MAP_PUBLISHER_H_
#define PARAMSERVER_SCHEDULER_MAP_PUBLISHER_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/security/peer_credentials.h"
#include "scheduler/cluster_registry.h"

namespace paramserver {

// Blocks until every server answered or `timeout` passed per phase. Failures are
// logged: a server that missed the push learns the epoch from its next heartbeat.
// Returns the number of servers that confirmed they serve the new epoch.
int PublishShardMap(const MapChange& change,
                    const std::shared_ptr<const CallCredentials>& credentials,
                    absl::Duration timeout);

struct CheckpointScheduling {
  int passed_shards = 0;               // already past the step (0: the checkpoint will be complete)
  int64_t newest_applied_updates = 0;  // the furthest shard's update count
};

// Asks every server in `addresses` to checkpoint its shards at update `step`. Returns
// what they answered, or the first server's error.
absl::StatusOr<CheckpointScheduling> ScheduleCheckpointOnServers(
    const std::vector<std::string>& addresses,
    const std::shared_ptr<const CallCredentials>& credentials, int64_t step,
    absl::Duration timeout);

}  // namespace paramserver

#endif  // PARAMSERVER_SCHEDULER_MAP_PUBLISHER_H_
