#include "worker/trainer.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/wire/tensor_codec.h"
#include "spdlog/spdlog.h"

namespace paramserver {
namespace {

constexpr int64_t kEvaluationBatch = 1000;

}  // namespace

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(TrainerOptions options, MlpLayout layout,
                                                         const LabeledDataset* train,
                                                         const LabeledDataset* test, PsClient* ps,
                                                         ComputeBackend* backend) {
  PS_ASSIGN_OR_RETURN(const int64_t steps_per_epoch,
                      StepLoop::StepsPerEpoch(options, train->example_count));
  if (options.evaluate_each_epoch && test == nullptr) {
    return absl::InvalidArgumentError("evaluation needs a test set");
  }
  return std::unique_ptr<Trainer>(new Trainer(std::move(options), std::move(layout), train, test,
                                              ps, backend, steps_per_epoch));
}

Trainer::Trainer(TrainerOptions options, MlpLayout layout, const LabeledDataset* train,
                 const LabeledDataset* test, PsClient* ps, ComputeBackend* backend,
                 int64_t steps_per_epoch)
    : layout_(std::move(layout)),
      train_(train),
      test_(test),
      ps_(ps),
      backend_(backend),
      loop_(std::move(options), train->example_count, steps_per_epoch, ps),
      buffers_(layout_.total_parameters()),
      strategy_(MakePushStrategy(
          loop_.options().training,
          {ps_, backend_, &buffers_, [this](int64_t position) { return GatherBatch(position); }})) {
}

BatchView Trainer::GatherBatch(int64_t position) {
  const absl::Span<const int64_t> examples = loop_.BatchExamples(position);
  const int64_t batch = static_cast<int64_t>(examples.size());
  const int64_t width = train_->feature_count;
  batch_features_.resize(batch * width);
  batch_labels_.resize(batch);
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t example = examples[i];
    std::copy(train_->features.begin() + example * width,
              train_->features.begin() + (example + 1) * width,
              batch_features_.begin() + i * width);
    batch_labels_[i] = train_->labels[example];
  }
  return {batch_features_.data(), batch_labels_.data(), batch};
}

absl::StatusOr<StepResult> Trainer::TrainStep(const StepInput& in, TrainingSummary* summary) {
  const int64_t step = in.step;
  // Rewound or recovering: pull afresh.
  if (state_.prefetched_step != step) state_.prefetched_step = -1;
  if (state_.precomputed_step != step) state_.precomputed_step = -1;
  StepResult result;
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
      result.transfer = ps_->Pull({step, {absl::MakeSpan(buffers_.params)}});
    }
    summary->pull_seconds += absl::ToDoubleSeconds(absl::Now() - pull_start);
    if (!result.transfer.ok()) return result;
    const absl::Time compute_start = absl::Now();
    PS_ASSIGN_OR_RETURN(loss, strategy_->Compute(in, GatherBatch(in.position)));
    summary->compute_seconds += absl::ToDoubleSeconds(absl::Now() - compute_start);
    fresh = true;
  }
  const absl::Time push_start = absl::Now();
  const PushOutcome pushed = strategy_->Push(in, fresh, &state_, &summary->early_push_buckets);
  summary->compute_seconds += absl::ToDoubleSeconds(pushed.computing);
  // The push's share is the wait after computing.
  summary->push_seconds += absl::ToDoubleSeconds(absl::Now() - (push_start + pushed.computing));
  if (!pushed.status.ok()) {
    state_.unacknowledged_step = step;
    state_.unacknowledged_loss = loss;
    result.transfer = pushed.status;
    return result;
  }
  state_.unacknowledged_step = -1;
  state_.last_pushed_step = step;
  // A swap, not a copy: the next ComputeGradients overwrites all of the gradient.
  buffers_.last_pushed_gradient.swap(buffers_.gradient);
  result.loss = loss;
  return result;
}

absl::Status Trainer::ResendLastPush() {
  if (state_.last_pushed_step < 0) return absl::OkStatus();
  return strategy_->Resend(state_.last_pushed_step, buffers_.last_pushed_gradient);
}

void Trainer::Rewound(int64_t step) {
  state_.last_pushed_step = -1;
  // A push that failed at the step rewound to is still re-sent as it was.
  if (step != state_.unacknowledged_step) state_.unacknowledged_step = -1;
}

absl::Status Trainer::PullWithRecovery(int64_t step, absl::Span<float> params) {
  std::optional<absl::Time> give_up_at;
  while (true) {
    absl::Status pulled = ps_->Pull({step, {params}});
    if (pulled.ok()) return pulled;
    int64_t rewound = step;
    PS_RETURN_IF_ERROR(loop_.Recover(this, pulled, &rewound, &give_up_at));
    if (rewound != step) {
      state_.pending_rewind = rewound;
      return absl::AbortedError(absl::StrCat("the servers rolled back to step ", rewound));
    }
  }
}

absl::Status Trainer::EvaluateEpoch(int64_t step, int epoch, std::optional<int64_t>* rewind) {
  absl::StatusOr<double> accuracy = Evaluate(step, nullptr);
  if (accuracy.ok()) {
    spdlog::info("epoch {} test_accuracy={:.4f}", epoch, *accuracy);
    if (loop_.options().on_scalar) loop_.options().on_scalar("test_accuracy", step, *accuracy);
    loop_.recorder()->Update([&](NodeProgress* progress) {
      progress->set_test_accuracy(*accuracy);
      progress->set_accuracy_step(step);
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

}  // namespace paramserver
