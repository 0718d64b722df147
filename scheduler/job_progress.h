// How the job goes: the workers' training curves (from their heartbeats), when a step
// last advanced, and how the job ended (its result, or an operator's shutdown).
#ifndef PARAMSERVER_SCHEDULER_JOB_PROGRESS_H_
#define PARAMSERVER_SCHEDULER_JOB_PROGRESS_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/admin.pb.h"
#include "proto/scheduler.pb.h"
#include "scheduler/node_roster.h"

namespace paramserver {

struct JobResult {
  double test_accuracy = 0;
  // Every worker process's samples (those that died or were replaced included) / the
  // longest a slot trained (its processes' training times, summed).
  double samples_per_sec = 0;
  int64_t steps = 0;  // steps per worker (the most any worker ran)
  // A ctr model's result, in place of test_accuracy.
  bool ctr = false;
  double test_auc = 0;
  double test_logloss = 0;
  // A torch script finished without a test accuracy (test_accuracy is 0, not a score).
  bool without_score = false;
  // The samples and the worker processes that trained them (not saved with the
  // scheduler's state: 0 after a takeover).
  int64_t samples = 0;
  int worker_processes = 0;
};

// Thread-compatible: the registry's lock guards it.
class JobProgress {
 public:
  // Each worker's curve keeps at most this many points (thinned to every other one).
  static constexpr size_t kMaxHistoryPoints = 400;

  // `ctr`: the model's test score is an AUC.
  explicit JobProgress(bool ctr) : ctr_(ctr) {}

  // INVALID_ARGUMENT, naming the node and the figure, for a heartbeat whose figures
  // (progress, embedding shard stats, refused gradients) are out of range: a peer's
  // numbers, checked before anything uses them.
  static absl::Status CheckHeartbeatFigures(const HeartbeatRequest& request);

  // Worker `name` reported `progress`; a step past `previous_step` adds a point to its
  // curve and counts as the job advancing at `now`.
  void RecordWorkerProgress(const std::string& name, int64_t previous_step,
                            const NodeProgress& progress, absl::Time now);
  // The job (re)started at `now`: the cluster formed, or this scheduler took it over.
  void MarkAdvance(absl::Time now) { last_advance_ = now; }

  // The final result from rank-0 worker `reporter` once every live worker finished:
  // its scores (INVALID_ARGUMENT out of range: an accuracy or an AUC outside [0, 1], a
  // log loss not finite or negative) with the workers' summed throughput from their
  // summaries in `nodes`. The first result stands.
  absl::StatusOr<JobResult> SetResult(const ReportResultRequest& request,
                                      const std::string& reporter,
                                      const std::vector<RegistryNode>& nodes, absl::Time now);
  // An operator ended the job. False if it had been already.
  bool RequestShutdown();
  // The scheduler ended the job unfinished, for `why` (an error): a shutdown that says
  // why. False if the job had ended already (the first ending stands).
  bool EndUnfinished(absl::Status why);
  // Why the job ended unfinished (EndUnfinished's `why`); OK otherwise.
  const absl::Status& ended_unfinished() const { return ended_unfinished_; }

  const std::optional<JobResult>& result() const { return result_; }
  const std::string& result_reporter() const { return result_reporter_; }
  bool shutdown_requested() const { return shutdown_requested_; }
  // The result is in, or a shutdown was requested: nodes are told to stop.
  bool over() const { return result_.has_value() || shutdown_requested_; }
  absl::Time last_advance() const { return last_advance_; }
  absl::Time finished() const { return finished_; }
  const std::map<std::string, std::vector<ProgressPoint>>& history() const { return history_; }

  // The result's durable part, and how the job ended without one, into `state`, and back
  // (Import: taking a job over).
  void Export(SchedulerState* state) const;
  void Import(const SchedulerState& state);

 private:
  const bool ctr_;
  std::map<std::string, std::vector<ProgressPoint>> history_;  // by worker name
  absl::Time last_advance_ = absl::InfinitePast();
  std::optional<JobResult> result_;
  std::string result_reporter_;  // the worker that reported it
  absl::Time finished_ = absl::InfiniteFuture();
  bool shutdown_requested_ = false;
  absl::Status ended_unfinished_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_SCHEDULER_JOB_PROGRESS_H_
