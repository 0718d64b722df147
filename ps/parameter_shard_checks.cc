// ParameterShard's checks of what a push carries: who sends it, its gradient's values and
// its optimizer settings.
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "ps/parameter_shard.h"
#include "spdlog/spdlog.h"

namespace paramserver {

absl::Status ParameterShard::CheckPushMayProceedLocked(int worker_rank, int64_t step,
                                                       bool from_primary_log) {
  if (absl::Status s = gate_.CheckWorker(worker_rank); !s.ok()) {
    ++counters_.rejected_pushes;
    return s;
  }
  if (closed_ && !from_primary_log) return ClosedError();
  if (awaiting_initial_values_) {
    ++counters_.rejected_pushes;
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", options_.shard_id, " has no values yet to apply a gradient to (job.register)"));
  }
  if (absl::Status s = gate_.CheckMayPush(worker_rank, step); !s.ok()) {
    ++counters_.rejected_pushes;
    return s;
  }
  return absl::OkStatus();
}

absl::Status ParameterShard::RefuseValuesLocked(GradientRefusal reason, int64_t* counter,
                                                std::string message) {
  ++counters_.rejected_pushes;
  ++*counter;
  if (options_.refusals != nullptr) options_.refusals->Count(reason);
  // Logged at the 1st, 2nd, 4th, 8th... refusal of a kind: a member pushing bad values
  // in a loop cannot flood the log (the service's refusal log and metrics count all).
  if ((*counter & (*counter - 1)) == 0)
    spdlog::warn("refused a push: {} ({} so far on this shard)", message, *counter);
  return absl::InvalidArgumentError(std::move(message));
}

absl::Status ParameterShard::CheckGradientValuesLocked(int worker_rank, int64_t step,
                                                       RowIdsView rows,
                                                       absl::Span<const float> gradient,
                                                       const StepHyperparameters& settings,
                                                       bool against_state) {
  // "shard 3: gradient[i] of worker 1 for step 7 is <value>", an embedding shard's
  // element also as its table's row and place in it.
  const auto element = [&](size_t i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return absl::StrCat("shard ", options_.shard_id, ": gradient[", i, "]",
                        storage_->DescribeElement(rows, i), " of worker ", worker_rank,
                        " for step ", step, " is ", gradient[i]);
  };
  if (against_state) {
    const size_t i = storage_->FirstUnsafeElement(NextUpdateLocked(), rows, settings, gradient);
    if (i >= gradient.size()) return absl::OkStatus();
    return RefuseValuesLocked(
        GradientRefusal::kOverflow, &counters_.rejected_overflow,
        absl::StrCat(element(i),
                     ": applied now, it would take the optimizer's state (its square, a moment, "
                     "a sum of squares or the parameter) out of float32's range"));
  }
  if (const size_t i = FirstNonFinite(gradient); i < gradient.size()) {
    return RefuseValuesLocked(GradientRefusal::kNonFinite, &counters_.rejected_nonfinite,
                              absl::StrCat(element(i), "; only finite values are accepted"));
  }
  if (options_.max_gradient_norm > 0) {
    // In double: a sum of float squares cannot overflow it.
    const double norm = std::sqrt(TrainedSumOfSquares(gradient));
    if (norm > options_.max_gradient_norm) {
      return RefuseValuesLocked(
          GradientRefusal::kNorm, &counters_.rejected_norm,
          absl::StrCat("shard ", options_.shard_id, ": the gradient of worker ", worker_rank,
                       " for step ", step, " has an L2 norm of ", norm, " over this shard's ",
                       gradient.size(), " elements, above training.max_gradient_norm ",
                       options_.max_gradient_norm, " (a bound on each shard's part)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParameterShard::AdmitSettingsLocked(const ShardPush& push) {
  if (absl::Status prepared = storage_->PrepareFor(push.settings); !prepared.ok()) {
    ++counters_.rejected_pushes;
    return absl::InvalidArgumentError(absl::StrCat("shard ", options_.shard_id, ": worker ",
                                                   push.worker_rank, "'s push for step ", push.step,
                                                   ": ", prepared.message()));
  }
  if (options_.mode != TrainingMode::kSync || step_settings_rank_ < 0) return absl::OkStatus();
  const std::string difference = DescribeHyperparameterDifference(step_settings_, push.settings);
  if (difference.empty()) return absl::OkStatus();
  ++counters_.rejected_pushes;
  absl::Status conflict = absl::InvalidArgumentError(absl::StrCat(
      "shard ", options_.shard_id, ", sync step ", push.step, ": workers ", step_settings_rank_,
      " and ", push.worker_rank, " pushed it with different optimizer settings (", difference,
      "): in sync mode every worker's optimizer must hold the same param_groups settings at "
      "each step; the step is not applied"));
  spdlog::warn("refused a push: {}", std::string(conflict.message()));
  step_conflict_ = conflict;
  return conflict;
}

}  // namespace paramserver
