// The scheduler's record of the job: who registered, their heartbeats and progress,
// the shard map, and how the job ended. Plain class, no RPC.
#ifndef PARAMSERVER_SCHEDULER_CLUSTER_REGISTRY_H_
#define PARAMSERVER_SCHEDULER_CLUSTER_REGISTRY_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/cluster_spec.h"
#include "proto/scheduler.pb.h"

namespace paramserver {

struct JobResult {
  double test_accuracy = 0;
  double samples_per_sec = 0;  // all workers' samples / the longest worker's training time
  int64_t steps = 0;           // steps per worker (the most any worker ran)
};

struct SilentNode {
  std::string name;
  absl::Duration silent_for;
};

// Thread-safe. `now` arguments make time explicit for tests.
class ClusterRegistry {
 public:
  ClusterRegistry(ClusterSection cluster, int64_t total_parameters);

  // Gives the node a name ("ps-0", "worker-1") and its rank in registration order.
  // Registering the same role and address again returns the same name (a retried call).
  // INVALID_ARGUMENT for a missing role or address; RESOURCE_EXHAUSTED once the role's
  // expected count is reached. Once the last expected node registers, shards are placed.
  absl::StatusOr<RegisterResponse> Register(NodeRole role, const std::string& address, absl::Time now)
      ABSL_LOCKS_EXCLUDED(mu_);

  ClusterView View() const ABSL_LOCKS_EXCLUDED(mu_);

  // NOT_FOUND for a node that never registered.
  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request, absl::Time now)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<ReportFinishedResponse> ReportFinished(const ReportFinishedRequest& request, absl::Time now)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Records the final evaluation and marks the job finished. FAILED_PRECONDITION unless
  // it comes from the rank-0 worker after every worker finished.
  absl::StatusOr<JobResult> ReportResult(const ReportResultRequest& request) ABSL_LOCKS_EXCLUDED(mu_);

  // Nodes (not yet finished) whose last heartbeat is older than `timeout` and that were
  // not reported by an earlier call. A node that heartbeats again may be reported again.
  std::vector<SilentNode> TakeNewlySilentNodes(absl::Time now, absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

  bool job_finished() const ABSL_LOCKS_EXCLUDED(mu_);
  // True once every server has heartbeated since the job finished (and so was told).
  bool all_servers_told_to_stop() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Node {
    std::string name;
    NodeRole role = NODE_ROLE_UNSPECIFIED;
    int rank = 0;
    std::string address;
    absl::Time last_heartbeat;
    NodeProgress progress;
    bool finished = false;
    bool reported_silent = false;
    bool told_to_stop = false;
    ReportFinishedRequest summary;
  };

  Node* FindNode(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int CountRole(NodeRole role) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int FinishedWorkers() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ClusterSection cluster_;
  const int64_t total_parameters_;
  mutable absl::Mutex mu_;
  std::vector<Node> nodes_ ABSL_GUARDED_BY(mu_);
  std::optional<ShardMap> shard_map_ ABSL_GUARDED_BY(mu_);
  std::optional<JobResult> result_ ABSL_GUARDED_BY(mu_);
};

}  // namespace paramserver

#endif  // PARAMSERVER_SCHEDULER_CLUSTER_REGISTRY_H_
