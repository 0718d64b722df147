// The scheduler's held long polls: each answered exactly once, at a newer map, at its
// deadline, or at Close; a full list and a map already newer refuse to hold.
#include "scheduler/map_wait_list.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "catch2/catch.hpp"

namespace paramserver {
namespace {

using Outcome = MapWaitList::Outcome;

// What one held call was answered with, and when: filled on the list's thread, read
// under a lock (the notification says when; TSAN does not see through Debian's Abseil).
class Answered {
 public:
  MapWaitList::Answer Recorder() {
    return [this](Outcome why) {
      {
        absl::MutexLock lock(&mu_);
        outcome_ = why;
        at_ = absl::Now();
      }
      done.Notify();
    };
  }
  Outcome outcome() const {
    absl::MutexLock lock(&mu_);
    return outcome_;
  }
  absl::Time at() const {
    absl::MutexLock lock(&mu_);
    return at_;
  }
  absl::Notification done;

 private:
  mutable absl::Mutex mu_;
  Outcome outcome_ ABSL_GUARDED_BY(mu_) = Outcome::kClosed;
  absl::Time at_ ABSL_GUARDED_BY(mu_);
};

TEST_CASE("a held call is answered when a newer map is published, not before") {
  MapWaitList list(16, /*published_epoch=*/3);
  Answered for_4, for_5;
  REQUIRE(list.Hold(3, absl::Now() + absl::Seconds(60), for_4.Recorder()));
  REQUIRE(list.Hold(4, absl::Now() + absl::Seconds(60), for_5.Recorder()));
  CHECK(list.held() == 2);
  list.Published(3);  // the same epoch again: nothing is due
  list.Published(2);  // an older one: ignored
  CHECK_FALSE(for_4.done.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  list.Published(4);
  REQUIRE(for_4.done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  CHECK(for_4.outcome() == Outcome::kNewMap);
  CHECK_FALSE(for_5.done.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  CHECK(list.held() == 1);
  list.Published(7);
  REQUIRE(for_5.done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  CHECK(for_5.outcome() == Outcome::kNewMap);
  CHECK(list.held() == 0);
}

TEST_CASE("a map already newer, a passed deadline, a full list and a closed one refuse to hold") {
  MapWaitList list(2, /*published_epoch=*/5);
  int called = 0;
  auto count = [&called](Outcome) { ++called; };
  CHECK_FALSE(list.Hold(4, absl::Now() + absl::Seconds(60), count));  // epoch 5 is above 4
  CHECK_FALSE(list.Hold(5, absl::Now() - absl::Milliseconds(1), count));
  Answered first, second;
  CHECK(list.Hold(5, absl::Now() + absl::Seconds(60), first.Recorder()));
  CHECK(list.Hold(9, absl::Now() + absl::Seconds(60), second.Recorder()));
  CHECK_FALSE(list.Hold(5, absl::Now() + absl::Seconds(60), count));  // full
  list.Close();  // returns once both are answered
  CHECK(first.done.HasBeenNotified());
  CHECK(second.done.HasBeenNotified());
  CHECK(first.outcome() == Outcome::kClosed);
  CHECK(second.outcome() == Outcome::kClosed);
  CHECK_FALSE(list.Hold(5, absl::Now() + absl::Seconds(60), count));
  CHECK(called == 0);  // a refused answer is the caller's to give
}

TEST_CASE("held calls are answered at their deadlines, each at its own, in order") {
  MapWaitList list(16, 1);
  const absl::Time start = absl::Now();
  // Far enough apart that a paused test thread (a sanitizer's, a busy machine) neither
  // passes a deadline before its Hold nor blurs their order.
  const absl::Duration waits[] = {absl::Milliseconds(1500), absl::Milliseconds(500),
                                  absl::Milliseconds(1000)};
  Answered answered[3];
  for (int i = 0; i < 3; ++i) REQUIRE(list.Hold(1, start + waits[i], answered[i].Recorder()));
  for (Answered& one : answered)
    REQUIRE(one.done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  for (int i = 0; i < 3; ++i) {
    CHECK(answered[i].outcome() == Outcome::kDeadline);
    CHECK(answered[i].at() >= start + waits[i]);  // never before its deadline
  }
  CHECK(answered[1].at() <= answered[2].at());
  CHECK(answered[2].at() <= answered[0].at());
}

TEST_CASE("the list's destruction answers what it holds") {
  Answered held;
  {
    MapWaitList list(4, 0);
    REQUIRE(list.Hold(0, absl::Now() + absl::Seconds(60), held.Recorder()));
  }
  REQUIRE(held.done.HasBeenNotified());
  CHECK(held.outcome() == Outcome::kClosed);
}

TEST_CASE("an answer may hold a call again (a node that asks again)") {
  MapWaitList list(4, 1);
  Answered again;
  std::atomic<bool> held_again{false};
  absl::Notification first_done;
  REQUIRE(list.Hold(1, absl::Now() + absl::Seconds(60), [&](Outcome) {
    held_again = list.Hold(2, absl::Now() + absl::Seconds(60), again.Recorder());
    first_done.Notify();
  }));
  list.Published(2);
  REQUIRE(first_done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  CHECK(held_again);
  list.Published(3);
  REQUIRE(again.done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  CHECK(again.outcome() == Outcome::kNewMap);
}

TEST_CASE("under concurrent holds, publications and deadlines every held call is answered once") {
  constexpr int kHolders = 4, kCallsEach = 500;
  std::atomic<int> answered{0}, refused{0}, twice{0};
  std::vector<std::atomic<int>> times(kHolders * kCallsEach);
  {
    MapWaitList list(256, 0);
    std::atomic<int64_t> epoch{0};
    std::atomic<bool> holding{true};
    std::thread publisher([&] {
      while (holding) {
        list.Published(++epoch);
        absl::SleepFor(absl::Microseconds(200));
      }
    });
    std::vector<std::thread> holders;
    for (int h = 0; h < kHolders; ++h) {
      holders.emplace_back([&, h] {
        for (int i = 0; i < kCallsEach; ++i) {
          const int call = h * kCallsEach + i;
          // Some wait for the next map, some for one far ahead (their deadline answers).
          const int64_t above = i % 3 == 0 ? epoch.load() + 1000000 : epoch.load();
          const bool held =
              list.Hold(above, absl::Now() + absl::Milliseconds(1 + i % 7), [&, call](Outcome) {
                if (times[call].fetch_add(1) > 0) ++twice;
                ++answered;
              });
          if (!held) ++refused;
        }
      });
    }
    for (std::thread& holder : holders) holder.join();
    holding = false;
    publisher.join();
  }  // destruction answers the rest
  CHECK(twice == 0);
  CHECK(answered + refused == kHolders * kCallsEach);
  CHECK(answered > 0);
}

}  // namespace
}  // namespace paramserver
