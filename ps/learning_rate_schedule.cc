#include "ps/learning_rate_schedule.h"

#include <algorithm>
#include <cmath>

namespace paramserver {

double ScheduledLearningRate(const DenseOptimizerOptions& options, int64_t step) {
  const LrSchedule& schedule = options.lr_schedule;
  const double base = options.learning_rate;
  const int64_t before = std::max<int64_t>(0, step - 1);  // the scheduler's last_epoch
  const int64_t warmup = schedule.warmup_steps;
  if (before < warmup) {
    const double start = schedule.warmup_start_factor;
    return base * (start + (1.0 - start) * static_cast<double>(before) / warmup);
  }
  const int64_t e = before - warmup;  // the decay's own last_epoch
  const double span = static_cast<double>(schedule.total_steps - warmup);
  const double done = std::min(static_cast<double>(e), span);  // cosine, linear, polynomial
  switch (schedule.decay) {
    case LrDecay::kConstant:
      return base;
    case LrDecay::kStep:
      return base * std::pow(schedule.gamma, static_cast<double>(e / schedule.step_size));
    case LrDecay::kMultiStep: {
      const auto passed =
          std::upper_bound(schedule.milestones.begin(), schedule.milestones.end(), e) -
          schedule.milestones.begin();
      return base * std::pow(schedule.gamma, static_cast<double>(passed));
    }
    case LrDecay::kExponential:
      return base * std::pow(schedule.gamma, static_cast<double>(e));
    case LrDecay::kCosine: {
      const double floor = schedule.min_learning_rate;
      return floor + (base - floor) * (1 + std::cos(M_PI * done / span)) / 2;
    }
    case LrDecay::kLinear:
      return base * (1.0 + (schedule.end_factor - 1.0) * done / span);
    case LrDecay::kPolynomial:
      return base * std::pow(1.0 - done / span, schedule.power);
  }
  return base;
}

}  // namespace paramserver
