// Delivers a new shard map to the servers: first those giving shards up (they write
// handoff checkpoints), then the rest, each phase in parallel with a deadline.
#ifndef PARAMSERVER_SCHEDULER_MAP_PUBLISHER_H_
#define PARAMSERVER_SCHEDULER_MAP_PUBLISHER_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/security/peer_credentials.h"
#include "proto/parameter_server.grpc.pb.h"
#include "scheduler/cluster_registry.h"

namespace paramserver {

// Thread-safe. The scheduler's stubs for calling servers, one per address, made on first
// use and kept: a map change does not wait for new connections.
class ServerStubs {
 public:
  // Every call carries `credentials` (the scheduler's).
  explicit ServerStubs(std::shared_ptr<const CallCredentials> credentials)
      : credentials_(std::move(credentials)) {}

  ParameterServer::Stub& For(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::shared_ptr<const CallCredentials> credentials_;
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<ParameterServer::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
};

// Blocks until every server answered or `timeout` passed per phase. Failures are
// logged: a server that missed the push learns the epoch from its next heartbeat.
// Returns the number of servers that confirmed they serve the new epoch.
int PublishShardMap(const MapChange& change, ServerStubs& servers, absl::Duration timeout);

struct CheckpointScheduling {
  int passed_shards = 0;               // already past the step (0: the checkpoint will be complete)
  int64_t newest_applied_updates = 0;  // the furthest shard's update count
};

// Asks every server in `addresses` to checkpoint its shards at update `step`. Returns
// what they answered, or the first server's error.
absl::StatusOr<CheckpointScheduling> ScheduleCheckpointOnServers(
    const std::vector<std::string>& addresses, ServerStubs& servers, int64_t step,
    absl::Duration timeout);

}  // namespace paramserver

#endif  // PARAMSERVER_SCHEDULER_MAP_PUBLISHER_H_
