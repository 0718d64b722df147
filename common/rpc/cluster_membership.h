// A node's membership of the cluster, the part servers and workers share: its
// connection to the scheduler, its registration (the name and rank the scheduler gives
// it), the heartbeats with what to do when the scheduler stays silent, and the watch
// for a spot interruption notice, on which the node leaves the job. What a node says in
// its heartbeats and does with the answers is its own (HeartbeatHandlers).
#ifndef PARAMSERVER_COMMON_RPC_CLUSTER_MEMBERSHIP_H_
#define PARAMSERVER_COMMON_RPC_CLUSTER_MEMBERSHIP_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/ops/instance_metadata.h"
#include "common/rpc/heartbeat_sender.h"
#include "common/rpc/scheduler_client.h"
#include "common/security/peer_credentials.h"
#include "proto/scheduler.pb.h"

namespace paramserver {

struct MembershipOptions {
  std::string scheduler_address;  // host:port
  NodeRole role = NODE_ROLE_UNSPECIFIED;
  std::string advertised_address;  // where the others reach this node
  // Each call to the scheduler's deadline (cluster.failure_timeout_ms) and the
  // heartbeats' interval (cluster.heartbeat_interval_ms).
  absl::Duration rpc_timeout = absl::Seconds(3);
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  // The cluster token; registration adds this node's own credential to it.
  std::shared_ptr<CallCredentials> credentials;
};

// HeartbeatSender's callbacks: what this node sends, and does with the answers.
struct HeartbeatHandlers {
  std::function<HeartbeatRequest()> make_request;  // node_name is set by the sender
  std::function<void(const HeartbeatResponse&)> on_response;
  std::function<void(const absl::Status&)> on_refused;  // may be empty
  SchedulerOutagePolicy outage;
};

// Thread-safe: scheduler() and the accessors from any thread; Rejoin from one at a
// time (the heartbeat thread's on_refused). The destructor stops the heartbeats and the
// spot watch, waiting for at most one call of each: an owner whose handlers call back
// through its pointer to this object stops the heartbeats (StopHeartbeats) before it
// destroys it.
class ClusterMembership {
 public:
  // Registers as options.role, retrying while the scheduler is unreachable until
  // `deadline` (SchedulerClient::Register's errors), then logs the line the launcher
  // waits for ("registered with the scheduler at ADDRESS; serving on ADVERTISED ...")
  // and tags this process's log lines with the node's name from then on.
  static absl::StatusOr<std::unique_ptr<ClusterMembership>> Join(MembershipOptions options,
                                                                 absl::Time deadline);
  ~ClusterMembership();

  // Registers again (a node the scheduler had declared dead, rejoining): the new
  // registration, or FAILED_PRECONDITION when the scheduler gave it another name (it
  // was replaced; this process must not act as that name), which goes in *other_name
  // (when not null) for the caller to give back.
  absl::StatusOr<RegisterResponse> Rejoin(absl::Time deadline, std::string* other_name = nullptr);

  // Starts heartbeating every heartbeat_interval (HeartbeatSender). Once only.
  void StartHeartbeats(HeartbeatHandlers handlers);
  // Stops them (a node shutting down stops telling the scheduler it is alive).
  void StopHeartbeats();

  // Polls `imds_endpoint` for a spot interruption notice every `poll_interval`; on the
  // first, leaves the job ("spot interruption: NOTICE") and calls `on_left` with how
  // the leave went, on the watcher's thread. Once only.
  void WatchSpotInterruptions(const std::string& imds_endpoint, absl::Duration poll_interval,
                              std::function<void(const absl::Status& left)> on_left);

  SchedulerClient* scheduler() const { return scheduler_.get(); }
  const std::string& node_name() const { return registration_.node_name(); }
  int rank() const { return registration_.rank(); }
  // The first registration's answer (the scheduler's identity as it was then).
  const RegisterResponse& registration() const { return registration_; }

 private:
  ClusterMembership(MembershipOptions options, std::unique_ptr<SchedulerClient> scheduler,
                    RegisterResponse registration);

  const MembershipOptions options_;
  const std::unique_ptr<SchedulerClient> scheduler_;
  const RegisterResponse registration_;
  std::unique_ptr<HeartbeatSender> heartbeats_;
  std::unique_ptr<SpotInterruptionWatcher> spot_watcher_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_RPC_CLUSTER_MEMBERSHIP_H_
