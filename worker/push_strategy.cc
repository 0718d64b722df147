#include "worker/push_strategy.h"

#include <cmath>
#include <future>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/wire/tensor_codec.h"
#include "worker/gradient_clipping.h"

namespace paramserver {
namespace {

bool AllFinite(const std::vector<float>& values) { return FirstNonFinite(values) == values.size(); }

// Every shard acknowledges; nothing comes back.
class PlainPush : public PushStrategy {
 public:
  using PushStrategy::PushStrategy;
  PushOutcome Push(const StepInput& in, bool /*fresh*/, StepState* /*state*/,
                   int64_t* /*early_push_buckets*/) override {
    return {env_.ps->Push({in.step, env_.buffers->gradient}).status()};
  }
};

// The push's replies carry step + 1's values (one round trip a step); the last step's
// push is plain.
class PullNextPush : public PlainPush {
 public:
  using PlainPush::PlainPush;
  PushOutcome Push(const StepInput& in, bool fresh, StepState* state,
                   int64_t* early_push_buckets) override {
    if (in.last()) return PlainPush::Push(in, fresh, state, early_push_buckets);
    StepBuffers& buffers = *env_.buffers;
    absl::StatusOr<bool> pulled_next = env_.ps->Push(
        {in.step, buffers.gradient, {}, {}, StepValues{absl::MakeSpan(buffers.params)}});
    if (pulled_next.ok() && *pulled_next) state->prefetched_step = in.step + 1;
    return {pulled_next.status()};
  }
};

// The push leaves bucket by bucket during backpropagation (training.push_bucket_kb),
// bringing step + 1's values into incoming_params. A re-sent gradient goes as pull-next.
class BucketedPush : public PullNextPush {
 public:
  using PullNextPush::PullNextPush;

  absl::StatusOr<float> Compute(const StepInput& in, const BatchView& batch) override {
    StepBuffers& buffers = *env_.buffers;
    StepPush push{in.step, buffers.gradient};
    if (!in.last()) push.next = StepValues{absl::MakeSpan(buffers.incoming_params)};
    streamed_ = env_.ps->StartStreamedPush(push);
    absl::StatusOr<float> computed =
        FinishGradient(in, env_.backend->ComputeGradientsStreamed(
                               buffers.params, batch, absl::MakeSpan(buffers.gradient),
                               [&](int64_t from) { streamed_->Ready(from); }));
    // The job ends here, so what already left is moot (a non-finite part is refused by
    // its servers). Dropping the push sends nothing more and waits until gRPC let go of
    // the gradient.
    if (!computed.ok()) streamed_.reset();
    return computed;
  }

  PushOutcome Push(const StepInput& in, bool fresh, StepState* state,
                   int64_t* early_push_buckets) override {
    if (streamed_ == nullptr) return PullNextPush::Push(in, fresh, state, early_push_buckets);
    absl::StatusOr<bool> pulled_next = streamed_->Finish();
    *early_push_buckets += streamed_->early_buckets();
    streamed_.reset();
    if (pulled_next.ok() && *pulled_next) {
      env_.buffers->params.swap(env_.buffers->incoming_params);
      state->prefetched_step = in.step + 1;
    }
    return {pulled_next.status()};
  }

 private:
  std::unique_ptr<StreamedPush> streamed_;  // started by Compute, finished by Push
};

// Async modes (training.overlap): the push, bringing step + 1's values into
// incoming_params, runs on a helper thread while this one computes step + 1's gradient
// on the values this step used. Only the helper touches the client meanwhile, and only
// this thread the backend. At an epoch's end and the last step: pull-next.
class OverlapPush : public PullNextPush {
 public:
  using PullNextPush::PullNextPush;
  PushOutcome Push(const StepInput& in, bool fresh, StepState* state,
                   int64_t* early_push_buckets) override {
    if (in.last() || in.position + 1 >= in.steps_per_epoch) {
      return PullNextPush::Push(in, fresh, state, early_push_buckets);
    }
    StepBuffers& buffers = *env_.buffers;
    std::future<absl::StatusOr<bool>> pushed = std::async(std::launch::async, [&] {
      return env_.ps->Push(
          {in.step, buffers.gradient, {}, {}, StepValues{absl::MakeSpan(buffers.incoming_params)}});
    });
    const absl::Time compute_start = absl::Now();
    const BatchView next_batch = env_.gather_batch(in.position + 1);
    absl::StatusOr<float> next_loss = env_.backend->ComputeGradients(
        buffers.params, next_batch, absl::MakeSpan(buffers.next_gradient));
    // As FinishGradient leaves a fresh gradient: finite, and clipped to its own norm. One
    // that is not is computed again the ordinary way, which reports why.
    const bool next_usable = next_loss.ok() && std::isfinite(*next_loss) &&
                             AllFinite(buffers.next_gradient) &&
                             (env_.local_clip_grad_norm == 0 ||
                              ClipGradientInPlace(in.step + 1, env_.local_clip_grad_norm,
                                                  absl::MakeSpan(buffers.next_gradient))
                                  .ok());
    PushOutcome outcome;
    outcome.computing = absl::Now() - compute_start;
    absl::StatusOr<bool> pulled_next = pushed.get();
    outcome.status = pulled_next.status();
    if (pulled_next.ok() && *pulled_next) {
      buffers.params.swap(buffers.incoming_params);
      state->prefetched_step = in.step + 1;
      if (next_usable) {
        state->precomputed_step = in.step + 1;
        state->precomputed_loss = *next_loss;
      }
    }
    return outcome;
  }
};

// Sync with training.optimizer.clip_grad_norm: the push holds the step on every dense
// shard until every worker's push is in and brings back the squares of the step's mean
// gradient, summed over every shard; the pull of step + 1 carries the coefficient
// (torch's clip_grad_norm_ after averaging) that each shard applies the held step with.
// Two round trips a step, the last step's included (its coefficient must reach the
// servers). A failure after the push re-sends it: the servers take the repeat as such
// and report the same sums.
class ClippedSyncPush : public PushStrategy {
 public:
  ClippedSyncPush(StrategyEnvironment environment, double clip_grad_norm)
      : PushStrategy(std::move(environment)), clip_grad_norm_(clip_grad_norm) {}

  PushOutcome Push(const StepInput& in, bool /*fresh*/, StepState* state,
                   int64_t* /*early_push_buckets*/) override {
    absl::Status done =
        PushAndPullNext(in.step, env_.buffers->gradient, absl::MakeSpan(env_.buffers->params));
    if (done.ok()) state->prefetched_step = in.step + 1;
    return {done};
  }

  // The step's values go to incoming_params, which no other push of this strategy uses.
  absl::Status Resend(int64_t step, absl::Span<const float> gradient) override {
    return PushAndPullNext(step, gradient, absl::MakeSpan(env_.buffers->incoming_params));
  }

 private:
  absl::Status PushAndPullNext(int64_t step, absl::Span<const float> gradient,
                               absl::Span<float> next_params) {
    double sum_squares = 0;
    StepPush push{step, gradient};
    push.clip_grad_norm = clip_grad_norm_;
    push.step_sum_squares = &sum_squares;
    PS_RETURN_IF_ERROR(env_.ps->Push(push).status());
    PS_ASSIGN_OR_RETURN(const float coefficient,
                        StepClipCoefficient(step, clip_grad_norm_, sum_squares));
    return env_.ps->Pull({step + 1, {next_params}, coefficient});
  }

  const double clip_grad_norm_;
};

}  // namespace

absl::StatusOr<float> PushStrategy::Compute(const StepInput& in, const BatchView& batch) {
  StepBuffers& buffers = *env_.buffers;
  return FinishGradient(
      in, env_.backend->ComputeGradients(buffers.params, batch, absl::MakeSpan(buffers.gradient)));
}

absl::StatusOr<float> PushStrategy::FinishGradient(const StepInput& in,
                                                   absl::StatusOr<float> computed) {
  if (!computed.ok()) return computed.status();
  if (!std::isfinite(*computed) || !AllFinite(env_.buffers->gradient)) {
    return absl::FailedPreconditionError(absl::StrCat("training diverged at step ", in.step,
                                                      ": loss ", *computed,
                                                      "; lower training.optimizer.learning_rate"));
  }
  if (env_.local_clip_grad_norm > 0) {
    PS_RETURN_IF_ERROR(ClipGradientInPlace(in.step, env_.local_clip_grad_norm,
                                           absl::MakeSpan(env_.buffers->gradient)));
  }
  return *computed;
}

absl::Status PushStrategy::Resend(int64_t step, absl::Span<const float> gradient) {
  return env_.ps->Push({step, gradient}).status();
}

std::unique_ptr<PushStrategy> MakePushStrategy(const TrainingSection& training,
                                               StrategyEnvironment environment) {
  const double clip = training.optimizer.clip_grad_norm;
  if (clip > 0 && training.mode == TrainingMode::kSync) {
    return std::make_unique<ClippedSyncPush>(std::move(environment), clip);
  }
  if (clip > 0) environment.local_clip_grad_norm = clip;
  if (training.overlap && training.mode == TrainingMode::kAsync) {
    return std::make_unique<OverlapPush>(std::move(environment));
  }
  if (training.push_bucket_kb > 0 && clip == 0)
    return std::make_unique<BucketedPush>(std::move(environment));
  return std::make_unique<PullNextPush>(std::move(environment));
}

}  // namespace paramserver
