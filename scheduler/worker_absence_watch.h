// Watches a running job for the time it has no live worker: nothing can advance it
// until one joins (a worker restarted by its launcher, a replacement from an Auto Scaling
// group). The scheduler reports the wait every few seconds and gives up at
// cluster.no_worker_timeout_ms. Pure: the caller feeds it what it sees and the clock.
#ifndef PARAMSERVER_SCHEDULER_WORKER_ABSENCE_WATCH_H_
#define PARAMSERVER_SCHEDULER_WORKER_ABSENCE_WATCH_H_

#include <optional>

#include "absl/time/time.h"

namespace paramserver {

// Thread-compatible: one caller (the scheduler's watch loop) observes it.
class WorkerAbsenceWatch {
 public:
  enum class Verdict {
    kFine,     // a worker is alive, the job has not started or it is over: nothing to say
    kWaiting,  // no live worker for `waited`; say so (at most once every report interval)
    kGiveUp,   // no live worker for the whole recovery timeout: the job cannot go on
  };
  struct Observation {
    Verdict verdict = Verdict::kFine;
    absl::Duration waited;  // how long no worker has been alive (kWaiting, kGiveUp)
  };

  // `give_up_after`: absl::InfiniteDuration() never gives up.
  // REQUIRES: give_up_after > 0, report_every > 0.
  WorkerAbsenceWatch(absl::Duration give_up_after, absl::Duration report_every);

  // What the scheduler sees at `now`: whether the job has started (a worker registered or
  // the cluster formed; remembered once seen: a start-up that waits for its first workers
  // is not watched), how many workers are alive and whether the job is over. The
  // wait starts at the first observation with no live worker after the job started and
  // ends at the first with one. kWaiting comes at the wait's start and then each
  // report interval; kGiveUp once, when the wait reaches give_up_after, and never again.
  Observation Observe(bool job_started, int live_workers, bool job_over, absl::Time now);

 private:
  const absl::Duration give_up_after_;
  const absl::Duration report_every_;
  bool started_ = false;
  bool gave_up_ = false;
  std::optional<absl::Time> alone_since_;  // the wait's start; unset while a worker lives
  absl::Time next_report_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_SCHEDULER_WORKER_ABSENCE_WATCH_H_
