#include "common/rpc/retry_policy.h"

#include <algorithm>

#include "absl/time/clock.h"

namespace paramserver {

bool IsRetryable(absl::StatusCode code, bool deadline_exceeded_too) {
  return code == absl::StatusCode::kUnavailable ||
         (deadline_exceeded_too && code == absl::StatusCode::kDeadlineExceeded);
}

absl::Duration ExponentialBackoff::NextDelay() {
  const absl::Duration delay = next_;
  next_ = std::min(next_ * policy_.multiplier, policy_.max);
  return delay;
}

void ExponentialBackoff::Wait() { absl::SleepFor(NextDelay()); }

}  // namespace paramserver
