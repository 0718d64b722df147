#include "worker/trainer.h"

#include <cmath>
#include <future>

#include "absl/strings/str_cat.h"
#include "common/shard_layout.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "spdlog/spdlog.h"
#include "worker/batch_order.h"

namespace paramserver {
namespace {

constexpr int64_t kEvaluationBatch = 1000;

bool AllFinite(const std::vector<float>& values) { return FirstNonFinite(values) == values.size(); }

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
      params_(layout_.total_parameters()),
      gradient_(layout_.total_parameters()),
      last_pushed_gradient_(layout_.total_parameters()),
      incoming_params_(layout_.total_parameters()),
      next_gradient_(layout_.total_parameters()) {}

BatchView Trainer::GatherBatch(const std::vector<int64_t>& order, int64_t position) {
  const int64_t batch = options_.training.batch_size;
  const int64_t width = train_->feature_count;
  batch_features_.resize(batch * width);
  batch_labels_.resize(batch);
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t example = order[position * batch + i];
    std::copy(train_->features.begin() + example * width,
              train_->features.begin() + (example + 1) * width,
              batch_features_.begin() + i * width);
    batch_labels_[i] = train_->labels[example];
  }
  return {batch_features_.data(), batch_labels_.data(), batch};
}

namespace {

bool MapChangeMayCure(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kAborted:
      return true;
    default:
      return false;
  }
}

}  // namespace

absl::Status Trainer::Recover(const absl::Status& failure, int64_t* step,
                              std::optional<absl::Time>* give_up_at) {
  if (!MapChangeMayCure(failure)) return failure;
  const absl::Time now = absl::Now();
  if (!give_up_at->has_value()) {
    *give_up_at = now + options_.recovery_timeout;
    // A pull that timed out is usually just waiting for slower workers.
    if (failure.code() != absl::StatusCode::kDeadlineExceeded) {
      spdlog::warn("step {}: {}; waiting for the cluster to recover", *step, failure.ToString());
    }
  } else if (now > **give_up_at) {
    return absl::Status(
        failure.code(),
        absl::StrCat("gave up after ", absl::FormatDuration(options_.recovery_timeout),
                     " of recovery at step ", *step, ": ", failure.message()));
  }
  absl::SleepFor(absl::Milliseconds(50));
  absl::StatusOr<ShardMapUpdate> update = ps_->RefreshShardMap();
  if (!update.ok())
    return absl::OkStatus();  // the scheduler may be restarting: retry until give_up_at
  if (!update->self_active) {
    return absl::FailedPreconditionError(
        "the scheduler declared this worker dead (it was silent too long); "
        "restart it to rejoin");
  }
  if (!update->epoch_changed) return absl::OkStatus();
  recovering_ = true;
  if (update->rewind_to.has_value()) {
    spdlog::warn("epoch {}: the servers rolled back to step {}; rewinding from step {}",
                 update->epoch, *update->rewind_to, *step);
    *step = *update->rewind_to;
    last_pushed_step_ = -1;
    return absl::OkStatus();
  }
  spdlog::info("epoch {}: the shard map changed; continuing at step {}", update->epoch, *step);
  if (last_pushed_step_ >= 0) {
    // A moved shard's new owner may lack our last push; the others ignore the repeat.
    absl::Status repushed = ps_->PushAll(last_pushed_step_, last_pushed_gradient_);
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
      pending_rewind_ = rewound;
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
  absl::Time last_log = start;
  int64_t steps_since_log = 0;
  double loss_since_log = 0;
  TrainingSummary summary;
  std::vector<int64_t> order;
  int order_epoch = -1;
  std::optional<absl::Time> give_up_at;
  // The step whose values params_ already holds (from the previous push's reply); -1:
  // none. Any detour (failure, rewind, evaluation trouble) clears it.
  int64_t prefetched_step = -1;
  // async overlap: the step whose gradient next_gradient_ holds, computed while the
  // previous push was in flight, and its loss; -1: none. Cleared like prefetched_step.
  int64_t precomputed_step = -1;
  float precomputed_loss = 0;
  const bool overlap = options_.training.overlap && options_.training.mode == TrainingMode::kAsync;
  // The push leaves bucket by bucket during backpropagation (push_bucket_kb).
  const bool stream_push = options_.training.push_bucket_kb > 0 && !overlap;
  int64_t step = options_.start_step;
  while (step < total_steps_) {
    if (stop_requested_.load()) return absl::CancelledError(absl::StrCat("stopped at step ", step));
    const int epoch = static_cast<int>(step / steps_per_epoch_);
    const int64_t position = step % steps_per_epoch_;
    if (epoch != order_epoch) {
      order = EpochExampleOrder(range, epoch, options_.training.seed, options_.training.shuffle);
      order_epoch = epoch;
    }
    if (prefetched_step != step) prefetched_step = -1;  // rewound or recovering: pull afresh
    if (precomputed_step != step) precomputed_step = -1;
    absl::Status status = absl::OkStatus();
    float loss = unacknowledged_loss_;
    // The push that started during this step's backpropagation (stream_push), bringing
    // step + 1's values into incoming_params_.
    std::unique_ptr<StreamedPush> streamed;
    if (precomputed_step == step) {
      gradient_.swap(next_gradient_);  // computed while the previous push was in flight
      loss = precomputed_loss;
      precomputed_step = -1;
    } else if (unacknowledged_step_ != step) {
      // A push that failed is re-sent as it was: pulling again could return values some
      // shards already updated with it, and a gradient computed on those would differ.
      const absl::Time pull_start = absl::Now();
      // The previous push usually brought this step's values back with it.
      if (prefetched_step != step) status = ps_->PullAll(step, absl::MakeSpan(params_));
      summary.pull_seconds += absl::ToDoubleSeconds(absl::Now() - pull_start);
      if (status.ok()) {
        const absl::Time compute_start = absl::Now();
        const BatchView batch = GatherBatch(order, position);
        absl::StatusOr<float> computed;
        if (stream_push) {
          streamed = ps_->StartStreamedPush(
              step, gradient_,
              step + 1 < total_steps_ ? absl::MakeSpan(incoming_params_) : absl::Span<float>());
          computed =
              backend_->ComputeGradientsStreamed(params_, batch, absl::MakeSpan(gradient_),
                                                 [&](int64_t from) { streamed->Ready(from); });
        } else {
          computed = backend_->ComputeGradients(params_, batch, absl::MakeSpan(gradient_));
        }
        if (computed.ok()) loss = *computed;
        if (!computed.ok() || !std::isfinite(loss) || !AllFinite(gradient_)) {
          // The job ends here, so what already left is moot (a non-finite part is
          // refused by its servers). Dropping the push sends nothing more and waits
          // until gRPC let go of gradient_.
          streamed.reset();
          if (!computed.ok()) return computed.status();
          return absl::FailedPreconditionError(
              absl::StrCat("training diverged at step ", step, ": loss ", loss,
                           "; lower training.optimizer.learning_rate"));
        }
        summary.compute_seconds += absl::ToDoubleSeconds(absl::Now() - compute_start);
      }
    }
    if (status.ok()) {
      absl::Time push_start = absl::Now();
      if (streamed != nullptr) {
        absl::StatusOr<bool> pulled_next = streamed->Finish();
        summary.early_push_buckets += streamed->early_buckets();
        streamed.reset();
        status = pulled_next.status();
        if (pulled_next.ok() && *pulled_next) {
          params_.swap(incoming_params_);
          prefetched_step = step + 1;
        }
      } else if (overlap && step + 1 < total_steps_ && position + 1 < steps_per_epoch_) {
        // The push (bringing step + 1's values into incoming_params_) runs on a helper
        // thread while this one computes step + 1's gradient on the values step used.
        // Only the helper touches ps_ meanwhile, and only this thread the backend.
        std::future<absl::StatusOr<bool>> pushed = std::async(std::launch::async, [&] {
          return ps_->PushAllAndPullNext(step, gradient_, absl::MakeSpan(incoming_params_));
        });
        const absl::Time compute_start = absl::Now();
        const BatchView next_batch = GatherBatch(order, position + 1);
        absl::StatusOr<float> next_loss =
            backend_->ComputeGradients(params_, next_batch, absl::MakeSpan(next_gradient_));
        const absl::Duration compute_time = absl::Now() - compute_start;
        summary.compute_seconds += absl::ToDoubleSeconds(compute_time);
        absl::StatusOr<bool> pulled_next = pushed.get();
        status = pulled_next.status();
        push_start += compute_time;  // the push's share is the wait after computing
        if (pulled_next.ok() && *pulled_next) {
          params_.swap(incoming_params_);
          prefetched_step = step + 1;
          // A gradient that is not finite is computed again the ordinary way, which
          // reports the divergence.
          if (next_loss.ok() && std::isfinite(*next_loss) && AllFinite(next_gradient_)) {
            precomputed_step = step + 1;
            precomputed_loss = *next_loss;
          }
        }
      } else if (step + 1 < total_steps_) {
        absl::StatusOr<bool> pulled_next =
            ps_->PushAllAndPullNext(step, gradient_, absl::MakeSpan(params_));
        status = pulled_next.status();
        if (pulled_next.ok() && *pulled_next) prefetched_step = step + 1;
      } else {
        status = ps_->PushAll(step, gradient_);
      }
      summary.push_seconds += absl::ToDoubleSeconds(absl::Now() - push_start);
      if (!status.ok()) {
        unacknowledged_step_ = step;
        unacknowledged_loss_ = loss;
      }
    }
    if (!status.ok()) {
      prefetched_step = -1;
      precomputed_step = -1;
      PS_RETURN_IF_ERROR(Recover(status, &step, &give_up_at));
      if (step != unacknowledged_step_) unacknowledged_step_ = -1;  // rewound
      continue;
    }
    unacknowledged_step_ = -1;
    if (give_up_at.has_value()) {
      if (recovering_) spdlog::info("step {} completed: recovered", step);
      give_up_at.reset();
      recovering_ = false;
    }
    last_pushed_step_ = step;
    // A swap, not a copy: the next ComputeGradients overwrites all of gradient_.
    last_pushed_gradient_.swap(gradient_);
    summary.steps = step + 1;
    ++summary.steps_run;
    summary.samples += options_.training.batch_size;  // every batch is full (GatherBatch)
    summary.last_loss = loss;
    ++steps_since_log;
    loss_since_log += loss;
    const absl::Time now = absl::Now();
    const double samples_per_sec =
        summary.samples / std::max(1e-9, absl::ToDoubleSeconds(now - start));
    {
      absl::MutexLock lock(&mu_);
      progress_.set_step(step + 1);
      progress_.set_epoch(epoch);
      progress_.set_loss(loss);
      progress_.set_samples_per_sec(samples_per_sec);
    }
    if (now - last_log >= options_.progress_log_interval || step + 1 == total_steps_) {
      spdlog::info("epoch {} step {}/{} loss {:.4f} samples/s {:.0f}", epoch, step + 1,
                   total_steps_, loss_since_log / steps_since_log, samples_per_sec);
      if (options_.on_scalar) {
        options_.on_scalar("loss", step + 1, loss_since_log / steps_since_log);
        options_.on_scalar("samples_per_sec", step + 1, samples_per_sec);
      }
      last_log = now;
      steps_since_log = 0;
      loss_since_log = 0;
    }
    const bool epoch_done = position + 1 == steps_per_epoch_;
    if (options_.evaluate_each_epoch && epoch_done && step + 1 < total_steps_) {
      absl::StatusOr<double> accuracy = Evaluate(step + 1, nullptr);
      if (accuracy.ok()) {
        spdlog::info("epoch {} test_accuracy={:.4f}", epoch, *accuracy);
        if (options_.on_scalar) options_.on_scalar("test_accuracy", step + 1, *accuracy);
        absl::MutexLock lock(&mu_);
        progress_.set_test_accuracy(*accuracy);
        progress_.set_accuracy_step(step + 1);
      } else if (pending_rewind_.has_value()) {
        spdlog::warn("epoch {} evaluation skipped: {}", epoch, accuracy.status().ToString());
        prefetched_step = -1;
        precomputed_step = -1;
        step = *pending_rewind_;
        pending_rewind_.reset();
        continue;
      } else {
        return accuracy.status();
      }
    }
    ++step;
  }
  summary.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return summary;
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

NodeProgress Trainer::progress() const {
  absl::MutexLock lock(&mu_);
  return progress_;
}

}  // namespace paramserver
