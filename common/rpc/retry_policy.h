// The one retry policy every client uses: which errors are worth another attempt, and
// how long to wait between attempts (exponential backoff, bounded, until a deadline).
#ifndef PARAMSERVER_COMMON_RPC_RETRY_POLICY_H_
#define PARAMSERVER_COMMON_RPC_RETRY_POLICY_H_

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace paramserver {

// The waits between attempts: `initial`, then `multiplier` times the previous one, at
// most `max`. initial == max gives a fixed interval.
struct BackoffPolicy {
  absl::Duration initial = absl::Milliseconds(20);
  absl::Duration max = absl::Seconds(1);
  double multiplier = 2.0;
};

// Whether an RPC that failed with `code` may be tried again: UNAVAILABLE (the peer is
// down, restarting or busy) always; DEADLINE_EXCEEDED only when `deadline_exceeded_too`
// (the call is idempotent, or the server deduplicates it).
bool IsRetryable(absl::StatusCode code, bool deadline_exceeded_too);

// One retry loop's waits. Not thread-safe; one per loop (or per retried thing).
class ExponentialBackoff {
 public:
  explicit ExponentialBackoff(BackoffPolicy policy) : policy_(policy), next_(policy.initial) {}

  // The wait before the next attempt, and advances to the one after it.
  absl::Duration NextDelay();
  // The wait NextDelay() would return, without advancing.
  absl::Duration PeekDelay() const { return next_; }
  // Whether an attempt after the next wait would still start before `give_up`.
  bool CanRetryBefore(absl::Time give_up) const { return absl::Now() + next_ < give_up; }
  // Sleeps NextDelay(). The caller checked CanRetryBefore, so this ends before its deadline.
  void Wait();
  // Back to `initial` (after a success).
  void Reset() { next_ = policy_.initial; }

 private:
  BackoffPolicy policy_;
  absl::Duration next_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_RPC_RETRY_POLICY_H_
