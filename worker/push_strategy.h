// How a worker computes and pushes one step's gradient, one class per way (plain,
// pull-next, bucketed, overlap), chosen once from the training section; Trainer::Run is
// the loop around them. A new kind of model (sparse embeddings) adds its pull and push
// of rows as another strategy, not as another branch of the loop.
#ifndef PARAMSERVER_WORKER_PUSH_STRATEGY_H_
#define PARAMSERVER_WORKER_PUSH_STRATEGY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/config/cluster_spec.h"
#include "worker/compute_backend.h"
#include "worker/ps_client.h"

namespace paramserver {

// Where the step loop stands between steps: what a failure, a map change or a rollback
// must know to carry on, in one place. -1 steps mean none.
struct StepState {
  // The step whose values `params` already holds (from the previous push's reply).
  int64_t prefetched_step = -1;
  // overlap: the step whose gradient `next_gradient` holds, computed while the previous
  // push was in flight, and its loss.
  int64_t precomputed_step = -1;
  float precomputed_loss = 0;
  // The step whose push failed, with its gradient still in `gradient` and its loss: it is
  // re-sent as it was (pulling again could return values some shards already updated
  // with it, and a gradient computed on those would differ).
  int64_t unacknowledged_step = -1;
  float unacknowledged_loss = 0;
  // The last step every shard acknowledged; its gradient is re-sent after a map change
  // (a moved shard's new owner may lack it).
  int64_t last_pushed_step = -1;
  std::optional<int64_t> pending_rewind;  // a rollback seen while evaluating

  // After any detour (failure, rewind, evaluation trouble): pull and compute afresh.
  void ForgetPrefetched() {
    prefetched_step = -1;
    precomputed_step = -1;
  }
};

// The flat vectors a worker trains with (each the model's size), owned by the trainer.
struct StepBuffers {
  explicit StepBuffers(size_t parameters)
      : params(parameters),
        gradient(parameters),
        incoming_params(parameters),
        next_gradient(parameters),
        last_pushed_gradient(parameters) {}
  std::vector<float> params;
  std::vector<float> gradient;
  std::vector<float> incoming_params;  // the values a push in flight brings back
  std::vector<float> next_gradient;    // overlap: the next step's gradient
  std::vector<float> last_pushed_gradient;
};

// One step as the loop sees it.
struct StepInput {
  int64_t step = 0;
  int64_t position = 0;         // within the epoch
  int64_t steps_per_epoch = 0;  //
  int64_t total_steps = 0;
  bool last() const { return step + 1 >= total_steps; }
};

// What a strategy works with: not owned, all outlive it. `gather_batch(position)` is the
// batch at `position` of the current epoch's order.
struct StrategyEnvironment {
  PsClient* ps = nullptr;
  ComputeBackend* backend = nullptr;
  StepBuffers* buffers = nullptr;
  std::function<BatchView(int64_t position)> gather_batch;
  // Async and ssp: training.optimizer.clip_grad_norm, each push's own norm clipped to it
  // (0: none). Set by MakePushStrategy.
  double local_clip_grad_norm = 0;
};

// How a push went: its status (a failure goes to recovery) and the time spent computing
// the next step's gradient while it was in flight (overlap), which is not push time.
struct PushOutcome {
  absl::Status status;
  absl::Duration computing = absl::ZeroDuration();
};

// Not thread-safe: used by the training thread only.
class PushStrategy {
 public:
  explicit PushStrategy(StrategyEnvironment environment) : env_(std::move(environment)) {}
  virtual ~PushStrategy() = default;

  // Computes `in.step`'s gradient into buffers.gradient on buffers.params, with `batch`,
  // and returns the loss. The job cannot go on after an error: a backend error, or
  // FAILED_PRECONDITION when the loss or the gradient is not finite (nothing more of the
  // gradient is sent).
  virtual absl::StatusOr<float> Compute(const StepInput& in, const BatchView& batch);

  // Pushes `in.step`'s gradient (just computed when `fresh`; else a re-send or a
  // precomputed one), leaving step + 1's values in buffers.params when the servers send
  // them back (state->prefetched_step says so).
  virtual PushOutcome Push(const StepInput& in, bool fresh, StepState* state,
                           int64_t* early_push_buckets) = 0;

  // Sends `step`'s acknowledged gradient again after a map change (a moved shard's new
  // owner may lack it; the others take it as the repeat it is). Pulls nothing into
  // buffers.params.
  virtual absl::Status Resend(int64_t step, absl::Span<const float> gradient);

 protected:
  // The gradient of `in.step` in buffers.gradient, checked (the loss, or the fatal error
  // Compute describes), then clipped to env_.local_clip_grad_norm where set.
  absl::StatusOr<float> FinishGradient(const StepInput& in, absl::StatusOr<float> computed);
  StrategyEnvironment env_;
};

// The strategy `training` asks for: sync with training.optimizer.clip_grad_norm, clipped
// (the servers gather the step's norm; two round trips a step); else overlap
// (training.overlap, async only), else bucketed (training.push_bucket_kb > 0, and no
// clipping: a push clipped by its own norm leaves once the whole gradient is known),
// else pull-next.
std::unique_ptr<PushStrategy> MakePushStrategy(const TrainingSection& training,
                                               StrategyEnvironment environment);

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_PUSH_STRATEGY_H_
