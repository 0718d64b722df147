#include "common/rpc/progress_watchdog.h"

#include <utility>

#include "absl/time/clock.h"

namespace paramserver {

ProgressWatchdog::ProgressWatchdog(absl::Duration stall, std::function<void()> cancel)
    : stall_(stall), cancel_(std::move(cancel)), last_progress_(absl::Now()) {
  thread_ = std::thread([this] { Watch(); });
}

ProgressWatchdog::~ProgressWatchdog() { Stop(); }

void ProgressWatchdog::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void ProgressWatchdog::Progress() {
  absl::MutexLock lock(&mu_);
  last_progress_ = absl::Now();
}

bool ProgressWatchdog::fired() const {
  absl::MutexLock lock(&mu_);
  return fired_;
}

void ProgressWatchdog::Watch() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    const absl::Time due = last_progress_ + stall_;
    if (absl::Now() >= due) {
      // Under the lock, so that a destructor that set stopping_ first is never
      // followed by the call.
      fired_ = true;
      cancel_();
      return;
    }
    // Wakes at the stop, or at the stall's end as last known (Progress() moves it on:
    // the loop looks again).
    mu_.AwaitWithDeadline(absl::Condition(&stopping_), due);
  }
}

}  // namespace paramserver
