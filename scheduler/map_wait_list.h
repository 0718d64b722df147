// The long polls for a new shard map (GetClusterView with wait_ms) that the scheduler
// holds, each without a thread of its own: a call waiting here is a queued answer, not a
// blocked thread, and not a waiter on the registry's lock. One thread answers them all:
// at a map's publication, at each call's deadline, or when the scheduler stops.
//
// Why not a thread per call: at a server's loss every worker of a large job waits here
// at once. Threads blocked on the registry's lock with a condition each would make
// every holder of that lock (every heartbeat) evaluate their conditions as it lets go:
// a heartbeat cost 5 to 16 times as much with 1,000 such waiters (docs/PERFORMANCE.md).
#ifndef PARAMSERVER_SCHEDULER_MAP_WAIT_LIST_H_
#define PARAMSERVER_SCHEDULER_MAP_WAIT_LIST_H_

#include <cstdint>
#include <functional>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace paramserver {

// Thread-safe. Every held answer is called exactly once, on this list's own thread,
// with no lock of the list held. An answer must not call this list's Close (it may
// call anything else, Hold included).
class MapWaitList {
 public:
  // Why a held answer is called.
  enum class Outcome {
    kNewMap,    // a map with an epoch above the one the call named was published
    kDeadline,  // its deadline came first
    kClosed,    // Close() (the scheduler stops), or the list's destruction
  };
  using Answer = std::function<void(Outcome)>;

  // At most `max_held` answers held at once. `published_epoch`: the epoch of the map
  // published now (0: none yet). REQUIRES: max_held >= 0.
  MapWaitList(int max_held, int64_t published_epoch);
  // Answers every answer still held (kClosed), then stops the thread.
  ~MapWaitList();
  MapWaitList(const MapWaitList&) = delete;
  MapWaitList& operator=(const MapWaitList&) = delete;

  // Holds `answer` until a map with an epoch above `epoch_above` is published (see
  // Published), until `deadline`, or until Close(), whichever comes first. Returns false
  // without holding it (the caller answers at once) when such a map is already
  // published, when `deadline` has passed, when max_held answers are held already, or
  // after Close().
  bool Hold(int64_t epoch_above, absl::Time deadline, Answer answer) ABSL_LOCKS_EXCLUDED(mu_);

  // The map published now has epoch `epoch`: every held answer that waits for an epoch
  // below it becomes due. Never blocks on an answer (they run on the list's thread), so
  // it may be called under the caller's own lock. An epoch below one already reported
  // is ignored.
  void Published(int64_t epoch) ABSL_LOCKS_EXCLUDED(mu_);

  // Every held answer becomes due (kClosed), and Hold refuses from now on. Returns once
  // they have all been called, or after 30 s at most (an answer that blocks that long
  // breaks this class's contract).
  void Close() ABSL_LOCKS_EXCLUDED(mu_);

  // How many answers are held now (not yet called).
  int held() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Waiting {
    int64_t epoch_above;
    Answer answer;
  };
  // Calls the due answers, then sleeps until the next deadline or a change, until the
  // list is closed and empty.
  void AnswerLoop() ABSL_LOCKS_EXCLUDED(mu_);

  const int max_held_;
  mutable absl::Mutex mu_;
  int64_t published_epoch_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  // Held answers by deadline (the earliest first): the thread sleeps until the first.
  std::multimap<absl::Time, Waiting> held_ ABSL_GUARDED_BY(mu_);
  // Answers taken out of held_ but not yet called (Close waits for none to be left).
  int answering_ ABSL_GUARDED_BY(mu_) = 0;
  // Set when a Published or Close may have made an answer due: the thread wakes.
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
  std::thread answerer_;  // started last: everything above is ready
};

}  // namespace paramserver

#endif  // PARAMSERVER_SCHEDULER_MAP_WAIT_LIST_H_
