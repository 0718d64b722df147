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
    executor.Run([&] { ++ran; });
    for (int i = 0; i < 500 && ran.load() < 1; ++i) absl::SleepFor(absl::Milliseconds(5));
    for (int i = 0; i < 20; ++i) {
      executor.Run([&] { ++ran; });
      absl::SleepFor(absl::Milliseconds(2));
    }
    CHECK(executor.threads() <= 2);  // one thread did (nearly) all of them
  }
  CHECK(ran.load() == 21);
}

}  // namespace
}  // namespace paramserver
