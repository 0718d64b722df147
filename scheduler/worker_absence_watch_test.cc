#include "scheduler/worker_absence_watch.h"

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

using Verdict = WorkerAbsenceWatch::Verdict;

const absl::Time kStart = absl::FromUnixSeconds(1000);

absl::Time At(double seconds) { return kStart + absl::Seconds(seconds); }

TEST_CASE("no worker before the job started is not a wait") {
  WorkerAbsenceWatch watch(absl::Seconds(30), absl::Seconds(5));
  CHECK(watch.Observe(false, 0, false, At(0)).verdict == Verdict::kFine);
  CHECK(watch.Observe(false, 0, false, At(100)).verdict == Verdict::kFine);
}

TEST_CASE("a job left without workers is reported every interval, then given up at the timeout") {
  WorkerAbsenceWatch watch(absl::Seconds(30), absl::Seconds(5));
  CHECK(watch.Observe(true, 2, false, At(0)).verdict == Verdict::kFine);
  // The job stays started once it was: a view that no longer says so (its workers gone
  // before the cluster formed) does not hide the wait.
  WorkerAbsenceWatch::Observation first = watch.Observe(false, 0, false, At(10));
  CHECK(first.verdict == Verdict::kWaiting);
  CHECK(first.waited == absl::ZeroDuration());
  CHECK(watch.Observe(false, 0, false, At(14.9)).verdict == Verdict::kFine);
  WorkerAbsenceWatch::Observation second = watch.Observe(true, 0, false, At(15.2));
  CHECK(second.verdict == Verdict::kWaiting);
  CHECK(second.waited == absl::Seconds(5.2));
  CHECK(watch.Observe(true, 0, false, At(39.9)).verdict == Verdict::kWaiting);
  WorkerAbsenceWatch::Observation end = watch.Observe(true, 0, false, At(40));
  CHECK(end.verdict == Verdict::kGiveUp);
  CHECK(end.waited == absl::Seconds(30));
  // Given up once: what follows is the job's end, not another wait.
  CHECK(watch.Observe(true, 0, false, At(41)).verdict == Verdict::kFine);
}

TEST_CASE("a worker that joins ends the wait; a later loss starts a new one") {
  WorkerAbsenceWatch watch(absl::Seconds(30), absl::Seconds(5));
  CHECK(watch.Observe(true, 0, false, At(0)).verdict == Verdict::kWaiting);
  CHECK(watch.Observe(true, 1, false, At(29)).verdict == Verdict::kFine);
  WorkerAbsenceWatch::Observation again = watch.Observe(true, 0, false, At(50));
  CHECK(again.verdict == Verdict::kWaiting);
  CHECK(again.waited == absl::ZeroDuration());
  CHECK(watch.Observe(true, 0, false, At(79)).verdict != Verdict::kGiveUp);
  CHECK(watch.Observe(true, 0, false, At(80)).verdict == Verdict::kGiveUp);
}

TEST_CASE("a finished job has no workers to wait for") {
  WorkerAbsenceWatch watch(absl::Seconds(30), absl::Seconds(5));
  CHECK(watch.Observe(true, 2, false, At(0)).verdict == Verdict::kFine);
  CHECK(watch.Observe(true, 0, true, At(1)).verdict == Verdict::kFine);
  CHECK(watch.Observe(true, 0, true, At(100)).verdict == Verdict::kFine);
}

}  // namespace
}  // namespace paramserver

namespace paramserver {
namespace {

TEST_CASE("without a limit the wait is reported for as long as it lasts") {
  WorkerAbsenceWatch watch(absl::InfiniteDuration(), absl::Seconds(5));
  CHECK(watch.Observe(true, 0, false, At(0)).verdict == Verdict::kWaiting);
  const WorkerAbsenceWatch::Observation day = watch.Observe(true, 0, false, At(86400));
  CHECK(day.verdict == Verdict::kWaiting);
  CHECK(day.waited == absl::Seconds(86400));
}

}  // namespace
}  // namespace paramserver
