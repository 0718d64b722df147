// ParameterShard's clipped sync steps (PushRequest.clip_grad_norm): a step held once its
// pushes are in, its sum of squares told to the workers, and applied with the global
// coefficient they bring.
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "ps/parameter_shard.h"

namespace paramserver {
absl::Status ParameterShard::AdmitClipLocked(const ShardPush& push) {
  const double clip = push.clip_grad_norm;
  const auto refuse = [&](const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++counters_.rejected_pushes;
    return absl::InvalidArgumentError(absl::StrCat("shard ", options_.shard_id, ": worker ",
                                                   push.worker_rank, "'s push for step ", push.step,
                                                   " ", why));
  };
  if (clip == 0) {
    if (options_.mode != TrainingMode::kSync || step_clip_rank_ < 0 || step_clip_ == 0)
      return absl::OkStatus();
  } else if (!std::isfinite(clip) || clip < 0) {
    return refuse(absl::StrCat("clips to a norm of ", clip, ": it must be finite and > 0"));
  } else if (options_.mode != TrainingMode::kSync || embedding_ != nullptr) {
    return refuse(
        "asks for clipping of the step's mean gradient: only a sync job's dense shards hold "
        "a step for that (in async and ssp modes the worker clips its own push)");
  } else if (options_.backup_workers > 0) {
    return refuse(
        "asks for clipping of the step's mean gradient, which training.sync.backup_workers "
        "rules out: one global norm needs the same workers' pushes on every shard");
  }
  if (step_clip_rank_ < 0 || step_clip_ == clip) return absl::OkStatus();  // both finite
  ++counters_.rejected_pushes;
  absl::Status conflict = absl::InvalidArgumentError(absl::StrCat(
      "shard ", options_.shard_id, ", sync step ", push.step, ": workers ", step_clip_rank_,
      " and ", push.worker_rank, " pushed it with different clip_grad_norm (", step_clip_, " and ",
      clip, "): every worker must clip a sync step alike; the step is not applied"));
  step_conflict_ = conflict;
  return conflict;
}

namespace {

// Calls visit(i) for each element of a shard's `size` that trains a parameter: all of
// them without segments, else those of the segments that are not buffers.
template <typename Visit>
void ForEachTrainedElement(const std::vector<OptimizerSegment>& segments, size_t size,
                           Visit visit) {
  if (segments.empty()) {
    for (size_t i = 0; i < size; ++i) visit(i);
    return;
  }
  for (const OptimizerSegment& run : segments) {
    if (run.is_buffer()) continue;
    for (size_t i = static_cast<size_t>(run.begin); i < static_cast<size_t>(run.end); ++i) visit(i);
  }
}

}  // namespace

double ParameterShard::TrainedSumOfSquares(absl::Span<const float> gradient) const {
  double sum = 0;
  ForEachTrainedElement(options_.optimizer_segments, gradient.size(),
                        [&](size_t i) { sum += static_cast<double>(gradient[i]) * gradient[i]; });
  return sum;
}

void ParameterShard::ScaleTrained(float coefficient, std::vector<float>* gradient) const {
  ForEachTrainedElement(options_.optimizer_segments, gradient->size(),
                        [&](size_t i) { (*gradient)[i] *= coefficient; });
}

void ParameterShard::HoldClippedStepLocked(const std::vector<int>& contributors) {
  MeanOfStepLocked(contributors, &held_rows_, &held_mean_);
  held_sum_squares_ = TrainedSumOfSquares(held_mean_);
  held_ = true;
}

absl::StatusOr<double> ParameterShard::AwaitStepSumSquares(int64_t step, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto ready = [this, step]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || applied_updates_ > step || (held_ && applied_updates_ == step) ||
           step_conflict_.has_value();
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
    return absl::DeadlineExceededError(DescribeWait(step + 1));
  }
  if (closed_) return ClosedError();
  if (held_ && applied_updates_ == step) return held_sum_squares_;
  if (applied_updates_ > step) {
    if (const ClippedStep* ended = RememberedStepLocked(step)) return ended->sum_squares;
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", options_.shard_id, ": step ", step, " was applied here before the ",
                     kRememberedSyncSteps, " steps it remembers (or before it was restored from a ",
                     "checkpoint): its sum of squares is not known here"));
  }
  return *step_conflict_;
}

absl::StatusOr<PushOutcome> ParameterShard::ApplyClippedStep(int64_t step, float coefficient) {
  absl::MutexLock lock(&mu_);
  PushOutcome outcome;
  outcome.applied_updates = applied_updates_;
  outcome.log_index = log_.index();
  if (!(coefficient > 0 && coefficient <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", options_.shard_id, ": step ", step,
                                                   "'s clip coefficient ", coefficient,
                                                   " is not in (0, 1]"));
  }
  if (closed_) return ClosedError();
  if (applied_updates_ > step) {
    const ClippedStep* ended = RememberedStepLocked(step);
    if (ended != nullptr && ended->coefficient != 0 && ended->coefficient != coefficient) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard ", options_.shard_id, ": step ", step, " was clipped by ",
                       ended->coefficient, ", not ", coefficient,
                       ": every worker must gather the same norm (a server reported two sums)"));
    }
    outcome.duplicate = true;
    return outcome;
  }
  if (!held_ || applied_updates_ != step) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", options_.shard_id, ": step ", step,
                     " is not held for clipping here: not every worker's push of it is in (",
                     DescribeWait(step + 1), ")"));
  }
  ShardMutation entry;
  entry.kind = ShardMutation::Kind::kSyncStep;
  entry.gradient = std::move(held_mean_);
  ScaleTrained(coefficient, &entry.gradient);
  absl::Status applied = ApplyUpdate(held_rows_.view(), step_settings_, entry.gradient, &outcome);
  gate_.EndStep();
  entry.settings = std::move(step_settings_);
  entry.step = step;
  entry.rows = std::move(held_rows_).TakeRows();
  entry.step_sum_squares = held_sum_squares_;
  entry.clip_coefficient = coefficient;
  RememberStepLocked(ClippedStep{step, held_sum_squares_, coefficient});
  EndSyncStepLocked();
  held_mean_.clear();
  held_rows_ = CheckedRowIds();
  RecordLocked(std::move(entry), &outcome);
  PS_RETURN_IF_ERROR(applied);
  return outcome;
}

void ParameterShard::RememberStepLocked(const ClippedStep& ended) {
  recent_steps_.push_back(ended);
  while (recent_steps_.size() > kRememberedSyncSteps) recent_steps_.pop_front();
}

const ClippedStep* ParameterShard::RememberedStepLocked(int64_t step) const {
  for (const ClippedStep& ended : recent_steps_) {
    if (ended.step == step) return &ended;
  }
  return nullptr;
}

}  // namespace paramserver
