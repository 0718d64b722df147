// How a worker reads and updates the model: the whole flat parameter vector, spread
// over the shards of the shard map.
#ifndef PARAMSERVER_WORKER_PS_CLIENT_H_
#define PARAMSERVER_WORKER_PS_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/model/step_optimizer.h"

namespace paramserver {

// What a refresh of the shard map found.
struct ShardMapUpdate {
  bool epoch_changed = false;
  int64_t epoch = 0;
  // Set when the servers rolled every shard back (sync), or this worker was re-admitted
  // after the scheduler had declared it dead (its slot's present step): the step to
  // continue from.
  std::optional<int64_t> rewind_to;
  bool rejoined = false;  // this worker was re-admitted (rewind_to is then its start step)
  // False when the scheduler has declared this worker dead.
  bool self_active = true;
};

// Where one step's values go: the whole flat parameter vector, and for a model with
// embedding tables (ctr, torch) the rows of `ids` (per table, its unique ids
// ascending) into rows[t], which the client resizes to ids[t].size() x dim. A row reads
// as the servers hold it (its initial value if never updated; zeros for an id short of
// model.min_count). No ids: no rows (`rows` is then unused).
struct StepValues {
  absl::Span<float> params;
  absl::Span<const std::vector<int64_t>> ids;
  absl::Span<std::vector<float>> rows;  // one per table of `ids`
};

// One pull: the values `step` is computed on.
struct StepPull {
  int64_t step = 0;
  StepValues into;
  // Sync, after a push with clip_grad_norm: the coefficient of step - 1 (in (0, 1]),
  // which every dense shard applies its held step with before answering. 0: none.
  float clip_coefficient = 0;
};

// One step's push: the step, its dense gradient (the whole flat vector), the gradients
// of the rows the batch read (row_gradients[t]: ids[t].size() x dim; none for a model
// without tables), and what to pull for step + 1 in the same round trip.
struct StepPush {
  int64_t step = 0;
  absl::Span<const float> gradient;
  absl::Span<const std::vector<int64_t>> ids;
  absl::Span<const std::vector<float>> row_gradients;
  // Set: every shard's reply brings step + 1's values, into these (waiting as a pull of
  // step + 1 would, within the push's deadline).
  std::optional<StepValues> next;
  // A script's optimizer settings for the step (paramserver.DistributedOptimizer): runs
  // of the whole flat vector, each dense shard sent its part. Null: the spec's.
  const StepHyperparameters* settings = nullptr;
  // The worker skips the step (its loss scaler found the gradient not finite): every
  // shard is sent PushRequest.skip_step and no gradient, rows or settings; the sync
  // step is then skipped on every server. `gradient`, `ids` and `row_gradients` are not
  // read.
  bool skip = false;
  // Sync (> 0): the step's mean gradient is clipped to this global 2-norm by the
  // servers. The push (without `next`: the step applies only once the coefficient comes
  // with the pull of step + 1) waits until every worker's push of the step is in, and
  // *step_sum_squares gets the sum of the squares of the step's mean gradient over every
  // dense shard, added in shard order: the norm is its square root.
  double clip_grad_norm = 0;
  double* step_sum_squares = nullptr;
};

// One step's push whose gradient is handed over in parts as backpropagation finishes
// them (training.push_bucket_kb), so that the last layers' gradients travel while the
// first layers' are computed. Used from one thread.
class StreamedPush {
 public:
  // Sends nothing more and waits for whatever is in flight (Finish says how it went):
  // dropping an unfinished push is how a failed step abandons it.
  virtual ~StreamedPush() = default;

  // gradient[from, end) is final and stays unchanged until Finish returns. Sends the
  // shards inside it that are not sent yet, if there is enough of them to be worth a
  // call, without waiting for the network. `from` only decreases.
  virtual void Ready(int64_t from) = 0;

  // Sends whatever is left and waits for every shard: Push's result.
  virtual absl::StatusOr<bool> Finish() = 0;

  // The buckets sent by Ready so far (those that left while the gradient was still
  // being computed); Finish sends at most one more.
  virtual int64_t early_buckets() const = 0;
};

// The shards' replies to one push.
struct PushAcknowledgement {
  int shards = 0;
  // Sync with backup workers (training.sync.backup_workers): the shards whose step had
  // completed without the push, which dropped it (PushResponse.late).
  int late_shards = 0;
  // The lowest update count (a sync shard's step) any shard reported (-1: none). A worker
  // whose push of step t was late finds it past t + 1, and goes on there.
  int64_t least_shard_step = -1;

  // Every shard dropped the push as late: its batch was not trained.
  bool late_everywhere() const { return shards > 0 && late_shards == shards; }
};

// Thread-compatible: one caller at a time; an implementation that is more says so.
class PsClient {
 public:
  virtual ~PsClient() = default;

  // Fills `pull.into` once the servers' consistency rule lets this worker compute
  // `pull.step`. Blocks until then or the pull deadline; the error names the shard and
  // server that did not answer. UNAVAILABLE, FAILED_PRECONDITION and DEADLINE_EXCEEDED
  // may mean the map changed: refresh it. INVALID_ARGUMENT when rows are asked of a
  // client without tables, or `rows` is not one per table of `ids`.
  virtual absl::Status Pull(const StepPull& pull) = 0;

  // Sends every shard its part of `push` and returns once every shard acknowledged
  // (retrying a lost push is safe: the servers apply it once). Every embedding shard
  // gets a push, an empty one when the batch holds none of its rows, so that sync steps
  // complete. With `push.next`: true when every shard sent step + 1's values, which then
  // are exactly what Pull(step + 1) would have returned; false when some shard did not
  // (not ready in time: `next` is partly overwritten and the caller pulls as usual).
  // Without: false.
  virtual absl::StatusOr<bool> Push(const StepPush& push) = 0;

  // Starts a Push part by part (StreamedPush): a model without tables only. The spans of
  // `push` must outlive the StreamedPush; nothing else may use this client until it is
  // finished or destroyed. This default sends everything at Finish.
  virtual std::unique_ptr<StreamedPush> StartStreamedPush(const StepPush& push);

  // Asks the scheduler for the current shard map and routes by it from now on.
  virtual absl::StatusOr<ShardMapUpdate> RefreshShardMap() = 0;
  // RefreshShardMap, but the scheduler answers once it has published a map whose epoch
  // is above the one this client routes by, or after `wait`: a worker whose server died hears
  // of the new map as it is published. This default (for clients with no scheduler to
  // wait on) sleeps for up to 50 ms of `wait` and refreshes.
  virtual absl::StatusOr<ShardMapUpdate> AwaitShardMapChange(absl::Duration wait);

  // Where this worker starts: 0 in a fresh job, the restored step after a resume, the
  // cluster's present step for a worker joining a running job.
  virtual absl::StatusOr<int64_t> StartStep() = 0;

  // How many times RefreshShardMap found this worker admitted again after it was
  // declared dead (ShardMapUpdate::rejoined): a caller that did not see the update
  // itself (an evaluation's pulls) learns from a change in it that its work is stale.
  virtual int64_t rejoins() const { return 0; }

  // What the replies to the last Push that succeeded said (all zeros and -1 before one).
  virtual PushAcknowledgement last_push() const { return {}; }
};

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_PS_CLIENT_H_
