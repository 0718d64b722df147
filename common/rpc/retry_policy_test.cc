#include "common/rpc/retry_policy.h"

#include "absl/time/clock.h"
#include "catch2/catch.hpp"

namespace paramserver {
namespace {

TEST_CASE("the backoff doubles from its initial wait up to its bound, and resets") {
  ExponentialBackoff backoff({absl::Milliseconds(10), absl::Milliseconds(50), 2.0});
  CHECK(backoff.PeekDelay() == absl::Milliseconds(10));
  CHECK(backoff.NextDelay() == absl::Milliseconds(10));
  CHECK(backoff.NextDelay() == absl::Milliseconds(20));
  CHECK(backoff.NextDelay() == absl::Milliseconds(40));
  CHECK(backoff.NextDelay() == absl::Milliseconds(50));
  CHECK(backoff.NextDelay() == absl::Milliseconds(50));
  backoff.Reset();
  CHECK(backoff.NextDelay() == absl::Milliseconds(10));
}

TEST_CASE("a fixed interval is a backoff whose bound is its start") {
  ExponentialBackoff backoff({absl::Milliseconds(200), absl::Milliseconds(200), 2.0});
  for (int i = 0; i < 4; ++i) CHECK(backoff.NextDelay() == absl::Milliseconds(200));
}

TEST_CASE("a retry is allowed only if it would start before the deadline") {
  ExponentialBackoff backoff({absl::Seconds(1), absl::Seconds(1), 2.0});
  CHECK(backoff.CanRetryBefore(absl::Now() + absl::Seconds(5)));
  CHECK_FALSE(backoff.CanRetryBefore(absl::Now() + absl::Milliseconds(500)));
  const absl::Time before = absl::Now();
  ExponentialBackoff short_wait({absl::Milliseconds(5), absl::Milliseconds(5), 2.0});
  short_wait.Wait();
  CHECK(absl::Now() - before >= absl::Milliseconds(5));
}

TEST_CASE("only UNAVAILABLE, and DEADLINE_EXCEEDED when asked, are retried") {
  CHECK(IsRetryable(absl::StatusCode::kUnavailable, false));
  CHECK_FALSE(IsRetryable(absl::StatusCode::kDeadlineExceeded, false));
  CHECK(IsRetryable(absl::StatusCode::kDeadlineExceeded, true));
  for (absl::StatusCode code :
       {absl::StatusCode::kInvalidArgument, absl::StatusCode::kFailedPrecondition,
        absl::StatusCode::kPermissionDenied, absl::StatusCode::kUnauthenticated,
        absl::StatusCode::kAborted, absl::StatusCode::kInternal}) {
    CHECK_FALSE(IsRetryable(code, true));
  }
}

}  // namespace
}  // namespace paramserver
