#include "common/rpc/progress_watchdog.h"

#include <atomic>

#include "absl/time/clock.h"
#include "catch2/catch.hpp"

namespace paramserver {
namespace {

// Waits up to 30 s for `cancels` to reach 1.
bool AwaitCancel(const std::atomic<int>& cancels) {
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (cancels.load() == 0 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
  return cancels.load() > 0;
}

TEST_CASE("a watchdog cancels a call that makes no progress for its stall, once") {
  std::atomic<int> cancels{0};
  const absl::Time start = absl::Now();
  ProgressWatchdog watchdog(absl::Milliseconds(200), [&] { ++cancels; });
  REQUIRE(AwaitCancel(cancels));
  CHECK(absl::Now() - start >= absl::Milliseconds(200));
  CHECK(watchdog.fired());
  absl::SleepFor(absl::Milliseconds(500));
  CHECK(cancels.load() == 1);
}

TEST_CASE("progress moves the stall on: a call that keeps moving is never cancelled") {
  std::atomic<int> cancels{0};
  ProgressWatchdog watchdog(absl::Seconds(1), [&] { ++cancels; });
  // Three stalls' time in all, never more than a fraction of one without progress.
  const absl::Time end = absl::Now() + absl::Seconds(3);
  while (absl::Now() < end) {
    watchdog.Progress();
    absl::SleepFor(absl::Milliseconds(20));
  }
  CHECK(cancels.load() == 0);
  CHECK_FALSE(watchdog.fired());
  // Then it stops moving, and is cancelled.
  REQUIRE(AwaitCancel(cancels));
  CHECK(cancels.load() == 1);
}

TEST_CASE("a watchdog ended before its stall never cancels, and ends at once") {
  std::atomic<int> cancels{0};
  const absl::Time start = absl::Now();
  {
    ProgressWatchdog watchdog(absl::Hours(1), [&] { ++cancels; });
    watchdog.Progress();
  }
  CHECK(absl::Now() - start < absl::Seconds(10));
  CHECK(cancels.load() == 0);
}

TEST_CASE("a stopped watchdog never cancels, and says whether it had") {
  std::atomic<int> cancels{0};
  ProgressWatchdog watchdog(absl::Milliseconds(300), [&] { ++cancels; });
  watchdog.Stop();
  absl::SleepFor(absl::Milliseconds(600));
  CHECK(cancels.load() == 0);
  CHECK_FALSE(watchdog.fired());
  watchdog.Stop();  // again: no effect
}

}  // namespace
}  // namespace paramserver
