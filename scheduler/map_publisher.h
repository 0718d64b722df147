// Delivers a new shard map to the servers: first those giving shards up (they write
// handoff checkpoints), then the rest, each phase in parallel with a deadline.
#ifndef PARAMSERVER_SCHEDULER_MAP_PUBLISHER_H_
#define PARAMSERVER_SCHEDULER_MAP_PUBLISHER_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "scheduler/cluster_registry.h"

namespace paramserver {

// Blocks until every server answered or `timeout` passed per phase. Failures are
// logged: a server that missed the push learns the epoch from its next heartbeat.
// Returns the number of servers that confirmed they serve the new epoch.
int PublishShardMap(const MapChange& change, absl::Duration timeout);

// Asks every server in `addresses` to checkpoint its shards at update `step`. Returns
// how many shards were already past it (0: the checkpoint will be complete), or the
// first server's error.
absl::StatusOr<int> ScheduleCheckpointOnServers(const std::vector<std::string>& addresses, int64_t step,
                                                absl::Duration timeout);

}  // namespace paramserver

#endif  // PARAMSERVER_SCHEDULER_MAP_PUBLISHER_H_
