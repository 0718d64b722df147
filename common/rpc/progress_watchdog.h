// A watch over a long call that moves in pieces (a stream): the call has no deadline
// worth setting from the start, since its length depends on its size, but every piece
// must follow the one before within a bound.
#ifndef PARAMSERVER_COMMON_RPC_PROGRESS_WATCHDOG_H_
#define PARAMSERVER_COMMON_RPC_PROGRESS_WATCHDOG_H_

#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace paramserver {

// Progress() and fired() from any thread; Stop() and destruction from the owner's.
// Calls `cancel` once, from its own thread, when Progress() has not been
// called for `stall` (counted from construction at first), and never once Stop() or
// destruction has begun. `cancel` runs under the watchdog's lock: it must not block for
// long (grpc::ClientContext::TryCancel does not) nor call the watchdog.
class ProgressWatchdog {
 public:
  ProgressWatchdog(absl::Duration stall, std::function<void()> cancel);
  // Stop().
  ~ProgressWatchdog();
  ProgressWatchdog(const ProgressWatchdog&) = delete;
  ProgressWatchdog& operator=(const ProgressWatchdog&) = delete;

  // The call moved: the stall counts from now.
  void Progress() ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the watch (joins its thread; at once, unless `cancel` is running): after it
  // returns, `cancel` is never called and fired() no longer changes. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `cancel` was called.
  bool fired() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Watch() ABSL_LOCKS_EXCLUDED(mu_);

  const absl::Duration stall_;
  const std::function<void()> cancel_;
  mutable absl::Mutex mu_;
  absl::Time last_progress_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool fired_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started once the rest is set
};

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_RPC_PROGRESS_WATCHDOG_H_
