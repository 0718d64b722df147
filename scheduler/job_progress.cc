#include "scheduler/job_progress.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace paramserver {

absl::Status JobProgress::CheckHeartbeatFigures(const HeartbeatRequest& request) {
  // The figures the ETA is computed from.
  const NodeProgress& progress = request.progress();
  if (progress.total_steps() < 0 || progress.total_steps() > (int64_t{1} << 53) ||
      !std::isfinite(progress.steps_per_sec()) || progress.steps_per_sec() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("heartbeat from '", request.node_name(), "': progress total_steps ",
                     progress.total_steps(), " and steps_per_sec ", progress.steps_per_sec(),
                     " must be in [0, 2^53] and finite and >= 0"));
  }
  for (const ShardStatus& shard : request.shards()) {
    const EmbeddingShardStats& rows = shard.embedding();
    if (rows.rows() < 0 || !(std::isfinite(rows.bytes()) && rows.bytes() >= 0) ||
        rows.minimum_bytes() < 0 || rows.evicted_rows() < 0 || rows.dropped_gradients() < 0 ||
        rows.pending_ids() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("heartbeat from '", request.node_name(), "': shard ", shard.shard_id(),
                       "'s embedding figures must be finite and >= 0"));
    }
  }
  if (request.refused_gradients() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("heartbeat from '", request.node_name(),
                                                   "': refused_gradients ",
                                                   request.refused_gradients(), " must be >= 0"));
  }
  if (progress.samples() < 0 || progress.samples() > (int64_t{1} << 53) ||
      !(std::isfinite(progress.training_seconds()) && progress.training_seconds() >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heartbeat from '", request.node_name(), "': progress samples ", progress.samples(),
        " and training_seconds ", progress.training_seconds(), " must be finite and >= 0"));
  }
  if (!(progress.test_auc() >= 0 && progress.test_auc() <= 1) ||
      !(std::isfinite(progress.test_logloss()) && progress.test_logloss() >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heartbeat from '", request.node_name(), "': progress test_auc ", progress.test_auc(),
        " and test_logloss ", progress.test_logloss(), " must be in [0, 1] and finite and >= 0"));
  }
  return absl::OkStatus();
}

void JobProgress::RecordWorkerProgress(const std::string& name, int64_t previous_step,
                                       const NodeProgress& progress, absl::Time now) {
  if (progress.step() <= previous_step) return;
  last_advance_ = now;
  std::vector<ProgressPoint>& points = history_[name];
  ProgressPoint& point = points.emplace_back();
  point.set_step(progress.step());
  point.set_loss(progress.loss());
  // The model's test score: a ctr model's is its AUC.
  point.set_test_accuracy(ctr_ ? progress.test_auc() : progress.test_accuracy());
  point.set_samples_per_sec(progress.samples_per_sec());
  point.set_accuracy_step(progress.accuracy_step());
  if (points.size() > kMaxHistoryPoints) {
    // Keep every other point: the curve keeps its shape over the whole run.
    std::vector<ProgressPoint> thinned;
    for (size_t i = 0; i < points.size(); i += 2) thinned.push_back(points[i]);
    points = std::move(thinned);
  }
}

absl::StatusOr<JobResult> JobProgress::SetResult(const ReportResultRequest& request,
                                                 const std::string& reporter,
                                                 const std::vector<RegistryNode>& nodes,
                                                 absl::Time now) {
  if (result_.has_value()) return *result_;
  const bool scores_ok =
      request.no_test_accuracy() ? request.test_accuracy() == 0 && !request.ctr()
      : request.ctr()            ? request.test_auc() >= 0 && request.test_auc() <= 1 &&
                            std::isfinite(request.test_logloss()) && request.test_logloss() >= 0
                      : request.test_accuracy() >= 0 && request.test_accuracy() <= 1;
  if (!scores_ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("a result of test_accuracy ", request.test_accuracy(), ", test_auc ",
                     request.test_auc(), " and test_logloss ", request.test_logloss(),
                     ": an accuracy and an AUC lie in [0, 1], a log loss is finite and >= 0"));
  }
  result_reporter_ = reporter;
  JobResult result;
  result.test_accuracy = request.test_accuracy();
  result.ctr = request.ctr();
  result.test_auc = request.test_auc();
  result.test_logloss = request.test_logloss();
  result.without_score = request.no_test_accuracy();
  int64_t samples = 0;
  double seconds = 0;
  for (const RegistryNode& n : nodes) {
    if (n.role != NODE_ROLE_WORKER) continue;
    const SlotTraining trained = TrainedBy(n);
    samples += trained.samples;
    seconds = std::max(seconds, trained.seconds);
    result.worker_processes += trained.processes;
    result.steps = std::max(result.steps, n.summary.steps());
  }
  result.samples = samples;
  result.samples_per_sec = seconds > 0 ? samples / seconds : 0;
  result_ = result;
  finished_ = now;
  return result;
}

bool JobProgress::RequestShutdown() {
  const bool first = !shutdown_requested_;
  shutdown_requested_ = true;
  return first;
}

bool JobProgress::EndUnfinished(absl::Status why) {
  if (over()) return false;
  shutdown_requested_ = true;
  ended_unfinished_ = std::move(why);
  return true;
}

void JobProgress::Export(SchedulerState* state) const {
  state->set_shutdown_requested(shutdown_requested_);
  if (!ended_unfinished_.ok()) {
    state->set_ended_unfinished_code(static_cast<int32_t>(ended_unfinished_.code()));
    state->set_ended_unfinished_message(std::string(ended_unfinished_.message()));
  }
  if (!result_.has_value()) return;
  state->set_has_result(true);
  state->set_test_accuracy(result_->test_accuracy);
  state->set_result_ctr(result_->ctr);
  state->set_test_auc(result_->test_auc);
  state->set_test_logloss(result_->test_logloss);
  state->set_result_without_score(result_->without_score);
  state->set_samples_per_sec(result_->samples_per_sec);
  state->set_steps(result_->steps);
}

void JobProgress::Import(const SchedulerState& state) {
  shutdown_requested_ = state.shutdown_requested();
  // A code no absl::Status has (a damaged or foreign file) still ends the job: UNKNOWN.
  const int code = state.ended_unfinished_code();
  if (code != 0) {
    const absl::StatusCode known =
        code > 0 && code <= static_cast<int>(absl::StatusCode::kUnauthenticated)
            ? static_cast<absl::StatusCode>(code)
            : absl::StatusCode::kUnknown;
    ended_unfinished_ = absl::Status(known, state.ended_unfinished_message());
    shutdown_requested_ = true;
  }
  if (!state.has_result()) return;
  result_ = JobResult{state.test_accuracy(),       state.samples_per_sec(), state.steps(),
                      state.result_ctr(),          state.test_auc(),        state.test_logloss(),
                      state.result_without_score()};
}

}  // namespace paramserver
