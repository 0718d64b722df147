#include "worker/script_training_loop.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "spdlog/spdlog.h"
#include "worker/gradient_clipping.h"
#include "worker/recovery.h"

namespace paramserver {

ScriptTrainingLoop::ScriptTrainingLoop(ScriptTrainingOptions options, PsClient* ps)
    : options_(std::move(options)),
      ps_(ps),
      recorder_(options_.start_step, options_.training.max_steps, options_.training.batch_size,
                options_.progress_log_interval, options_.on_scalar),
      step_(options_.start_step) {
  summary_.steps = options_.start_step;
}

absl::Status ScriptTrainingLoop::WithRecovery(
    const std::function<absl::Status(const RecoveryNews&)>& call) {
  std::optional<absl::Time> give_up_at;
  RecoveryNews news;
  bool recovering = false;
  while (true) {
    if (stop_requested_.load()) {
      return absl::CancelledError(absl::StrCat("stopped at step ", step_.load()));
    }
    const absl::Status status = call(news);
    if (status.ok()) {
      if (recovering) spdlog::info("step {}: recovered", step_.load());
      return status;
    }
    PS_ASSIGN_OR_RETURN(
        const ShardMapUpdate update,
        WaitForRecovery(ps_, status, step_.load(), options_.recovery_timeout, &give_up_at));
    recovering = true;
    news.map_changed = update.epoch_changed || update.rejoined;
    if (update.rewind_to.has_value()) {
      step_.store(*update.rewind_to);
      news.rewound = true;
      lease_void_.store(true);
    }
  }
}

absl::Status ScriptTrainingLoop::PullCurrent(absl::Span<float> params) {
  return WithRecovery([&](const RecoveryNews&) { return ps_->Pull({step_.load(), {params}}); });
}

absl::Status ScriptTrainingLoop::PullRows(const std::vector<std::vector<int64_t>>& ids,
                                          std::vector<std::vector<float>>* rows) {
  // The dense values come along (one call per server); they are the present step's,
  // which the script already holds.
  std::vector<float> dense(options_.total_parameters);
  rows->resize(ids.size());
  return WithRecovery([&](const RecoveryNews&) {
    return ps_->Pull({step_.load(), {absl::MakeSpan(dense), ids, absl::MakeSpan(*rows)}});
  });
}

absl::Status ScriptTrainingLoop::Step(absl::Span<const float> gradient,
                                      std::vector<TableStep> tables, absl::Span<float> params,
                                      double loss, int64_t samples,
                                      const StepHyperparameters* settings, bool skip,
                                      double clip_grad_norm) {
  {
    absl::MutexLock lock(&mu_);
    if (ended_) return absl::CancelledError("training has ended (job.finish was called)");
  }
  if (gradient.size() != static_cast<size_t>(options_.total_parameters) ||
      params.size() != static_cast<size_t>(options_.total_parameters)) {
    return absl::InvalidArgumentError(absl::StrCat("a step of ", gradient.size(),
                                                   " gradient values for a model of ",
                                                   options_.total_parameters, " parameters"));
  }
  if (lease_.has_value() && lease_void_.load()) {
    // The batch is of a lease the scheduler took back (this worker was declared dead, and
    // admitted again, since it was handed out): not pushed. `params` gets the present
    // values; the next job.batches() asks for a new lease.
    return WithRecovery([&](const RecoveryNews&) { return ps_->Pull({step_.load(), {params}}); });
  }
  if (start_ == absl::InfiniteFuture()) start_ = absl::Now();
  std::vector<std::vector<int64_t>> ids(options_.embedding_tables);
  std::vector<std::vector<float>> row_gradients(options_.embedding_tables);
  for (size_t t = 0; !skip && t < tables.size() && t < ids.size(); ++t) {
    ids[t] = std::move(tables[t].ids);
    row_gradients[t] = std::move(tables[t].row_gradients);
  }
  // The next step's rows are read by the script's next forward pass: none come back with
  // the push (an empty list per table), only the dense values.
  const std::vector<std::vector<int64_t>> no_rows(options_.embedding_tables);
  std::vector<std::vector<float>> unused_rows(options_.embedding_tables);
  const int64_t pushed_step = step_.load();
  // Pushed, then pulled; a map change re-sends the push (a moved shard's new owner may
  // lack it; the others take it as the repeat it is), a rollback drops it.
  bool pushed = false;
  bool rewound = false;
  bool pulled = false;
  const bool clipped = clip_grad_norm > 0 && !skip;
  double sum_squares = 0;  // clipped: every dense shard's, of the step's mean gradient
  const absl::Status done = WithRecovery([&](const RecoveryNews& news) -> absl::Status {
    rewound = news.rewound;
    if (rewound) {
      // The servers rolled back past this push: it is not sent again.
      return ps_->Pull({step_.load(), {params}});
    }
    if (news.map_changed) pushed = false;
    if (clipped) {  // the push holds the step; the pull brings its coefficient
      if (!pushed) {
        PS_RETURN_IF_ERROR(ps_->Push({pushed_step, gradient, ids, row_gradients, std::nullopt,
                                      settings, false, clip_grad_norm, &sum_squares})
                               .status());
        pushed = true;
      }
      PS_ASSIGN_OR_RETURN(const float coefficient,
                          StepClipCoefficient(pushed_step, clip_grad_norm, sum_squares));
      return ps_->Pull({pushed_step + 1, {params}, coefficient});
    }
    if (!pushed) {
      PS_ASSIGN_OR_RETURN(pulled,
                          ps_->Push({pushed_step, gradient, ids, row_gradients,
                                     StepValues{params, no_rows, absl::MakeSpan(unused_rows)},
                                     skip ? nullptr : settings, skip}));
      pushed = true;
      if (pulled) return absl::OkStatus();
    }
    return ps_->Pull({pushed_step + 1, {params}});
  });
  if (!done.ok()) return done;
  if (rewound) {
    spdlog::warn(
        "the job goes on at step {} (the servers rolled back, or this worker was admitted "
        "again after being declared dead): the step-{} push was dropped; the script's next "
        "batch trains step {}",
        step_.load(), pushed_step, step_.load());
    return absl::OkStatus();
  }
  // With backup workers, a push every shard dropped as late trained nothing, and the
  // script goes on at the servers' step once every shard is past the next one.
  const PushAcknowledgement acknowledged = ps_->last_push();
  const bool backups = options_.training.backup_workers > 0 && acknowledged.shards > 0;
  if (backups && acknowledged.late_everywhere()) samples = 0;
  step_.store(backups ? std::max(pushed_step + 1, acknowledged.least_shard_step) : pushed_step + 1);
  if (lease_.has_value() && !lease_void_.load() &&
      pushed_step == lease_->lease.first_step() + batches_handed_ - 1) {
    // The push of the batch job.batches() handed out last is acknowledged.
    const int64_t size = static_cast<int64_t>(lease_->examples.size()) / lease_->batches;
    NoteTrainedBatch(lease_->lease.epoch(), lease_->examples.data() + (batches_handed_ - 1) * size,
                     size);
  }
  last_step_end_ = absl::Now();
  recorder_.Record(pushed_step, /*epoch=*/0, std::isnan(loss) ? 0.0f : static_cast<float>(loss),
                   start_, &summary_, samples);
  return absl::OkStatus();
}

void ScriptTrainingLoop::EndTraining(std::optional<double> test_accuracy) {
  absl::MutexLock lock(&mu_);
  ended_ = true;
  test_accuracy_ = test_accuracy;
}

std::optional<double> ScriptTrainingLoop::test_accuracy() const {
  absl::MutexLock lock(&mu_);
  return test_accuracy_;
}

absl::StatusOr<TrainingSummary> ScriptTrainingLoop::Run() {
  if (stop_requested_.load()) {
    return absl::CancelledError(absl::StrCat("stopped at step ", step_.load()));
  }
  {
    absl::MutexLock lock(&mu_);
    if (!ended_) return absl::CancelledError("the script has not finished training");
  }
  TrainingSummary summary = summary_;
  summary.steps = step_.load();
  // Training time: the first step to the last (the script's own evaluation after it
  // is not training).
  if (last_step_end_ > start_) summary.seconds = absl::ToDoubleSeconds(last_step_end_ - start_);
  return summary;
}

absl::StatusOr<std::optional<std::vector<int64_t>>> ScriptTrainingLoop::NextLeasedBatch(
    int64_t example_count, int batch_size) {
  if (!options_.lease_data) {
    return absl::FailedPreconditionError("this worker was started without the scheduler's leases");
  }
  if (leaser_ == nullptr) {
    leaser_ = std::make_unique<DataLeaser>(options_.lease_data, example_count, batch_size,
                                           options_.training.seed, options_.training.shuffle);
    leased_examples_ = example_count;
    leased_batch_size_ = batch_size;
  } else if (example_count != leased_examples_ || batch_size != leased_batch_size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("job.batches(", example_count, ", ", batch_size, ") after job.batches(",
                     leased_examples_, ", ", leased_batch_size_, "): one job trains one data set"));
  }
  if (lease_.has_value() && lease_void_.load()) {
    spdlog::warn("lease {} was taken back (this worker was declared dead): asking for another",
                 lease_->lease.lease_id());
    lease_.reset();
  }
  if (lease_.has_value()) {
    const int64_t expected = lease_->lease.first_step() + batches_handed_;
    if (step_.load() != expected) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job.batches: each batch is trained by exactly one job.step() before the next is "
          "taken; the batch of step ",
          expected - 1, " was followed by ", step_.load() - (expected - 1), " step(s)"));
    }
    if (batches_handed_ == lease_->batches) lease_.reset();
  }
  if (!lease_.has_value()) {
    // A refusal because this worker was declared dead is ridden out as a refused push
    // is: re-admitted, it asks again from the job's step.
    PS_RETURN_IF_ERROR(WithRecovery([&](const RecoveryNews&) -> absl::Status {
      lease_void_.store(false);
      PS_ASSIGN_OR_RETURN(lease_,
                          leaser_->Next(step_.load(), &stop_requested_, options_.recovery_timeout));
      return absl::OkStatus();
    }));
    if (!lease_.has_value()) return std::nullopt;  // every epoch is trained
    batches_handed_ = 0;
    if (lease_->lease.first_step() > step_.load()) step_.store(lease_->lease.first_step());
  }
  const int64_t size = static_cast<int64_t>(lease_->examples.size()) / lease_->batches;
  std::vector<int64_t> batch(lease_->examples.begin() + batches_handed_ * size,
                             lease_->examples.begin() + (batches_handed_ + 1) * size);
  ++batches_handed_;
  return batch;
}

}  // namespace paramserver
