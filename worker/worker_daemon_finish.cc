// WorkerDaemon's end of the job: waiting for the others, the final evaluation (rank 0,
// or whoever takes a lost rank 0's place) and the weights written.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status_macros.h"
#include "spdlog/spdlog.h"
#include "worker/worker_daemon.h"

namespace paramserver {

absl::Status WorkerDaemon::AwaitJobEnd(const TrainingSummary& summary) {
  // Rank 0 evaluates and reports the result; if it died and no worker took its place,
  // the lowest-ranked live worker does, so the job still ends. Until then, wait.
  const absl::Time give_up = absl::Now() + options_.finish_timeout;
  // The scheduler exits soon after every waiting worker has heard of the result (in a
  // heartbeat answer or in its view), so the heartbeats are watched as well as the view.
  while (absl::Now() < give_up) {
    if (job_finished_.load()) return absl::OkStatus();
    if (absl::Status lost = scheduler_lost(); !lost.ok()) return lost;
    absl::StatusOr<ClusterView> view = membership_->scheduler()->GetClusterView(node_name_);
    if (view.ok() && view->job_finished()) return absl::OkStatus();
    if (view.ok() && view->finisher_rank() == rank_) {
      spdlog::warn(
          "rank 0 is gone and no worker took its place: this worker (rank {}) evaluates the final "
          "weights "
          "and reports the result",
          rank_);
      PS_RETURN_IF_ERROR(job_->LoadTestSet(data_));
      return FinishAsFinisher(summary);
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
  return absl::DeadlineExceededError(
      "the job's result was not reported in time by the worker evaluating it");
}

absl::Status WorkerDaemon::FinishAsFinisher(const TrainingSummary& summary) {
  // In async and ssp modes the others may still be pushing: evaluate what they all made.
  // Asked in short rounds, so that a scheduler lost meanwhile ends the wait.
  // (An unreachable scheduler is polled through; a hung one times each round out.)
  const absl::Time give_up = absl::Now() + options_.finish_timeout;
  while (scheduler_lost().ok()) {
    const absl::Time round_end = std::min(give_up, absl::Now() + absl::Seconds(2));
    const absl::Status waited =
        membership_->scheduler()->WaitForWorkersFinished(node_name_, round_end).status();
    if (waited.ok()) break;
    if (waited.code() != absl::StatusCode::kDeadlineExceeded || absl::Now() >= give_up)
      return waited;
  }
  const absl::Status lost = scheduler_lost();
  if (!lost.ok()) {
    spdlog::warn(
        "the scheduler is gone: evaluating the final weights without its word that every worker "
        "has "
        "finished (in sync mode they are final regardless)");
  }
  ReportResultRequest result;
  result.set_node_name(node_name_);
  std::string summary_line;
  PS_RETURN_IF_ERROR(EvaluateAndSave(summary, &result, &summary_line));
  const absl::Status reported =
      lost.ok()
          ? RetryWhileSchedulerAway([&] { return membership_->scheduler()->ReportResult(result); })
          : lost;
  if (!reported.ok() && !scheduler_lost().ok()) {
    return absl::UnavailableError(absl::StrCat(
        scheduler_lost().message(), "; training finished (", summary.steps, " steps, final ",
        summary_line, ")",
        options_.spec.output.weights.empty()
            ? ""
            : absl::StrCat(" and the final weights were written to ", options_.spec.output.weights),
        ", but no scheduler recorded the result"));
  }
  return reported;
}

absl::Status WorkerDaemon::EvaluateAndSave(const TrainingSummary& summary,
                                           ReportResultRequest* result, std::string* summary_line) {
  PS_ASSIGN_OR_RETURN(FinalEvaluation evaluation, job_->EvaluateFinal(summary.steps));
  result->MergeFrom(evaluation.result);
  *summary_line = std::move(evaluation.summary_line);
  spdlog::info("final {}", *summary_line);
  for (const auto& [tag, value] : evaluation.scalars) {
    if (tensorboard_ == nullptr) break;
    absl::Status written = tensorboard_->WriteScalar(tag, summary.steps, value);
    if (!written.ok()) spdlog::warn("{}", written.ToString());
  }
  const std::string& weights_path = options_.spec.output.weights;
  if (weights_path.empty()) return absl::OkStatus();
  return job_->WriteFinalWeights(summary.steps, weights_path);
}

}  // namespace paramserver
