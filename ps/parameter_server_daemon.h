// A parameter-server process, wired up: RPC server, registration with the scheduler,
// its shards, heartbeats. main.cc only parses flags and calls this.
#ifndef PARAMSERVER_PS_PARAMETER_SERVER_DAEMON_H_
#define PARAMSERVER_PS_PARAMETER_SERVER_DAEMON_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/config/cluster_spec.h"
#include "common/config/node_options.h"
#include "common/model/embedding_init.h"
#include "common/ops/metrics.h"
#include "common/rpc/cluster_membership.h"
#include "common/rpc/rpc_endpoints.h"
#include "common/security/peer_credentials.h"
#include "ps/checkpoint_writer.h"
#include "ps/gradient_refusals.h"
#include "ps/parameter_server_service.h"
#include "ps/server_metrics.h"
#include "ps/shard_map_install_plan.h"

namespace paramserver {

// A server takes only the options every node takes.
struct ParameterServerDaemonOptions : NodeOptions {};

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

  // Serves `map` from now on: keeps the shards it still holds, restores the ones the
  // map says to (from checkpoints), writes a handoff checkpoint of each shard it gives
  // up, and updates the live worker set. Returns the epoch served. PERMISSION_DENIED
  // for a map its scheduler did not sign; the map served again is a no-op; ABORTED for
  // another map of the served epoch (a conflict: counted, logged with both digests and
  // reported in heartbeats); FAILED_PRECONDITION for an older map (AdmitShardMap);
  // other errors name the shard that could not be restored.
  absl::StatusOr<int64_t> ApplyShardMap(const ShardMap& map) ABSL_LOCKS_EXCLUDED(install_mu_);

 private:
  ParameterServerDaemon(ParameterServerDaemonOptions options, std::vector<float> initial_parameters,
                        std::vector<TableRows> initial_rows);
  absl::Status Start();
  ParameterShardOptions ShardOptions(const ShardAssignment& assignment) const;
  // Makes this server a backup of `assignment`'s shard with a copy of its primary's
  // live state at `epoch`, retrying while the primary is not there yet (30 s at most).
  // Once a newer map is offered the copy is abandoned (OK): that map's install decides.
  absl::Status CopyFromPrimary(const ShardAssignment& assignment, int64_t epoch);
  // An embedding shard's tables from the checkpoints (`source` kRestoreAtStep, Newest or
  // Handoff) or, for kInitialValues, init_from's rows of its bucket; checked to fit.
  absl::StatusOr<ShardState> LoadEmbeddingShard(const ShardAssignment& assignment,
                                                ShardSource source) const;
  // The shard `planned` serves at `epoch`, from where the plan says (`held`: the shard
  // this server held under that id, or null). Restoring waits for a handoff checkpoint
  // (10 s at most); errors name the shard.
  absl::StatusOr<std::shared_ptr<ParameterShard>> BuildShard(
      const ShardInstallPlan::Primary& planned, int64_t epoch,
      const std::shared_ptr<ParameterShard>& held);
  // ApplyShardMap's steps, under install_mu_. The plan for `map` given what is `held`
  // (serving `serving`).
  absl::StatusOr<ShardInstallPlan> PlanInstall(const ShardMap& map, int64_t serving,
                                               const std::map<int, ServedShard>& held) const;
  // A primary as `planned`, with its replicator and log sink set (`held`: what this
  // server held under that id, or null).
  absl::StatusOr<ServedShard> ServePrimary(const ShardInstallPlan::Primary& planned, int64_t epoch,
                                           const ServedShard* held);
  // Carries out the plan's fate of every held shard (keep, hand off, close) and closes
  // the retired replicators; returns the shards handed off. `next`: what will be served.
  absl::StatusOr<std::vector<int>> RetireHeld(const ShardInstallPlan& plan,
                                              const std::map<int, ServedShard>& held,
                                              const std::map<int, ServedShard>& next);
  // Tells every primary in `next` the map's live workers (a sync step may complete).
  void SetActiveWorkers(const ShardMap& map, const std::map<int, ServedShard>& next);
  // Waits (at most `timeout`; no lock held) until this server presents the credential
  // `map` names for it. UNAVAILABLE at the deadline; OK at once if the map names none.
  absl::Status AwaitOwnCredential(const ShardMap& map, absl::Duration timeout) const;
  // model.type torch, the first map: takes the declared model's tables and, with
  // model.init_from, its initial values (checked against the declared tensors).
  absl::Status AdoptDeclaredModel(const ShardMap& map) ABSL_EXCLUSIVE_LOCKS_REQUIRED(install_mu_);
  HeartbeatRequest MakeHeartbeat() const;
  void Rejoin(const absl::Status& refusal);
  // What /metrics shows now: each shard's counters read once.
  ServerFigures Figures() const;
  void OnHeartbeatResponse(const HeartbeatResponse& response);

  const ParameterServerDaemonOptions options_;
  // The model's initial values (mlp, ctr: from the spec; torch: init_from's once the
  // model is declared, else empty: the declaring worker sets them on each shard).
  std::vector<float> initial_parameters_;
  // ctr: the rows init_from gives each table (the rest take their default value).
  const std::vector<TableRows> initial_rows_;
  // Every embedding shard's tables, shared by the shards' options (empty for an mlp;
  // a torch model's come with the first map that declares them).
  std::vector<EmbeddingTableOptions> embedding_tables_;
  bool model_adopted_ = false;    // torch: the declared model's tables and init_from read
  int64_t dense_parameters_ = 0;  // the model's (a torch model's once declared)
  // What this server presents (the cluster token; its credential once registered), and
  // whom it knows: the scheduler and the members of the map it serves.
  std::shared_ptr<CallCredentials> credentials_;
  KnownNodeTable known_nodes_;
  std::unique_ptr<CallerVerifier> callers_;
  std::string node_name_ = "ps-?";                 // membership_'s, once registered
  std::unique_ptr<CheckpointWriter> checkpoints_;  // null without checkpoint.dir
  // Outlives service_, whose primary shards' replicators use it.
  std::unique_ptr<ReplicationLinks> replication_links_;
  MetricsRegistry metrics_;
  // The gradients this server's shards refused for their values, over every shard it
  // has held (ps_refused_gradients_total, and its heartbeats' refused_gradients).
  const std::shared_ptr<GradientRefusalCounts> refusals_ =
      std::make_shared<GradientRefusalCounts>();
  std::unique_ptr<ParameterServerServiceImpl> service_;
  RunningServer rpc_;
  std::unique_ptr<MetricsHttpServer> metrics_http_;  // reads service_: declared after it
  int num_workers_ = 0;
  absl::Mutex install_mu_;                                      // one map installation at a time
  std::string served_map_digest_ ABSL_GUARDED_BY(install_mu_);  // of the map served
  std::atomic<int64_t> newest_map_epoch_{0};  // the newest map offered to ApplyShardMap
  // Registration, heartbeats and the spot watch; its scheduler() is the scheduler's client.
  std::unique_ptr<ClusterMembership> membership_;
  // Set once the heartbeats start (after the first map): a later map installed while
  // serving none is a rejoining server's.
  std::atomic<bool> heartbeating_{false};
  absl::Mutex mu_;
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  // Set when the scheduler has not answered for 2 x RecoveryTimeout(cluster): Run() returns it.
  absl::Status scheduler_lost_ ABSL_GUARDED_BY(mu_);
  // Maps refused as conflicting with the one served (ApplyShardMap), for heartbeats.
  mutable absl::Mutex conflict_mu_;
  int64_t shard_map_conflicts_ ABSL_GUARDED_BY(conflict_mu_) = 0;
  std::string last_shard_map_conflict_ ABSL_GUARDED_BY(conflict_mu_);
};

}  // namespace paramserver

#endif  // PARAMSERVER_PS_PARAMETER_SERVER_DAEMON_H_
