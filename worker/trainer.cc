#include "worker/trainer.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/shard_layout.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "spdlog/spdlog.h"
#include "worker/batch_order.h"
#include "worker/recovery.h"

namespace paramserver {
namespace {

constexpr int64_t kEvaluationBatch = 1000;

}  // namespace

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(TrainerOptions options, MlpLayout layout,
                                                         const LabeledDataset* train,
                                                         const LabeledDataset* test, PsClient* ps,
                                                         ComputeBackend* backend) {
  const int64_t steps_per_epoch =
      StepsPerEpoch(train->example_count, options.num_workers, options.training.batch_size);
  if (steps_per_epoch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("training.batch_size ", options.training.batch_size,
                     " is larger than the smallest worker's share (", train->example_count,
                     " examples / ", options.num_workers, " workers)"));
  }
  if (options.evaluate_each_epoch && test == nullptr) {
    return absl::InvalidArgumentError("evaluation needs a test set");
  }
  return std::unique_ptr<Trainer>(new Trainer(std::move(options), std::move(layout), train, test,
                                              ps, backend, steps_per_epoch));
}

Trainer::Trainer(TrainerOptions options, MlpLayout layout, const LabeledDataset* train,
                 const LabeledDataset* test, PsClient* ps, ComputeBackend* backend,
                 int64_t steps_per_epoch)
    : options_(std::move(options)),
      layout_(std::move(layout)),
      train_(train),
      test_(test),
      ps_(ps),
      backend_(backend),
      steps_per_epoch_(steps_per_epoch),
      total_steps_(options_.training.max_steps > 0
                       ? std::min<int64_t>(options_.training.max_steps,
                                           steps_per_epoch * options_.training.epochs)
                       : steps_per_epoch * options_.training.epochs),
      buffers_(layout_.total_parameters()),
      strategy_(MakePushStrategy(
          options_.training,
          {ps_, backend_, &buffers_, [this](int64_t position) { return GatherBatch(position); }})),
      recorder_(options_.start_step, total_steps_, options_.training.batch_size,
                options_.progress_log_interval, options_.on_scalar) {}

BatchView Trainer::GatherBatch(int64_t position) {
  const int64_t batch = options_.training.batch_size;
  const int64_t width = train_->feature_count;
  batch_features_.resize(batch * width);
  batch_labels_.resize(batch);
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t example = order_[position * batch + i];
    std::copy(train_->features.begin() + example * width,
              train_->features.begin() + (example + 1) * width,
              batch_features_.begin() + i * width);
    batch_labels_[i] = train_->labels[example];
  }
  return {batch_features_.data(), batch_labels_.data(), batch};
}

absl::Status Trainer::Recover(const absl::Status& failure, int64_t* step,
                              std::optional<absl::Time>* give_up_at) {
  PS_ASSIGN_OR_RETURN(const ShardMapUpdate update,
                      WaitForRecovery(ps_, failure, *step, options_.recovery_timeout, give_up_at));
  if (!update.epoch_changed) return absl::OkStatus();
  state_.recovering = true;
  if (update.rewind_to.has_value()) {
    *step = *update.rewind_to;
    state_.last_pushed_step = -1;
    return absl::OkStatus();
  }
  if (state_.last_pushed_step >= 0) {
    // A moved shard's new owner may lack our last push; the others ignore the repeat.
    absl::Status repushed = ps_->PushAll(state_.last_pushed_step, buffers_.last_pushed_gradient);
    if (!repushed.ok()) return MapChangeMayCure(repushed) ? absl::OkStatus() : repushed;
  }
  return absl::OkStatus();
}

absl::Status Trainer::PullWithRecovery(int64_t step, absl::Span<float> params) {
  std::optional<absl::Time> give_up_at;
  while (true) {
    absl::Status pulled = ps_->PullAll(step, params);
    if (pulled.ok()) return pulled;
    int64_t rewound = step;
    PS_RETURN_IF_ERROR(Recover(pulled, &rewound, &give_up_at));
    if (rewound != step) {
      state_.pending_rewind = rewound;
      return absl::AbortedError(absl::StrCat("the servers rolled back to step ", rewound));
    }
  }
}

absl::StatusOr<TrainingSummary> Trainer::Run() {
  const ParameterRange range =
      ContiguousPart(train_->example_count, options_.num_workers, options_.worker_rank);
  spdlog::info("training steps {}..{} ({} per epoch) on examples [{}, {}) with batch {} on {}",
               options_.start_step, total_steps_, steps_per_epoch_, range.begin, range.end,
               options_.training.batch_size, backend_->name());
  const absl::Time start = absl::Now();
  TrainingSummary summary;
  int order_epoch = -1;
  int64_t step = options_.start_step;
  while (step < total_steps_) {
    if (stop_requested_.load()) return absl::CancelledError(absl::StrCat("stopped at step ", step));
    const int epoch = static_cast<int>(step / steps_per_epoch_);
    const StepInput in{step, step % steps_per_epoch_, steps_per_epoch_, total_steps_};
    if (epoch != order_epoch) {
      order_ = EpochExampleOrder(range, epoch, options_.training.seed, options_.training.shuffle);
      order_epoch = epoch;
    }
    // Rewound or recovering: pull afresh.
    if (state_.prefetched_step != step) state_.prefetched_step = -1;
    if (state_.precomputed_step != step) state_.precomputed_step = -1;
    absl::Status status = absl::OkStatus();
    float loss = state_.unacknowledged_loss;
    bool fresh = false;
    if (state_.precomputed_step == step) {
      buffers_.gradient.swap(buffers_.next_gradient);  // computed while the last push flew
      loss = state_.precomputed_loss;
      state_.precomputed_step = -1;
    } else if (state_.unacknowledged_step != step) {
      const absl::Time pull_start = absl::Now();
      // The previous push usually brought this step's values back with it.
      if (state_.prefetched_step != step) {
        status = ps_->PullAll(step, absl::MakeSpan(buffers_.params));
      }
      summary.pull_seconds += absl::ToDoubleSeconds(absl::Now() - pull_start);
      if (status.ok()) {
        const absl::Time compute_start = absl::Now();
        PS_ASSIGN_OR_RETURN(loss, strategy_->Compute(in, GatherBatch(in.position)));
        summary.compute_seconds += absl::ToDoubleSeconds(absl::Now() - compute_start);
        fresh = true;
      }
    }
    if (status.ok()) {
      const absl::Time push_start = absl::Now();
      const PushOutcome pushed = strategy_->Push(in, fresh, &state_, &summary.early_push_buckets);
      status = pushed.status;
      summary.compute_seconds += absl::ToDoubleSeconds(pushed.computing);
      // The push's share is the wait after computing.
      summary.push_seconds += absl::ToDoubleSeconds(absl::Now() - (push_start + pushed.computing));
      if (!status.ok()) {
        state_.unacknowledged_step = step;
        state_.unacknowledged_loss = loss;
      }
    }
    if (!status.ok()) {
      state_.ForgetPrefetched();
      PS_RETURN_IF_ERROR(Recover(status, &step, &state_.give_up_at));
      if (step != state_.unacknowledged_step) state_.unacknowledged_step = -1;  // rewound
      continue;
    }
    state_.unacknowledged_step = -1;
    if (state_.give_up_at.has_value()) {
      if (state_.recovering) spdlog::info("step {} completed: recovered", step);
      state_.give_up_at.reset();
      state_.recovering = false;
    }
    state_.last_pushed_step = step;
    // A swap, not a copy: the next ComputeGradients overwrites all of the gradient.
    buffers_.last_pushed_gradient.swap(buffers_.gradient);
    recorder_.Record(step, epoch, loss, start, &summary);
    std::optional<int64_t> rewind;
    PS_RETURN_IF_ERROR(MaybeEvaluateEpoch(step, epoch, &rewind));
    if (rewind.has_value()) {
      state_.ForgetPrefetched();
      step = *rewind;
      continue;
    }
    ++step;
  }
  summary.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return summary;
}

absl::Status Trainer::MaybeEvaluateEpoch(int64_t step, int epoch, std::optional<int64_t>* rewind) {
  const bool epoch_done = (step % steps_per_epoch_) + 1 == steps_per_epoch_;
  if (!options_.evaluate_each_epoch || !epoch_done || step + 1 >= total_steps_) {
    return absl::OkStatus();
  }
  absl::StatusOr<double> accuracy = Evaluate(step + 1, nullptr);
  if (accuracy.ok()) {
    spdlog::info("epoch {} test_accuracy={:.4f}", epoch, *accuracy);
    if (options_.on_scalar) options_.on_scalar("test_accuracy", step + 1, *accuracy);
    recorder_.Update([&](NodeProgress* progress) {
      progress->set_test_accuracy(*accuracy);
      progress->set_accuracy_step(step + 1);
    });
    return absl::OkStatus();
  }
  if (state_.pending_rewind.has_value()) {
    spdlog::warn("epoch {} evaluation skipped: {}", epoch, accuracy.status().ToString());
    *rewind = state_.pending_rewind;
    state_.pending_rewind.reset();
    return absl::OkStatus();
  }
  return accuracy.status();
}

absl::StatusOr<double> Trainer::Evaluate(int64_t step, std::vector<float>* weights) {
  if (test_ == nullptr) return absl::FailedPreconditionError("this worker has no test set");
  return Evaluate(step, *test_, weights);
}

absl::StatusOr<double> Trainer::Evaluate(int64_t step, const LabeledDataset& test,
                                         std::vector<float>* weights) {
  std::vector<float> params(layout_.total_parameters());
  PS_RETURN_IF_ERROR(PullWithRecovery(step, absl::MakeSpan(params)));
  int64_t correct = 0;
  for (int64_t begin = 0; begin < test.example_count; begin += kEvaluationBatch) {
    const int64_t size = std::min(kEvaluationBatch, test.example_count - begin);
    BatchView batch{test.features.data() + begin * test.feature_count, test.labels.data() + begin,
                    size};
    PS_ASSIGN_OR_RETURN(int64_t batch_correct, backend_->CountCorrect(params, batch));
    correct += batch_correct;
  }
  if (weights != nullptr) *weights = std::move(params);
  return static_cast<double>(correct) / static_cast<double>(test.example_count);
}

NodeProgress Trainer::progress() const { return recorder_.progress(); }

}  // namespace paramserver
