// What a parameter server holds and how it comes to hold it: building a shard (fresh,
// restored from checkpoints, or from init_from), copying one from its primary, and
// carrying out a shard map's install plan (PlanShardMapInstall) on the service. It
// needs no gRPC server: tests construct it over a service object and real checkpoint
// files; only copying a backup's state from its primary calls another server.
#ifndef PARAMSERVER_PS_SHARD_HOST_H_
#define PARAMSERVER_PS_SHARD_HOST_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/config/cluster_spec.h"
#include "common/model/embedding_init.h"
#include "common/security/peer_credentials.h"
#include "ps/checkpoint_writer.h"
#include "ps/gradient_refusals.h"
#include "ps/parameter_server_service.h"
#include "ps/shard_map_install_plan.h"
#include "ps/shard_replicator.h"

namespace paramserver {

// The values a server's shards start from, as the spec gives them: the MLP's (mlp,
// ctr: generated or init_from's; torch: empty until the model is declared), init_from's
// rows of each table (ctr), and the tables. A torch model's come with the first map
// that declares it.
struct HostedModel {
  std::vector<float> initial_parameters;
  std::vector<TableRows> initial_rows;
  std::vector<EmbeddingTableOptions> embedding_tables;
  int64_t dense_parameters = 0;
  // training.optimizer.groups' runs over the dense vector (empty without groups).
  std::vector<OptimizerSegment> optimizer_segments;
};

// The model `spec` trains, as a server starts it: the MLP's initial values (generated
// from model.init_seed, or init_from's) and, for ctr, the tables and init_from's rows.
// Errors name a bad init_from file.
absl::StatusOr<HostedModel> HostedModelFromSpec(const ClusterSpec& spec);

// What the host works with. Not owned: every pointer outlives the host.
struct ShardHostParts {
  ParameterServerServiceImpl* service = nullptr;
  CheckpointWriter* checkpoints = nullptr;  // null: no checkpoint.dir
  // Where primaries with backups get their replicators (null: a map that gives this
  // server a shard with backups is refused, FAILED_PRECONDITION).
  ReplicationLinks* replication_links = nullptr;
  // Whom this server knows: the scheduler (whose key every map must be signed with)
  // and the members of the map served, which an installed map replaces.
  KnownNodeTable* known_nodes = nullptr;
  // What this server presents; a map may name a credential it has yet to receive.
  std::shared_ptr<CallCredentials> credentials;
  std::shared_ptr<GradientRefusalCounts> refusals;
  // How long a new backup's copy from its primary waits for a piece of the state before
  // it cancels the call and tries again (tests shorten it).
  absl::Duration copy_stall = absl::Seconds(10);
};

struct ShardMapConflicts {
  int64_t count = 0;
  std::string last;  // the newest one's description, with both digests
};

// Thread-safe: ApplyShardMap and DropAll one at a time (the install lock); the
// accessors from any thread.
class ShardHost {
 public:
  // `node_name`: this server's, as registered; `num_workers`: the cluster's.
  ShardHost(ClusterSpec spec, std::string node_name, int num_workers, HostedModel model,
            ShardHostParts parts);

  // Serves `map` from now on: keeps the shards it still holds, restores the ones the
  // map says to (from checkpoints), writes a handoff checkpoint of each shard it gives
  // up, copies the state of each new backup from its primary, and updates the live
  // worker set. Returns the epoch served. PERMISSION_DENIED for a map its scheduler did
  // not sign; the map served again is a no-op; ABORTED for another map of the served
  // epoch (a conflict: counted, logged with both digests); FAILED_PRECONDITION for an
  // older map (AdmitShardMap) or one that cannot be served here (PlanShardMapInstall);
  // other errors name the shard that could not be restored or copied. OK may leave a
  // new backup uncopied (CopyFromPrimary abandoned it for a newer map): the service
  // marks it copying, serves it to nobody and reports it in no heartbeat until a later
  // map's install copies it.
  absl::StatusOr<int64_t> ApplyShardMap(const ShardMap& map) ABSL_LOCKS_EXCLUDED(install_mu_);

  // A server replaced while it was cut off: closes and drops every shard, writing
  // nothing (its state is stale), and serves no map until the next one.
  void DropAll() ABSL_LOCKS_EXCLUDED(install_mu_);

  // From now on a map installed while serving none is a rejoining server's: it may
  // take on only shards restored from checkpoints. Set once the server has served its
  // first map and started heartbeating.
  void MarkJoined() { joined_.store(true); }

  ShardMapConflicts conflicts() const ABSL_LOCKS_EXCLUDED(conflict_mu_);

 private:
  ParameterShardOptions ShardOptions(const ShardAssignment& assignment) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(install_mu_);
  // An embedding shard's tables from the checkpoints (`source` kRestoreAtStep, Newest or
  // Handoff) or, for kInitialValues, init_from's rows of its bucket; checked to fit.
  absl::StatusOr<ShardState> LoadEmbeddingShard(const ShardAssignment& assignment,
                                                ShardSource source) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(install_mu_);
  // The shard `planned` serves at `epoch`, from where the plan says (`held`: the shard
  // this server held under that id, or null). Restoring waits for a handoff checkpoint
  // (10 s at most); errors name the shard.
  absl::StatusOr<std::shared_ptr<ParameterShard>> BuildShard(
      const ShardInstallPlan::Primary& planned, int64_t epoch,
      const std::shared_ptr<ParameterShard>& held) ABSL_EXCLUSIVE_LOCKS_REQUIRED(install_mu_);
  // Its fresh values: the model's initial ones (and the step-0 checkpoint).
  absl::StatusOr<std::shared_ptr<ParameterShard>> FreshShard(const ShardAssignment& assignment,
                                                             const ParameterShardOptions& options,
                                                             int64_t epoch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(install_mu_);
  // ApplyShardMap's steps, under install_mu_. The plan for `map` given what is `held`
  // (serving `serving`).
  absl::StatusOr<ShardInstallPlan> PlanInstall(const ShardMap& map, int64_t serving,
                                               const std::map<int, ServedShard>& held) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(install_mu_);
  // A primary as `planned`, with its replicator and log sink set (`held`: what this
  // server held under that id, or null). `served_alike`: the map keeps the served map's
  // live workers with no rewind since it, so a primary kept as it was keeps its
  // routed_since.
  absl::StatusOr<ServedShard> ServePrimary(const ShardInstallPlan::Primary& planned, int64_t epoch,
                                           const ServedShard* held, bool served_alike)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(install_mu_);
  // The plan's handovers: closes each shard, then waits (kHandOverTimeout at most, for
  // all) until its new primary has received its last log entry, and serves it in `next`
  // as a backup of it. One that does not get there is closed and copied instead (moved
  // to the plan's backups_to_copy). Returns the shards handed over.
  std::vector<int> HandOver(int64_t epoch, const std::map<int, ServedShard>& held,
                            ShardInstallPlan* plan, std::map<int, ServedShard>* next)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(install_mu_);
  // Carries out the plan's fate of every held shard (keep, hand off, close) and closes
  // the retired replicators; returns the shards handed off. `next`: what will be served.
  absl::StatusOr<std::vector<int>> RetireHeld(const ShardInstallPlan& plan,
                                              const std::map<int, ServedShard>& held,
                                              const std::map<int, ServedShard>& next)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(install_mu_);
  // The map's live workers, one flag per rank (all of them where it names none).
  std::vector<bool> ActiveWorkersOf(const ShardMap& map) const;
  // Tells every primary in `next` the map's live workers (a sync step may complete).
  void SetActiveWorkers(const ShardMap& map, const std::map<int, ServedShard>& next);
  // Waits (at most `timeout`; no lock held) until this server presents the credential
  // `map` names for it. UNAVAILABLE at the deadline; OK at once if the map names none.
  absl::Status AwaitOwnCredential(const ShardMap& map, absl::Duration timeout) const;
  // model.type torch, the first map: takes the declared model's tables and, with
  // model.init_from, its initial values (checked against the declared tensors).
  absl::Status AdoptDeclaredModel(const ShardMap& map) ABSL_EXCLUSIVE_LOCKS_REQUIRED(install_mu_);
  // Makes this server a backup of `assignment`'s shard (with `options`, ShardOptions')
  // with a copy of its `primary`'s live state at `epoch`, retrying while the primary is
  // not there yet, cuts the copy off or cancels it (shutting down): for 30 s after the
  // attempt that got furthest, within an hour in all. Once a
  // newer map is offered, or the primary refuses the copy (FAILED_PRECONDITION) naming a
  // newer epoch served (kServingEpochMetadata), the copy is abandoned (OK): that map's
  // install decides. Reads no state install_mu_ guards: the copies of
  // one install run side by side, each on a thread of its own.
  absl::Status CopyFromPrimary(const ShardAssignment& assignment,
                               const ParameterShardOptions& options, ParameterServer::Stub& primary,
                               int64_t epoch) const;
  // CopyFromPrimary for each of `assignments` at once; the first error (in their order).
  absl::Status CopyFromPrimaries(const std::vector<const ShardAssignment*>& assignments,
                                 int64_t epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(install_mu_);
  void CountConflict(const absl::Status& conflict) ABSL_LOCKS_EXCLUDED(conflict_mu_);

  const ClusterSpec spec_;
  const std::string node_name_;
  const int num_workers_;
  const ShardHostParts parts_;
  absl::Mutex install_mu_;  // one map installation at a time
  HostedModel model_ ABSL_GUARDED_BY(install_mu_);
  bool model_adopted_ ABSL_GUARDED_BY(install_mu_) = false;     // torch: the declared model read
  std::string served_map_digest_ ABSL_GUARDED_BY(install_mu_);  // of the map served
  std::vector<bool> served_active_workers_ ABSL_GUARDED_BY(install_mu_);  // of the map served
  std::atomic<int64_t> newest_map_epoch_{0};  // the newest map offered to ApplyShardMap
  std::atomic<bool> joined_{false};
  mutable absl::Mutex conflict_mu_;
  ShardMapConflicts conflicts_ ABSL_GUARDED_BY(conflict_mu_);
};

}  // namespace paramserver

#endif  // PARAMSERVER_PS_SHARD_HOST_H_
