#include "scheduler/worker_absence_watch.h"

namespace paramserver {

WorkerAbsenceWatch::WorkerAbsenceWatch(absl::Duration give_up_after, absl::Duration report_every)
    : give_up_after_(give_up_after), report_every_(report_every) {}

WorkerAbsenceWatch::Observation WorkerAbsenceWatch::Observe(bool job_started, int live_workers,
                                                            bool job_over, absl::Time now) {
  started_ = started_ || job_started;
  if (!started_ || job_over || gave_up_ || live_workers > 0) {
    alone_since_.reset();
    return {};
  }
  if (!alone_since_.has_value()) {
    alone_since_ = now;
    next_report_ = now;
  }
  const absl::Duration waited = now - *alone_since_;
  if (waited >= give_up_after_) {
    gave_up_ = true;
    return {Verdict::kGiveUp, waited};
  }
  if (now < next_report_) return {Verdict::kFine, waited};
  next_report_ = now + report_every_;
  return {Verdict::kWaiting, waited};
}

}  // namespace paramserver
