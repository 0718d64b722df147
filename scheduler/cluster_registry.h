// The scheduler's record of the job: who registered, who is alive, their heartbeats and
// progress, the shard map and how it changes when nodes die or join, and how the job
// ended. Plain class, no RPC. One lock over three parts, each of one concern: the
// membership and credentials (scheduler/node_roster.h), the job's progress and history
// (scheduler/job_progress.h), and the shards' records and checkpoint retention
// (scheduler/shard_records.h); the registry places shards and publishes maps.
#ifndef PARAMSERVER_SCHEDULER_CLUSTER_REGISTRY_H_
#define PARAMSERVER_SCHEDULER_CLUSTER_REGISTRY_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/config/cluster_spec.h"
#include "common/security/peer_credentials.h"
#include "common/security/secrets.h"
#include "common/security/shard_map_signature.h"
#include "proto/admin.pb.h"
#include "proto/scheduler.pb.h"
#include "scheduler/data_lease_table.h"
#include "scheduler/job_progress.h"
#include "scheduler/node_roster.h"
#include "scheduler/recovery_planner.h"
#include "scheduler/shard_placement.h"
#include "scheduler/shard_records.h"

namespace paramserver {

struct SilentNode {
  std::string name;
  absl::Duration silent_for;
};

// A new shard map and what the servers must do to serve it.
struct MapChange {
  ShardMap map;
  // Servers that give up shards: they must install the map (writing handoff
  // checkpoints) before the servers taking those shards on.
  std::vector<std::string> servers_first;
  std::vector<std::string> servers_then;
  std::vector<std::string> addresses_first;
  std::vector<std::string> addresses_then;
  std::string summary;  // one line for the log
};

struct RegistryOptions {
  ClusterSection cluster;
  TrainingMode mode = TrainingMode::kSync;
  // training.embedding_mode async: the embedding shards train async under a sync dense
  // part (RecoveryContext::async_tables); a resume restores each table's newest.
  bool async_tables = false;
  ModelLayout layout;  // the model: its dense vector is cut into shards
  // training.optimizer: a declared model's tensors must be the ones its groups name.
  DenseOptimizerOptions optimizer;
  // model.type torch: `layout` is empty; the first worker's DeclareModel gives it, and
  // shards are placed once it and every node are in.
  bool model_declared_by_workers = false;
  bool model_init_from = false;  // model.init_from gives a torch model's initial values
  bool ctr = false;              // the test score is an AUC (model.type ctr)
  bool checkpoints = false;      // checkpoint.dir is set
  // The lease table's (LeaseData; async mode only): training.epochs passes, leased
  // data.chunk_batches batches at a time.
  int epochs = 1;
  int chunk_batches = 16;
  // training.batch_size of a built-in model (0: a script's own), for the effective
  // batch a sync step's mean is over.
  int batch_size = 0;
  int64_t resume_step = -1;  // >= 0: the first map restores every shard at this step
  // model.type torch resuming (checkpoint.resume): the model its checkpoints were
  // written for. Every worker's declaration must equal it, and the first map takes no
  // worker's values (the shards restore at resume_step).
  std::optional<ModelDeclaration> resumed_model;
  // model.type torch: called once the first declaration is accepted (without the
  // registry's lock: it writes it beside the checkpoints, for a later resume).
  std::function<void(const ModelDeclaration&)> on_model_declared;
  // The newest step at which every shard has a verified checkpoint (-1: none); the
  // sync rollback target. Read from checkpoint.dir by the daemon: disk I/O, so the
  // registry calls it without its lock held (heartbeats are answered meanwhile).
  std::function<int64_t(const ModelLayout&)> newest_complete_checkpoint;
  // The key this scheduler process signs shard maps with (a fresh one when null). It
  // is never saved: a scheduler that takes over from a saved state has its own.
  std::shared_ptr<const MapSigningKey> map_signing_key;
};

// Thread-safe. `now` arguments make time explicit for tests.
class ClusterRegistry {
 public:
  explicit ClusterRegistry(RegistryOptions options);

  // Gives the node a name ("ps-0", "worker-1") and its rank in registration order, and
  // makes `node_token` (the secret the node made) its credential: only its SHA-256 is
  // kept, and goes into every later shard map. The same role, address and token again
  // returns the same answer (a retried call, also to a scheduler that took over);
  // another token at a live node's address gets UNAVAILABLE until that node is
  // declared dead. Once the cluster is complete, a node registers into the
  // slot of a dead or drained node of its role (a restarted or replacement node):
  // *change then holds the map that takes it in (and rebalances the shards).
  // With no such slot, a server takes a new one while cluster.servers' range allows
  // (the job grows; the map takes it in likewise). INVALID_ARGUMENT for a missing role or
  // address, or a token of fewer than 32 or more than 128 bytes; RESOURCE_EXHAUSTED when
  // no slot is free. Once the expected nodes have registered, shards are placed.
  // `previous_node_token`: the token of the registering process's last registration
  // (empty: none), which tells the slot's own process coming back from a new one.
  absl::StatusOr<RegisterResponse> Register(NodeRole role, const std::string& address,
                                            const std::string& node_token, absl::Time now,
                                            std::optional<MapChange>* change,
                                            const std::string& previous_node_token = "")
      ABSL_LOCKS_EXCLUDED(mu_);

  // A worker of a model.type torch job declares its model (DeclareModelRequest in
  // proto/scheduler.proto): the first declaration is the job's, and the shards are
  // placed once every node has registered. NOT_FOUND for a name that is not a live
  // worker.
  absl::StatusOr<DeclareModelResponse> DeclareModel(const std::string& name,
                                                    const ModelDeclaration& model, absl::Time now)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The node named `name` ("scheduler" included) with its current credential's digest
  // (a dead node's too: it is told to register again); nullopt for an unknown name.
  // For CallerVerifier.
  std::optional<KnownNode> FindCredential(const std::string& name) const ABSL_LOCKS_EXCLUDED(mu_);
  // The scheduler process's own credential, which it presents to servers: made at
  // construction, held in memory only (never in ExportState).
  const std::string& scheduler_token() const { return scheduler_token_; }
  // The public half of the key every map of this process is signed with.
  const std::string& map_key() const { return map_signing_key_->public_key(); }

  ClusterView View() const ABSL_LOCKS_EXCLUDED(mu_);
  // GetClusterView's answer for many callers at once: the view without its map, and
  // *map_bytes the map serialized (ClusterView.shard_map's bytes; null before the first
  // map), made once per map and shared by every caller, so that a map change woken
  // thousands of long polls do not each copy the map under this lock. With a null
  // map_bytes, only the view's counts (the scheduler's own loop).
  ClusterView ViewWithoutMap(std::shared_ptr<const std::string>* map_bytes) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // From now on `listener` is called with the shard map's epoch each time a map is
  // published, under this registry's lock, and once now (0: no map yet): so that a node
  // waiting for a map change (MapWaitList) learns of it as it is published, not at its
  // next poll. It must not block, nor call this registry. Null: none. One listener.
  void SetMapListener(std::function<void(int64_t epoch)> listener) ABSL_LOCKS_EXCLUDED(mu_);

  // A sign of life from live node `name` other than a heartbeat: nodes poll the view
  // while they wait for the cluster to form (they send heartbeats only once it has),
  // and a slow-starting peer must not get them declared dead. Unknown or dead: ignored.
  void NoteAlive(const std::string& name, absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // Node `name` was answered a view that says the job finished (its own GetClusterView).
  // A live worker that has finished acts on it (it exits on the first answer that says
  // so), so it counts as told, as by a heartbeat answer (all_servers_told_to_stop), and
  // the scheduler need not wait for a beat it may never send. Ignored for any other
  // node (a server, or a worker still training, stops only on a heartbeat answer), and
  // before the result.
  void NoteToldJobFinished(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);

  // NOT_FOUND for a node that never registered; FAILED_PRECONDITION for one declared
  // dead (it must register again).
  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request, absl::Time now)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<ReportFinishedResponse> ReportFinished(const ReportFinishedRequest& request,
                                                        absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // Records the final evaluation and marks the job finished. FAILED_PRECONDITION unless
  // it comes from the rank-0 worker after every live worker finished.
  absl::StatusOr<JobResult> ReportResult(const ReportResultRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Live nodes (not finished) whose last heartbeat is older than `timeout`.
  std::vector<SilentNode> SilentNodes(absl::Time now, absl::Duration timeout) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The scheduler itself did not run for `pause` up to `now` (stopped, starved of CPU):
  // it heard nobody meanwhile, so that time counts against no node's heartbeats.
  void ExcludeSchedulerPause(absl::Duration pause, absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

  // Declares `name` dead and returns the map that recovers from it:
  //  - a server: where it was a primary, the shard's first backup that holds it is
  //    promoted, one heard from lately first (it holds every acknowledged update:
  //    nothing is lost or rolled back); shards it backed up,
  //    or whose backup was promoted, get a new backup that copies the primary, so each
  //    keeps cluster.replication copies while servers last. A shard left with no copy
  //    moves to the live server with the fewest primaries and restores: in sync mode
  //    every shard rolls back to the newest step all shards have checkpointed and
  //    workers rewind to it; in async/ssp mode only that shard restores its newest
  //    checkpoint, and the summary says how many updates it lost. The map unchanged:
  //    DATA_LOSS when a lost shard has no other copy and checkpoint.dir is not set (the
  //    job cannot go on); FAILED_PRECONDITION when no server is left, or no complete
  //    checkpoint to roll back to was found (a server that joins may yet restore).
  //  - a worker: it leaves the active set (sync steps complete without it).
  // `found_at`: when the loss was found (the `now` of SilentNodes). Live servers silent
  // then for more than half the failure timeout (and two heartbeat intervals) are likely
  // gone too (two servers killed together are found one after the other): a backup on
  // one is promoted only where no other backup holds the shard, and new roles go to the
  // others first (RemoveServer's `failing`). Without it, every live server counts as
  // heard from.
  absl::StatusOr<MapChange> DeclareDead(const std::string& name,
                                        std::optional<absl::Time> found_at = std::nullopt)
      ABSL_LOCKS_EXCLUDED(mu_);

  // data.sharding: dynamic: live worker `name`'s next lease (LeaseDataRequest's
  // contract). FAILED_PRECONDITION outside async mode, before the cluster formed, or
  // for a worker declared dead (it registers again first); the table's errors.
  absl::StatusOr<LeaseDataResponse> LeaseData(const LeaseDataRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);

  // A step every shard will reach about `lead` from now but has not reached yet (from
  // the shards' reported update counts and rate), and the live servers' addresses.
  // FAILED_PRECONDITION before the cluster has formed or without checkpoints.
  absl::StatusOr<std::pair<int64_t, std::vector<std::string>>> PlanCheckpoint(
      absl::Time now, absl::Duration lead) const ABSL_LOCKS_EXCLUDED(mu_);

  // The durable part of the registry (nodes, map, result; not heartbeat times), and
  // the number of changes to it so far (to know when to save it again).
  SchedulerState ExportState() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t state_version() const ABSL_LOCKS_EXCLUDED(mu_);
  // Takes over a saved state: every live node counts as heard from at `now`, so it has
  // a failure timeout to heartbeat to the new scheduler. DATA_LOSS, changing nothing,
  // for a state this spec cannot hold (a rank beyond its servers or workers, a repeated
  // name or rank, a shard outside the model or held by an unknown node). A torch
  // model declared in it is handed to options.on_model_declared again.
  absl::Status ImportState(const SchedulerState& state, absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

  // Takes live server `name` out of the map as DeclareDead does, but with no loss at
  // all: shards with no backup move through handoff checkpoints the server writes. The
  // server is told to exit at its next heartbeat. FAILED_PRECONDITION for the last
  // live server, or for unreplicated shards without checkpoints.
  absl::StatusOr<MapChange> Drain(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);

  // What the registry knows of one node.
  using Node = RegistryNode;

  // A consistent copy of the registry's record, for views of it (DescribeCluster in
  // scheduler/cluster_status.h). Credentials are left out.
  struct Snapshot {
    ClusterSection cluster;
    TrainingMode mode = TrainingMode::kSync;
    bool async_tables = false;
    int replication = 1;
    std::vector<Node> nodes;
    std::optional<ShardMap> shard_map;
    std::map<int, ShardRecord> shard_records;
    DataLeaseTableState data_leases;
    // Each worker's curve points (step, loss, accuracy), kept from its heartbeats and
    // thinned to at most kMaxHistoryPoints; only when asked for.
    std::map<std::string, std::vector<ProgressPoint>> history;
    std::optional<JobResult> result;
    bool ctr = false;    // the model has embedding tables: its test score is an AUC
    int batch_size = 0;  // RegistryOptions::batch_size
    bool shutdown_requested = false;
    absl::Time last_advance = absl::InfinitePast();  // the last time any worker's step advanced
    absl::Time started = absl::InfinitePast();       // when this registry was made
    absl::Time finished = absl::InfiniteFuture();    // when the result came in (this process)
  };
  Snapshot TakeSnapshot(bool with_history) const ABSL_LOCKS_EXCLUDED(mu_);
  static constexpr int kMaxHistoryPoints = JobProgress::kMaxHistoryPoints;

  // An operator ended the job: from now on every heartbeat is answered with shutdown
  // (servers and workers exit cleanly) and job_finished() is true. Idempotent.
  void RequestShutdown() ABSL_LOCKS_EXCLUDED(mu_);
  // The scheduler ended the job unfinished, for `why` (an error): a shutdown, as above,
  // whose reason is kept in the state (a scheduler taking it over ends the job the same
  // way). False, with no effect, once the job has ended (the first ending stands: a
  // result that came in first, say).
  bool EndJobUnfinished(absl::Status why) ABSL_LOCKS_EXCLUDED(mu_);
  // Why the job ended unfinished (EndJobUnfinished's, or the taken-over state's); OK if
  // it did not.
  absl::Status ended_unfinished() const ABSL_LOCKS_EXCLUDED(mu_);

  // True once the final result is in or a shutdown was requested.
  bool job_finished() const ABSL_LOCKS_EXCLUDED(mu_);

  // A node leaving by itself (a spot interruption notice): a server is drained as by
  // Drain, a worker leaves the active set as if declared dead. NOT_FOUND for a node
  // that is not live; Drain's errors for a server.
  absl::StatusOr<MapChange> Leave(const std::string& name) ABSL_LOCKS_EXCLUDED(mu_);

  // Replicated jobs: once every live server serves the present map, moves primaries
  // from servers with more to their caught-up backups on servers with fewer
  // (PlanPrimaryBalance): a server that joined as a backup takes its fair share. The map
  // to publish, or nullopt (balanced, a map still installing, or the job is over).
  // Nothing moves while a live server is late with its heartbeat (2 intervals at
  // `now`): a primary is not moved onto a server that may be failing.
  std::optional<MapChange> BalancePrimaries(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // True once every live server (after a shutdown: every live node; after the result:
  // every finished worker but the one that reported it) has heartbeated since the job
  // finished, and so was told (or, after the result, was answered a view that says so:
  // NoteToldJobFinished).
  bool all_servers_told_to_stop() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The most of a server's checkpoint error text that is kept and shown.
  static constexpr size_t kMaxTroubleText = 512;

  // ImportState's work under the lock.
  absl::Status ImportStateLocked(const SchedulerState& state, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The checks of a saved state beyond the roster's: the declared model, the map.
  absl::Status CheckSavedState(const SchedulerState& state) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every live node's credential digest into `map`, then this process's signature.
  void SealMap(ShardMap* map) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The view's fields but its map.
  ClusterView ViewFieldsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The one way shard_map_ changes: it drops the serialized copy of the old one.
  void SetShardMapLocked(ShardMap map) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  RegisterResponse RegistrationOf(const Node& node) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What a heartbeat of drained node `node` is answered: it is told to exit once it
  // serves the map that drained it.
  HeartbeatResponse DrainedReply(const Node& node, int64_t serving_epoch) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps what live node `node`'s heartbeat says (its progress, a server's troubles and
  // shards).
  void RecordHeartbeat(Node& node, const HeartbeatRequest& request, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fences worker `node`'s leases at the present map (which no longer counts it), and
  // settles what the servers' reports allow.
  void FenceLeases(const Node& node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "3 worker(s) train now (cluster.workers 2..8): each step's mean is over 3 x 32 = 96
  // examples (the effective batch)" (the second part in sync mode), for the log.
  std::string WorkersLine() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Settles the fenced leases every live server has reported on since their fence.
  void SettleLeases() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Places the shards (the first map) once every expected node registered and the
  // model is known.
  void MaybePlaceShards(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The next map: epoch + 1, every restore cleared, the active worker set refreshed.
  ShardMap NextMap() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fills in the servers' addresses and credentials, makes `planned` the map, and says
  // which servers install it first.
  MapChange Publish(PlannedMapChange planned) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The context's `copying` points at copying_, refreshed here: valid until the next call.
  RecoveryContext RecoveryContextLocked(int64_t rollback_step) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `rollback`: the sync rollback target, read from disk by the caller before it took
  // the lock (-1: none). `found_at` as for DeclareDead.
  absl::StatusOr<MapChange> RecoverFromServerLoss(const Node& dead, int64_t rollback,
                                                  std::optional<absl::Time> found_at)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes a (re)joined server in: with replication it copies shards as a backup; without,
  // shards move to it through handoff checkpoints until it holds its fair share.
  // `rollback` as for RecoverFromServerLoss: the step every shard restores in sync mode
  // when shards were left with no live server.
  MapChange Rebalance(const Node& joined, int64_t rollback) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The sync rollback target, read from disk (takes the lock only to look, never across
  // the read); with `only_when_a_primary_is_dead`, only when some shard's primary is not
  // alive (a server registering then takes shards left on a dead slot). -1 when not
  // read, when there is none, without checkpoints, or in another mode than sync. Read
  // outside the lock, where every heartbeat would wait behind the disk: a checkpoint
  // completed meanwhile only makes the target one checkpoint older than the newest;
  // servers keep checkpoint.keep files per shard, so it is still on disk (were it not,
  // the restore names the missing file).
  int64_t MaybeReadRollbackTarget(bool only_when_a_primary_is_dead) ABSL_LOCKS_EXCLUDED(mu_);

  const RegistryOptions options_;
  const int replication_;  // copies of each shard wanted (primary included)
  mutable absl::Mutex mu_;
  NodeRoster roster_ ABSL_GUARDED_BY(mu_);
  JobProgress progress_ ABSL_GUARDED_BY(mu_);
  ShardRecords shard_records_ ABSL_GUARDED_BY(mu_);
  // The model the shards cut: options_.layout, or a torch job's declared one (empty
  // until declared; model_declared_by_ is empty until then).
  ModelLayout layout_ ABSL_GUARDED_BY(mu_);
  ModelDeclaration declared_model_ ABSL_GUARDED_BY(mu_);
  std::string model_declared_by_ ABSL_GUARDED_BY(mu_);
  std::optional<ShardMap> shard_map_ ABSL_GUARDED_BY(mu_);
  std::function<void(int64_t epoch)> map_listener_ ABSL_GUARDED_BY(mu_);  // SetMapListener's
  // shard_map_ serialized, made by the first ViewWithoutMap after each change (null:
  // not yet). SetShardMapLocked resets it.
  mutable std::shared_ptr<const std::string> serialized_map_ ABSL_GUARDED_BY(mu_);
  DataLeaseTable data_leases_ ABSL_GUARDED_BY(mu_);
  // Records, for each backup role of `next`, the epoch that gave it (kept for a role the
  // present map has already, with the same primary and no restore). REQUIRES: called
  // before `next` becomes shard_map_.
  void NoteBackupRoles(const ShardMap& next) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // (server, shard) backup role -> the epoch that gave it to the server.
  std::map<std::pair<std::string, int>, int64_t> backup_since_ ABSL_GUARDED_BY(mu_);
  // The backups still copying their shard, as the last RecoveryContextLocked found them.
  mutable std::set<std::pair<std::string, int>> copying_ ABSL_GUARDED_BY(mu_);
  const absl::Time started_ = absl::Now();
  int64_t state_version_ ABSL_GUARDED_BY(mu_) = 0;
  const std::string scheduler_token_ = NewSecretToken();
  const std::shared_ptr<const MapSigningKey> map_signing_key_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_SCHEDULER_CLUSTER_REGISTRY_H_
