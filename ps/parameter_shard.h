// One shard on a server: a range of the dense parameter vector (its values and Adam
// state) or an embedding shard (one hash bucket of every embedding table: its rows and
// their optimizer state), and the consistency rule (sync, async or ssp) that decides
// when pushes apply and pulls wait, which both kinds share.
//
// The shard holds one lock over three parts, each of one concern: the consistency gate
// (ps/consistency_gate.h), the storage with its update rule (ps/shard_storage.h:
// ps/dense_storage.h or ps/embedding_storage.h) and the mutation log (ps/shard_log.h).
// It refuses what they must not see (a closed shard, a gradient of bad values) and
// counts what it did.
#ifndef PARAMSERVER_PS_PARAMETER_SHARD_H_
#define PARAMSERVER_PS_PARAMETER_SHARD_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/checkpoint/shard_checkpoint.h"
#include "common/config/cluster_spec.h"
#include "common/model/step_optimizer.h"
#include "common/wire/shard_layout.h"
#include "common/wire/sparse_rows.h"
#include "common/wire/tensor_codec.h"
#include "ps/consistency_gate.h"
#include "ps/dense_storage.h"
#include "ps/embedding_storage.h"
#include "ps/gradient_refusals.h"
#include "ps/shard_log.h"
#include "ps/uninitialized_floats.h"

namespace paramserver {

struct ParameterShardOptions {
  int shard_id = 0;
  ParameterRange range;  // empty for an embedding shard
  // Set for an embedding shard: hash bucket shape.bucket (of shape.bucket_count) of
  // every table.
  std::shared_ptr<const EmbeddingShardOptions> embedding;
  TrainingMode mode = TrainingMode::kSync;
  int num_workers = 1;
  int staleness = 0;                // ssp only
  int backup_workers = 0;           // sync only: training.sync.backup_workers
  DenseOptimizerOptions optimizer;  // a dense shard's update rule
  // Its parameter groups' runs within the range (offsets from its start); empty: all
  // of it trains with `optimizer`.
  std::vector<OptimizerSegment> optimizer_segments;
  // When > 0, Push hands back a snapshot each time the update count reaches a
  // multiple of this (the same steps on every shard, so sync snapshots are consistent).
  int64_t checkpoint_every_steps = 0;
  // A hybrid job's async table (training.embedding_mode async): its update count is not
  // the job's step that checkpoints are scheduled at (ScheduleCheckpointAt), so a
  // scheduled checkpoint is written at its next update instead.
  bool checkpoint_at_next_update = false;
  // Without a log sink, hand each call's log entries back in its outcome (tests). Off,
  // entries are only numbered: nobody would read them, and an async push's entry is a
  // copy of its whole gradient.
  bool hand_back_log = false;
  // training.max_gradient_norm: when > 0, a push whose gradient (this shard's part of
  // the worker's gradient: its range's elements, or its rows of the ids pushed) has an
  // L2 norm above this is refused. 0: no bound.
  double max_gradient_norm = 0;
  // checkpoint.embedding_deltas: an embedding shard's delta checkpoints between full ones.
  int embedding_deltas = 0;
  // Whether this shard's checkpoint at a step is written or on its way (the server's
  // CheckpointWriter::Holds); a delta is written only against a base it holds. Null: none
  // is (every checkpoint full).
  std::function<bool(int64_t step)> checkpoint_held;
  // A backup's received entries (their gradients' and ids' bytes) beyond which
  // ReceiveLogEntries waits: the backpressure that bounds a backup's memory when it
  // applies slower than its primary sends. A call that finds room takes its whole
  // batch, so the entries held (waiting or being applied) may pass this by one batch
  // (a primary sends at most 32 MiB of gradients in one).
  size_t max_received_bytes = size_t{64} << 20;
  // Where this shard counts the gradients it refuses for their values, with the other
  // shards of its server (may be null: not counted but in counters()).
  std::shared_ptr<GradientRefusalCounts> refusals;
};

struct PulledValues {
  std::vector<float> values;
  int64_t applied_updates = 0;
  // Where a worker joining now starts: sync, the shard's step; async/ssp, the slowest
  // active worker's step (counting the asking rank's earlier pushes).
  int64_t start_step = 0;
};

// One worker's push to one shard, with its buffers: Push may keep them (a sync push's
// gradient waits there for the step's others) and leave buffers of its own in their
// place, for the caller to reuse.
struct ShardPush {
  int worker_rank = 0;
  int64_t step = 0;
  UninitializedFloats gradient;
  CheckedRowIds rows;  // an embedding shard's: whose rows `gradient` holds
  // A dense shard's: the hyperparameters the script's optimizer sets for this step
  // (checked by StepHyperparametersFromProto; empty: the spec's).
  StepHyperparameters settings;
  // The worker skips the step (its gradient was not finite under a loss scaler):
  // `gradient` and `rows` are empty. In sync mode the step is skipped, whatever the
  // others pushed: no update, the optimizer's update count unchanged. In async and ssp
  // modes the push applies nothing and counts as the worker's push of `step`.
  bool skip = false;
  // Sync, a dense shard (PushRequest.clip_grad_norm): the step's mean gradient is clipped
  // to this global norm, so the shard holds the step once every push is in, until
  // ApplyClippedStep. Every push of the step carries the same. 0: none.
  double clip_grad_norm = 0;
};

// A sync step once ended, as a clipped step's repeated push and pull must see it: what a
// repeat of its push is told, and what a repeated ApplyClippedStep must agree with.
struct ClippedStep {
  int64_t step = 0;
  double sum_squares = 0;  // of the step's unscaled mean gradient on the shard
  float coefficient = 1;   // what the mean was scaled by; 0: skipped (nothing applied)
};

// How many ended sync steps a shard remembers (ClippedStep each). A worker repeats only
// the last step it completed, and no shard is more than one step past that (the next
// step needs that worker's push), so two suffice; four leave room.
inline constexpr int kRememberedSyncSteps = 4;

struct PushOutcome {
  bool duplicate = false;  // this (worker, step) had already been accepted
  // Sync with backup workers: the step had completed without this push, which was
  // dropped (applied_updates says where the shard is).
  bool late = false;
  int64_t applied_updates = 0;
  // Set when this push completed a checkpoint step: the state to write (epoch unset);
  // an embedding shard's rows in storage order (CheckpointWriter sorts them by id).
  std::optional<ShardState> checkpoint;
  // The log entries this call added, in order (async/ssp, the push; sync, the step it
  // completed, if it did), when no log sink is attached and options.hand_back_log; with
  // a sink, they went there.
  std::vector<ShardMutation> log;
  // The shard's log index after this call (a repeat's original is at or before it).
  int64_t log_index = 0;
};

// What SetActiveWorkers changed.
struct ActiveWorkersOutcome {
  std::optional<ShardState> checkpoint;  // a checkpoint step it completed
  // The change, then the sync step it completed (when no log sink is attached).
  std::vector<ShardMutation> log;
};

// A shard's whole state, enough for a new replica to continue its log exactly.
struct ReplicaState {
  ShardState shard;  // values, moments, update count
  int64_t log_index = 0;
  std::vector<bool> active;
  std::vector<int64_t> pushed_steps;                  // async/ssp
  std::vector<bool> pending_received;                 // sync
  std::vector<std::vector<float>> pending_gradients;  // sync, one per rank (empty: none)
  // An embedding shard: shard.tables holds its rows least recently updated first;
  // pending_rows[r] says whose rows pending_gradients[r] holds; sightings, per table,
  // the ids short of min_count.
  std::vector<RowIds> pending_rows;
  StepHyperparameters pending_settings;  // sync: what the pending pushes carry, alike
  std::vector<bool> pending_skipped;     // sync, one per rank: that push skips the step
  double pending_clip_grad_norm = 0;     // sync: what the pending pushes carry
  // sync: the last kRememberedSyncSteps steps clipped or skipped, oldest first.
  std::vector<ClippedStep> recent_steps;
  // sync, a dense shard holding its step for the clip coefficient: the step's mean
  // gradient and its sum of squares, as the workers were told it.
  bool held = false;
  std::vector<float> held_mean;
  double held_sum_squares = 0;
  TableSightings sightings;
  // The shard has no values yet (AwaitingInitialValues): shard.values are zeros.
  bool awaiting_initial_values = false;
};

struct ShardCounters {
  int64_t applied_updates = 0;
  int64_t accepted_pushes = 0;
  int64_t duplicate_pushes = 0;
  int64_t late_pushes = 0;  // sync with backup workers: pushes of a step completed without them
  int64_t rejected_pushes = 0;
  int64_t rejected_nonfinite = 0;  // of rejected_pushes: a NaN or Inf
  int64_t rejected_overflow = 0;   // of rejected_pushes: out of the optimizer's range
  int64_t rejected_norm = 0;       // of rejected_pushes: above max_gradient_norm
  // Sync: steps skipped (a worker's push skipped them; counted in applied_updates too).
  // Async/ssp: pushes that skipped their step (not in applied_updates).
  int64_t skipped_steps = 0;
};

// Thread-safe. Pull may block until its deadline; Push never blocks on other workers.
//  - sync: step t is applied once all workers pushed their step-t gradient, as one Adam
//    update with their mean (summed in worker-rank order, so results are bit-identical
//    whatever order pushes arrive in). A pull for step t waits until t updates applied.
//  - async: every push is one Adam update, applied as it arrives; pulls never wait.
//  - ssp: as async, but a pull for step s waits until every worker pushed at least
//    s - staleness steps.
class ParameterShard {
 public:
  static constexpr int64_t kMaxAsyncStepLead = ConsistencyGate::kMaxAsyncStepLead;

  // REQUIRES: initial_values.size() == options.range.size(), options.num_workers >= 1.
  // An embedding shard (options.embedding set) starts with no rows (and no values).
  ParameterShard(ParameterShardOptions options, std::vector<float> initial_values);
  // A dense shard of a model.type torch job, which has no values until the worker that
  // declared the model gives them (SetInitialValues): until then pulls wait and pushes
  // are refused (FAILED_PRECONDITION).
  static std::unique_ptr<ParameterShard> AwaitingInitialValues(ParameterShardOptions options);
  // Resumes from a checkpoint. REQUIRES: state.range == options.range; for an embedding
  // shard, state.tables fits options.embedding (its rows restored in the order given).
  ParameterShard(ParameterShardOptions options, ShardState state);
  // A replica of another server's shard, continuing its log from replica.log_index.
  // INVALID_ARGUMENT when the state does not fit the options (sizes, worker count).
  static absl::StatusOr<std::unique_ptr<ParameterShard>> FromReplica(ParameterShardOptions options,
                                                                     ReplicaState replica);

  // The shard's values once the consistency rule lets `worker_rank` compute `step`.
  // DEADLINE_EXCEEDED naming the workers still missing if that has not happened by
  // `deadline`; UNAVAILABLE after Close(); INVALID_ARGUMENT for an unknown worker.
  absl::StatusOr<PulledValues> Pull(int worker_rank, int64_t step, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Pull, but the values are appended to *values_bytes in their wire form (`encoding`),
  // encoded once under the lock; `info` (may be null) gets the rest, with empty values.
  // *values_bytes is unchanged on error.
  absl::Status PullInto(int worker_rank, int64_t step, absl::Time deadline, WireDtype encoding,
                        std::string* values_bytes, PulledValues* info) ABSL_LOCKS_EXCLUDED(mu_);

  // Pull, the values shared instead of copied: *values holds the shard's present
  // version, which no later update changes (an update finding it still shared writes a
  // new one). `info` (may be null) gets the rest, with empty values.
  absl::Status PullShared(int worker_rank, int64_t step, absl::Time deadline,
                          std::shared_ptr<const std::vector<float>>* values, PulledValues* info)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Accepts push->worker_rank's gradient for push->step: the one entry for pushes (the
  // two below wrap it). A repeat of an accepted (worker, step) returns duplicate=true and
  // changes nothing. INVALID_ARGUMENT (nothing applied or recorded: the rank may push
  // the step again) for an unknown worker, a gradient that does not fit (a dense
  // range's size; an embedding shard's rows, which must be CheckedFor its shape, and
  // their floats), a NaN/Inf value, a value the optimizer's state could not hold
  // (FirstUnsafeElement of ps/adam_optimizer.h, ps/sparse_optimizer.h), an L2 norm above
  // options.max_gradient_norm, or an async/ssp step kMaxAsyncStepLead or more past the
  // worker's next one; FAILED_PRECONDITION for a sync push ahead of the shard's step;
  // INTERNAL when the update failed part way (it cannot for a gradient that fits). A
  // push's settings (a script's hyperparameters) must keep the rule's state
  // (DenseUpdateRule::PrepareFor), and in sync mode equal those of the step's other
  // pushes: a push that differs is refused (INVALID_ARGUMENT naming the group, the
  // field, both values and both workers), and until the step completes its pulls get the
  // same error, so that no worker waits for a step that cannot complete. The value
  // refusals name the shard, the element and the value (or the norm). In sync mode the
  // step's update is the mean over the active workers (an embedding shard's: each id's
  // row gradients summed in rank order and divided by their number, a worker without
  // the id adding zero, as one process's mean loss over all of their batches gives).
  // A new sync push's buffers are kept (swapped for the shard's spare ones); otherwise
  // *push is left as it was.
  absl::StatusOr<PushOutcome> Push(ShardPush* push) ABSL_LOCKS_EXCLUDED(mu_);
  // Push, with a copy of `gradient` (a dense shard's).
  absl::StatusOr<PushOutcome> Push(int worker_rank, int64_t step, absl::Span<const float> gradient)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Push, with copies of an embedding shard's `rows` (checked here: CheckRowIds's error,
  // as "embedding shard N: ...") and of `gradient`.
  absl::StatusOr<PushOutcome> PushRows(int worker_rank, int64_t step, RowIdsView rows,
                                       absl::Span<const float> gradient) ABSL_LOCKS_EXCLUDED(mu_);

  // An embedding shard's PullInto: the rows of `rows` (CheckedFor its shape), table
  // after table, as the tables read them (a row not made yet reads as its initial value,
  // an id short of min_count as zeros).
  absl::Status PullRowsInto(int worker_rank, int64_t step, absl::Time deadline,
                            const CheckedRowIds& rows, WireDtype encoding,
                            std::string* values_bytes, PulledValues* info) ABSL_LOCKS_EXCLUDED(mu_);
  // The same, checking `rows` here first (CheckRowIds's error, as for PushRows).
  absl::Status PullRowsInto(int worker_rank, int64_t step, absl::Time deadline, RowIdsView rows,
                            WireDtype encoding, std::string* values_bytes, PulledValues* info)
      ABSL_LOCKS_EXCLUDED(mu_);

  // An export of an embedding shard's table `table` (the finisher writing
  // output.weights), in two parts. ExportRowIds waits as a pull for `step` does, then
  // gives the ids of the table's rows after `after_id` (all with from_start),
  // ascending: the shard's lock is held while they are copied as stored, not while they
  // are sorted. ExportRowsOf then reads the rows of a page of those ids, in the order
  // given, under the lock for that page alone: an id whose row is gone since (evicted)
  // is skipped, so *held_ids says which rows *rows holds (the table's dim floats each).
  // Both: INVALID_ARGUMENT for a dense shard or a table the model lacks; ExportRowIds
  // the pull's errors otherwise.
  absl::StatusOr<std::vector<int64_t>> ExportRowIds(int worker_rank, int64_t step,
                                                    absl::Time deadline, int table, bool from_start,
                                                    int64_t after_id) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status ExportRowsOf(int table, absl::Span<const int64_t> ids,
                            std::vector<int64_t>* held_ids, std::vector<float>* rows) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Gives a shard made by AwaitingInitialValues its values, once: one log entry, so
  // backups get them in order. A shard that has values already is left as it is
  // (duplicate=true: a retry, or a later call). INVALID_ARGUMENT for values of another
  // size than the range's or a NaN/Inf. outcome.checkpoint holds the step-0 state to
  // write when the values were set.
  absl::StatusOr<PushOutcome> SetInitialValues(absl::Span<const float> values)
      ABSL_LOCKS_EXCLUDED(mu_);
  bool awaiting_initial_values() const ABSL_LOCKS_EXCLUDED(mu_);

  bool is_embedding() const { return options_.embedding != nullptr; }
  EmbeddingCounters embedding_counters() const ABSL_LOCKS_EXCLUDED(mu_);

  // The pulls now inside Pull's wait (those that could not proceed at once, and those about
  // to find they can).
  int64_t waiting_pulls() const ABSL_LOCKS_EXCLUDED(mu_);

  // Wakes every waiting Pull, which then returns UNAVAILABLE; later pulls and pushes do
  // too (`reason` says why, e.g. "moved to epoch 4"). Log entries still apply: a primary
  // handed to its backup is closed, then follows the new primary's log.
  void Close(const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);
  // Serves pulls and pushes again: a closed primary that followed its successor's log as
  // a backup, promoted back (not one whose replica failed to apply: ApplyReceived).
  void Reopen() ABSL_LOCKS_EXCLUDED(mu_, received_mu_);

  // The workers whose pushes count: a sync step completes once every active worker
  // pushed (with the mean of their gradients), and ssp bounds only active workers. A
  // step that the change completes is applied at once; the snapshot is returned if
  // that step is a checkpoint step. Pushes of inactive workers are refused.
  // REQUIRES: active.size() == num_workers. The change is one log entry.
  ActiveWorkersOutcome SetActiveWorkers(const std::vector<bool>& active) ABSL_LOCKS_EXCLUDED(mu_);

  // Sends every later log entry to `sink` (null: none). `at_index` (may be empty) runs
  // with the shard's log index while the lock is held, so that the sink can be told
  // where it starts before any later entry reaches it. First applies every entry
  // received as a backup (ReceiveLogEntries); with a sink, takes no more.
  void SetLogSink(std::shared_ptr<ShardLogSink> sink, const std::function<void(int64_t)>& at_index)
      ABSL_LOCKS_EXCLUDED(mu_, received_mu_);
  // A primary with no backup: as SetLogSink(nullptr, {}), but it takes no replicated
  // entries from now on (its old primary is refused, as by a promoted shard with a sink).
  void ServeAlone() ABSL_LOCKS_EXCLUDED(mu_, received_mu_);

  // Sync: blocks until step `step` has been applied (every active worker pushed it), or
  // `deadline`; returns log_index() then. DEADLINE_EXCEEDED naming the workers still
  // missing; UNAVAILABLE after Close().
  absl::StatusOr<int64_t> AwaitStepApplied(int64_t step, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Sync, a step whose pushes carry clip_grad_norm: blocks until every active worker's
  // push of `step` is in (the shard then holds the step) or it was applied, or
  // `deadline`; returns the sum of the squares of the step's mean gradient over this
  // shard (double, in element order), the same for a repeat once the step was applied;
  // 0 for a step skipped. DEADLINE_EXCEEDED naming the workers missing; UNAVAILABLE
  // after Close(); a settings or clip conflict's error; FAILED_PRECONDITION for a step
  // applied before the oldest one remembered (kRememberedSyncSteps; none after a
  // restore from a checkpoint), whose sum is not known here.
  absl::StatusOr<double> AwaitStepSumSquares(int64_t step, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Applies the held step `step` with its mean gradient times `coefficient` (float32,
  // as torch's clip_grad_norm_ scales): one update, one log entry. A repeat for a step
  // applied already changes nothing (duplicate=true): with the same coefficient, for a
  // step remembered.
  // INVALID_ARGUMENT for a coefficient outside (0, 1] or another than the step was
  // applied with; FAILED_PRECONDITION when the step is not held here (not every push is
  // in: a promoted backup whose workers have not pushed again yet).
  absl::StatusOr<PushOutcome> ApplyClippedStep(int64_t step, float coefficient)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Backups: applies the primary's log entry `mutation.index`, exactly as the primary
  // did (its pushes pass the same checks, so the state stays identical). An index at or
  // below log_index() is a repeat and changes nothing. FAILED_PRECONDITION for a gap
  // (the entry after log_index() is missing); ABORTED once the shard serves as a primary
  // (SetLogSink with a sink, or ServeAlone: its replicator starts from the index it had);
  // UNAVAILABLE when there is no room for it within 10 s; an error if the entry fails here
  // though the primary accepted it (the replicas have diverged; the replica then takes
  // nothing more). Returns log_index() after it. Tests use it; servers receive
  // (ReceiveLogEntries) and apply later (ApplyReceived), which this does in one call.
  absl::StatusOr<int64_t> ApplyLogEntry(const ShardMutation& mutation)
      ABSL_LOCKS_EXCLUDED(mu_, received_mu_);

  // Backups, with the apply off the acknowledgement's path: takes the primary's
  // consecutive log entries `entries` into memory, in index order, for ApplyReceived to
  // apply. Holds only the receipt lock, never the shard's, so an apply in progress
  // delays it only when the shard is out of room (below).
  // Entries at or below received_index() are repeats and are dropped. Returns
  // received_index() after them. FAILED_PRECONDITION, taking none, when the first new
  // entry leaves a gap; ABORTED once the shard serves as a primary (see ApplyLogEntry);
  // the apply's error once an apply failed (the replica diverged; it takes no
  // more). While options().max_received_bytes wait to be applied, blocks until
  // `deadline` for room, then takes none. Every entry taken is applied before the shard
  // changes role (SetLogSink), so a backup promoted with entries waiting applies them
  // before it serves.
  absl::StatusOr<int64_t> ReceiveLogEntries(std::vector<ShardMutation> entries, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_, received_mu_);
  // Applies every entry received before the call and not yet applied, in order (those
  // received during it wait for the next call). An error when one fails here though the
  // primary accepted it (the replicas diverged): the shard then closes (its pulls and
  // pushes fail, naming the entry) and takes no more entries.
  // `received_before` (a test's hold, ReplicaApplier): only the entries received
  // before then apply, the others wait.
  absl::Status ApplyReceived(absl::Time received_before = absl::InfiniteFuture())
      ABSL_LOCKS_EXCLUDED(mu_, received_mu_);
  // The newest log index received in order (applied, or waiting for ApplyReceived).
  int64_t received_index() const ABSL_LOCKS_EXCLUDED(received_mu_);
  // Whether entries received are not yet applied (waiting, or being applied).
  bool has_unapplied() const ABSL_LOCKS_EXCLUDED(received_mu_);

  // Everything a new replica needs (FromReplica), consistent at one log index. Under the
  // shard's lock only the copy of the rows as stored; their order (least recently
  // updated first) is made after.
  ReplicaState ExportReplica() const ABSL_LOCKS_EXCLUDED(mu_);
  // The same with an embedding shard's rows as stored and the links that order them
  // (EmbeddingShardState::next_more_recent), which whoever takes the copy follows
  // (OrderRowsByRecency): what a primary streams to a new backup, which orders the rows
  // itself, so that the primary neither walks them nor holds a second copy.
  ReplicaState ExportReplicaAsStored() const ABSL_LOCKS_EXCLUDED(mu_);
  // The number of log entries (accepted pushes and active-set changes) so far.
  int64_t log_index() const ABSL_LOCKS_EXCLUDED(mu_);

  // Makes the push that brings the update count to `step` hand back a snapshot (an
  // on-demand or time-based checkpoint). False if the shard is already at or past it.
  bool ScheduleCheckpointAt(int64_t step) ABSL_LOCKS_EXCLUDED(mu_);

  // The full state (values, moments, update count), for a checkpoint or a handoff; an
  // embedding shard's rows by id, sorted after the shard's lock is let go.
  ShardState Snapshot() const ABSL_LOCKS_EXCLUDED(mu_);

  ShardCounters counters() const ABSL_LOCKS_EXCLUDED(mu_);
  // Async/ssp: per worker rank, the step after its last push applied here (sync: zeros).
  std::vector<int64_t> worker_next_steps() const ABSL_LOCKS_EXCLUDED(mu_);
  const ParameterShardOptions& options() const { return options_; }

 private:
  // The storage, made for `options` (dense: `values`, with a fresh rule or one resumed
  // from `resumed`'s step and moments, which it takes; null: a fresh shard).
  ParameterShard(ParameterShardOptions options, std::vector<float> values, ShardState* resumed);

  absl::Status ClosedError() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `rows` checked for this shard (CheckRowIds's error as "embedding shard N: ...");
  // INVALID_ARGUMENT for a dense shard.
  absl::StatusOr<CheckedRowIds> CheckRows(RowIdsView rows) const;
  // INVALID_ARGUMENT unless this is an embedding shard with a table `table`.
  absl::Status CheckExportedTable(int table) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until `worker_rank` may compute `step` (see Pull); returns its start step.
  absl::StatusOr<int64_t> AwaitPullLocked(int worker_rank, int64_t step, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What a push is refused for before its gradient is looked at: an unknown or inactive
  // worker, a closed (unless `from_primary_log`: a backup applies its primary's entries
  // although closed to workers, see Close) or valueless shard, a negative step.
  absl::Status CheckPushMayProceedLocked(int worker_rank, int64_t step, bool from_primary_log)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Push. `record`: put the log entry (with its gradient) in outcome->log; a backup
  // applying its primary's entry only advances the index.
  absl::Status PushLocked(ShardPush* push, PushOutcome* outcome, bool record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `gradient`'s values may be applied: without `against_state`, finite and
  // within max_gradient_norm (checked before a repeat is recognised); with it, within what
  // the optimizer's state can hold now, updated with `settings` (checked once the push is
  // known to be new, just before it is taken). Counts a refusal. REQUIRES: its shape fits.
  absl::Status CheckGradientValuesLocked(int worker_rank, int64_t step, RowIdsView rows,
                                         absl::Span<const float> gradient,
                                         const StepHyperparameters& settings, bool against_state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a refusal of a push's values of kind `reason` and returns its error.
  absl::Status RefuseValuesLocked(GradientRefusal reason, int64_t* counter, std::string message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `outcome` null on a backup: then a pending sync step is not completed here.
  absl::Status SetActiveWorkersLocked(const std::vector<bool>& active, PushOutcome* outcome)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives `mutation` the next log index, and hands it on (outcome->log or the sink)
  // unless `outcome` is null.
  void RecordLocked(ShardMutation mutation, PushOutcome* outcome)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool PullMayProceed(int64_t step) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string DescribeWait(int64_t step) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies the pending sync step if every active worker has pushed.
  absl::Status MaybeCompleteSyncStep(PushOutcome* outcome) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a new push's settings may join the step: those the rule accepts
  // (PrepareFor), and in sync mode those of the step's earlier pushes (a conflict
  // otherwise, which pulls of the step then report). Counts a refusal.
  absl::Status AdmitSettingsLocked(const ShardPush& push) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies the next update (counted even if it fails part way, as a backup counts it).
  absl::Status ApplyUpdate(RowIdsView rows, const StepHyperparameters& settings,
                           absl::Span<const float> gradient, PushOutcome* outcome)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sync: counts the step being collected as done without an update (a push skipped it),
  // and logs it; `outcome` null on a backup replaying its primary's entry: not logged.
  void SkipSyncStepLocked(PushOutcome* outcome) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a new sync push's clip_grad_norm may join the step (that of its other
  // pushes), and an async one's none. Counts a refusal.
  absl::Status AdmitClipLocked(const ShardPush& push) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The mean of the pending pushes of `contributors` (summed in rank order), and its rows.
  void MeanOfStepLocked(const std::vector<int>& contributors, CheckedRowIds* rows,
                        std::vector<float>* mean) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sync, every push of a clipped step in: the mean and its sum of squares, held.
  void HoldClippedStepLocked(const std::vector<int>& contributors)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Remembers a sync step clipped or skipped (forgetting the oldest beyond
  // kRememberedSyncSteps); the one remembered for `step`, or null.
  void RememberStepLocked(const ClippedStep& ended) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const ClippedStep* RememberedStepLocked(int64_t step) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the sync step being collected: its pushes' settings and conflict forgotten.
  void EndSyncStepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Once applied_updates_ moved on: outcome->applied_updates, and the snapshot to write
  // if this is a checkpoint step.
  void AfterStepLocked(PushOutcome* outcome) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The update number the optimizer makes next (its updates so far, plus one).
  int64_t NextUpdateLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return applied_updates_ - skipped_steps_ + 1;
  }
  // With `delta_of` >= 0 (an embedding shard's), only the rows changed since then.
  // An embedding shard's rows in `order` (a checkpoint's: kAsStored, sorted by its
  // writer; a replica's: kAsStoredWithRecency, ordered after the lock).
  ShardState SnapshotLocked(RowOrder order, int64_t delta_of = -1) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The snapshot a periodic or scheduled checkpoint writes: SnapshotLocked's, or, for an
  // embedding shard with options_.embedding_deltas, a delta holding every change since
  // the last full one this shard took (its base), up to embedding_deltas in a row. Full
  // instead: the shard's first, one whose base the writer does not hold (dropped or
  // failed), and one after changes were not all kept.
  ShardState CheckpointSnapshotLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SetLogSink's work; `takes_entries`: whether replicated entries are taken from now on.
  void SetRole(std::shared_ptr<ShardLogSink> sink, const std::function<void(int64_t)>& at_index,
               bool takes_entries) ABSL_LOCKS_EXCLUDED(mu_, received_mu_);
  // The received entries' apply (ApplyReceived), with mu_ held.
  absl::Status ApplyReceivedLocked(absl::Time received_before = absl::InfiniteFuture())
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) ABSL_LOCKS_EXCLUDED(received_mu_);
  absl::StatusOr<int64_t> ApplyLogEntryLocked(const ShardMutation& mutation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The sum of squares, in double, of the elements of `gradient` (this shard's part) that
  // train parameters: a dense range's buffers (their changes) are neither clipped nor
  // bounded by training.max_gradient_norm.
  double TrainedSumOfSquares(absl::Span<const float> gradient) const;
  // Multiplies those elements by `coefficient`.
  void ScaleTrained(float coefficient, std::vector<float>* gradient) const;

  const ParameterShardOptions options_;
  mutable absl::Mutex mu_;
  // One of these, as options_.embedding says; storage_ is it.
  std::unique_ptr<DenseStorage> dense_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<EmbeddingStorage> embedding_ ABSL_GUARDED_BY(mu_);
  ShardStorage* storage_ ABSL_GUARDED_BY(mu_) = nullptr;
  ConsistencyGate gate_ ABSL_GUARDED_BY(mu_);
  ShardLog log_ ABSL_GUARDED_BY(mu_);
  // The updates applied so far (in sync mode, also the step being collected, and
  // counting the steps skipped).
  int64_t applied_updates_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t skipped_steps_ ABSL_GUARDED_BY(mu_) = 0;  // sync: of applied_updates_
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::string closed_reason_ ABSL_GUARDED_BY(mu_);
  std::set<int64_t> scheduled_checkpoints_ ABSL_GUARDED_BY(mu_);
  ShardCounters counters_ ABSL_GUARDED_BY(mu_);
  // sync: the pushes of the step being collected, one per worker rank (gate_ says
  // whose are in; the others hold spare buffers).
  std::vector<ShardPush> pending_ ABSL_GUARDED_BY(mu_);
  // sync: the settings the step's pushes carry, and the first rank that sent them (-1:
  // none in yet); a conflict between two pushes' (the refusal pulls of the step get).
  StepHyperparameters step_settings_ ABSL_GUARDED_BY(mu_);
  int step_settings_rank_ ABSL_GUARDED_BY(mu_) = -1;
  std::optional<absl::Status> step_conflict_ ABSL_GUARDED_BY(mu_);
  // sync: the clip_grad_norm the step's pushes carry (0: none) and the first rank that
  // sent it; once every push is in, the step held: its mean gradient (and rows) and the
  // sum of its squares, until ApplyClippedStep; and the last steps clipped or skipped
  // (kRememberedSyncSteps, oldest first).
  double step_clip_ ABSL_GUARDED_BY(mu_) = 0;
  int step_clip_rank_ ABSL_GUARDED_BY(mu_) = -1;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<float> held_mean_ ABSL_GUARDED_BY(mu_);
  CheckedRowIds held_rows_ ABSL_GUARDED_BY(mu_);
  double held_sum_squares_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<ClippedStep> recent_steps_ ABSL_GUARDED_BY(mu_);
  // Delta checkpoints (CheckpointSnapshotLocked): the step of this shard's last full
  // checkpoint, the deltas' base (-1: none yet), and the deltas taken since; whether a
  // backup's log replay is running (its steps start no base).
  int64_t delta_base_step_ ABSL_GUARDED_BY(mu_) = -1;
  int deltas_since_full_ ABSL_GUARDED_BY(mu_) = 0;
  bool replaying_ ABSL_GUARDED_BY(mu_) = false;
  // A torch model's dense shard before its first worker gave it values.
  bool awaiting_initial_values_ ABSL_GUARDED_BY(mu_) = false;
  int64_t waiting_pulls_ ABSL_GUARDED_BY(mu_) = 0;

  // A backup's entries received and not yet applied. Its own lock, taken after mu_
  // (never before), so that receipt does not wait for an apply.
  mutable absl::Mutex received_mu_;
  struct ReceivedEntry {
    ShardMutation mutation;
    absl::Time at;  // received then
  };
  std::deque<ReceivedEntry> received_ ABSL_GUARDED_BY(received_mu_);
  // Their gradients' bytes, counted until applied (ApplyReceivedLocked).
  size_t received_bytes_ ABSL_GUARDED_BY(received_mu_) = 0;
  // The newest index received in order: log_.index() when set by SetLogSink or
  // FromReplica, then each entry taken.
  int64_t received_through_ ABSL_GUARDED_BY(received_mu_) = 0;
  // The newest index received and applied (set with received_through_, and after each
  // apply).
  int64_t applied_through_ ABSL_GUARDED_BY(received_mu_) = 0;
  bool accepting_entries_ ABSL_GUARDED_BY(received_mu_) = true;  // false: a primary
  absl::Status apply_failure_ ABSL_GUARDED_BY(received_mu_);     // set once an apply failed
};

}  // namespace paramserver

#endif  // PARAMSERVER_PS_PARAMETER_SHARD_H_
