#include "ps/call_executor.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"

namespace paramserver {
namespace {

TEST_CASE("tasks that block run side by side, each on a thread of its own, up to the bound") {
  CallExecutor executor(/*max_threads=*/3);
  absl::Notification release;
  std::atomic<int> started{0}, finished{0};
  for (int i = 0; i < 4; ++i) {
    executor.Run([&] {
      ++started;
      release.WaitForNotificationWithTimeout(absl::Seconds(10));
      ++finished;
    });
  }
  for (int i = 0; i < 500 && started.load() < 3; ++i) absl::SleepFor(absl::Milliseconds(5));
  CHECK(started.load() == 3);  // the fourth waits for a thread
  CHECK(executor.threads() == 3);
  release.Notify();
  for (int i = 0; i < 500 && finished.load() < 4; ++i) absl::SleepFor(absl::Milliseconds(5));
  CHECK(finished.load() == 4);
}

TEST_CASE("an idle thread is reused; destruction runs what was given") {
  std::atomic<int> ran{0};
  {
    CallExecutor executor(8);
    for (int i = 0; i < 20; ++i) {
      executor.Run([&] { ++ran; });
      // Once the task ran and its thread waits for the next, that thread takes the next.
      const absl::Time give_up = absl::Now() + absl::Seconds(30);
      while ((ran.load() < i + 1 || executor.idle_threads() < 1) && absl::Now() < give_up) {
        absl::SleepFor(absl::Milliseconds(1));
      }
      REQUIRE(executor.idle_threads() == 1);
    }
    CHECK(executor.threads() == 1);  // one thread did all of them
    executor.Run([&] { ++ran; });    // given last, run by the destructor at the latest
  }
  CHECK(ran.load() == 21);
}

}  // namespace
}  // namespace paramserver
