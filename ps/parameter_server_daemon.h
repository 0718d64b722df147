// A parameter-server process, wired up: RPC server, registration with the scheduler,
// its shards, heartbeats. main.cc only parses flags and calls this.
#ifndef PARAMSERVER_PS_PARAMETER_SERVER_DAEMON_H_
#define PARAMSERVER_PS_PARAMETER_SERVER_DAEMON_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/config/cluster_spec.h"
#include "common/config/node_options.h"
#include "common/ops/metrics.h"
#include "common/rpc/cluster_membership.h"
#include "common/rpc/rpc_endpoints.h"
#include "common/security/peer_credentials.h"
#include "ps/checkpoint_writer.h"
#include "ps/gradient_refusals.h"
#include "ps/parameter_server_service.h"
#include "ps/server_metrics.h"
#include "ps/shard_host.h"
#include "ps/shard_replicator.h"

namespace paramserver {

// A server takes the options every node takes, and one for tests.
struct ParameterServerDaemonOptions : NodeOptions {
  // Tests only (--testing_replica_apply_hold_ms): how long this server, as a backup,
  // holds entries it received before it applies them, so that a test can kill servers
  // while entries are acknowledged and not yet applied. Zero in production.
  absl::Duration replica_apply_hold = absl::ZeroDuration();
};

// Thread-safe.
class ParameterServerDaemon {
 public:
  // Loads the initial weights, starts serving, registers with the scheduler, waits
  // (until the startup timeout) for the cluster to form, and installs its shards.
  // Errors name what failed: a bad init_from file, an unbindable address, a scheduler
  // that refuses or never answers.
  static absl::StatusOr<std::unique_ptr<ParameterServerDaemon>> Create(
      ParameterServerDaemonOptions options);
  ~ParameterServerDaemon();

  // Blocks until the scheduler reports the job finished or Shutdown() is called, then
  // stops serving: OK. UNAVAILABLE when the scheduler did not answer for twice
  // RecoveryTimeout(cluster): an outage up to that long is ridden out, the shards serving
  // the workers, who themselves give up at once the timeout (rank 0 can still evaluate).
  absl::Status Run() ABSL_LOCKS_EXCLUDED(mu_);
  // Makes Run() return. Idempotent; safe from any thread.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& node_name() const { return node_name_; }
  int port() const { return rpc_.port; }

  // Serves `map` from now on (what InstallShardMap calls once the caller is the
  // scheduler): ShardHost::ApplyShardMap, whose contract this is. REQUIRES: Create
  // returned this daemon.
  absl::StatusOr<int64_t> ApplyShardMap(const ShardMap& map) { return host_->ApplyShardMap(map); }

 private:
  ParameterServerDaemon(ParameterServerDaemonOptions options, HostedModel model);
  absl::Status Start();
  HeartbeatRequest MakeHeartbeat() const;
  void Rejoin(const absl::Status& refusal);
  // What /metrics shows now: each shard's counters read once.
  ServerFigures Figures() const;
  void OnHeartbeatResponse(const HeartbeatResponse& response);
  // Fetches and serves the scheduler's map of `epoch` or later on a thread of its own:
  // a map whose shards restore from checkpoints (S3) takes seconds, and the heartbeats
  // must go on meanwhile or the scheduler declares this server dead. One catch-up at a
  // time; the next heartbeat that still sees a newer epoch asks again. Called on the
  // heartbeat thread only.
  void MaybeCatchUpWithMap(int64_t epoch) ABSL_LOCKS_EXCLUDED(mu_);
  void CatchUpWithMap() ABSL_LOCKS_EXCLUDED(mu_);

  const ParameterServerDaemonOptions options_;
  // What the shards start from, until Start hands it to host_.
  HostedModel model_;
  // What this server presents (the cluster token; its credential once registered), and
  // whom it knows: the scheduler and the members of the map it serves.
  std::shared_ptr<CallCredentials> credentials_;
  KnownNodeTable known_nodes_;
  std::unique_ptr<CallerVerifier> callers_;
  std::string node_name_ = "ps-?";                 // membership_'s, once registered
  std::unique_ptr<CheckpointWriter> checkpoints_;  // null without checkpoint.dir
  // Outlives service_, whose primary shards' replicators use it.
  std::unique_ptr<ReplicationLinks> replication_links_;
  // When the heartbeat being answered was sent (MakeHeartbeat): the lease's start.
  mutable std::atomic<int64_t> heartbeat_sent_at_unix_ns_{0};
  MetricsRegistry metrics_;
  // The gradients this server's shards refused for their values, over every shard it
  // has held (ps_refused_gradients_total, and its heartbeats' refused_gradients).
  const std::shared_ptr<GradientRefusalCounts> refusals_ =
      std::make_shared<GradientRefusalCounts>();
  std::unique_ptr<ParameterServerServiceImpl> service_;
  RunningServer rpc_;
  std::unique_ptr<MetricsHttpServer> metrics_http_;  // reads service_: declared after it
  // The shards: built, restored, copied and retired as maps arrive. Uses service_,
  // checkpoints_ and replication_links_: declared after them.
  std::unique_ptr<ShardHost> host_;
  // Registration, heartbeats and the spot watch; its scheduler() is the scheduler's client.
  std::unique_ptr<ClusterMembership> membership_;
  absl::Mutex mu_;
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  // Set when the scheduler has not answered for 2 x RecoveryTimeout(cluster): Run() returns it.
  absl::Status scheduler_lost_ ABSL_GUARDED_BY(mu_);
  bool catching_up_ ABSL_GUARDED_BY(mu_) = false;
  // MaybeCatchUpWithMap's; joined by the destructor once the heartbeats have stopped.
  std::thread catch_up_thread_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_PS_PARAMETER_SERVER_DAEMON_H_
