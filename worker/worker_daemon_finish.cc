// WorkerDaemon's end of the job: waiting for the others, the final evaluation (rank 0,
// or whoever takes a lost rank 0's place) and the weights written.
#include <algorithm>
#include <functional>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/embedding_init.h"
#include "common/logging.h"
#include "common/mlp_parameters.h"
#include "common/model_declaration.h"
#include "common/retry_policy.h"
#include "common/s3_file_system.h"
#include "common/safetensors.h"
#include "common/security_policy.h"
#include "common/status_macros.h"
#include "common/storage_checks.h"
#include "spdlog/spdlog.h"
#include "worker/device_selection.h"
#include "worker/recovery.h"
#include "worker/rpc_fault_injector.h"
#include "worker/worker_daemon.h"

namespace paramserver {

absl::Status WorkerDaemon::AwaitJobEnd(const TrainingSummary& summary) {
  // Rank 0 evaluates and reports the result; if it died and no worker took its place,
  // the lowest-ranked live worker does, so the job still ends. Until then, wait.
  const absl::Time give_up = absl::Now() + options_.finish_timeout;
  // The scheduler exits soon after every waiting worker has heard of the result in a
  // heartbeat answer, so the heartbeats are watched as well as the view.
  while (absl::Now() < give_up) {
    if (job_finished_.load()) return absl::OkStatus();
    if (absl::Status lost = scheduler_lost(); !lost.ok()) return lost;
    absl::StatusOr<ClusterView> view = scheduler_->GetClusterView(node_name_);
    if (view.ok() && view->job_finished()) return absl::OkStatus();
    if (view.ok() && view->finisher_rank() == rank_) {
      spdlog::warn(
          "rank 0 is gone and no worker took its place: this worker (rank {}) evaluates the final "
          "weights "
          "and reports the result",
          rank_);
      PS_RETURN_IF_ERROR(LoadTestSet());
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
    const absl::Status waited = scheduler_->WaitForWorkersFinished(node_name_, round_end).status();
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
      lost.ok() ? RetryWhileSchedulerAway([&] { return scheduler_->ReportResult(result); }) : lost;
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
  const std::string& weights_path = options_.spec.output.weights;
  std::vector<float> weights;
  std::vector<std::pair<std::string, double>> scalars;
  if (script_loop_ != nullptr) {
    // The script evaluated (or not); the weights are the servers' at the last step.
    if (const std::optional<double> accuracy = script_loop_->test_accuracy()) {
      result->set_test_accuracy(*accuracy);
      *summary_line = absl::StrFormat("test_accuracy=%.4f", *accuracy);
      scalars = {{"test_accuracy", *accuracy}};
    } else {
      result->set_no_test_accuracy(true);
      *summary_line = "(no test accuracy: the script reported none)";
    }
    if (!weights_path.empty()) {
      weights.resize(declared_layout_.dense_parameters());
      PS_RETURN_IF_ERROR(script_loop_->PullCurrent(absl::MakeSpan(weights)));
    }
  } else if (ctr_trainer_ != nullptr) {
    PS_ASSIGN_OR_RETURN(const CtrEvaluation evaluation,
                        ctr_trainer_->Evaluate(summary.steps, ctr_test_, &weights));
    result->set_ctr(true);
    result->set_test_auc(evaluation.auc);
    result->set_test_logloss(evaluation.logloss);
    *summary_line =
        absl::StrFormat("test_auc=%.4f test_logloss=%.4f", evaluation.auc, evaluation.logloss);
    scalars = {{"test_auc", evaluation.auc}, {"test_logloss", evaluation.logloss}};
  } else {
    PS_ASSIGN_OR_RETURN(const double accuracy,
                        mlp_trainer_->Evaluate(summary.steps, test_, &weights));
    result->set_test_accuracy(accuracy);
    *summary_line = absl::StrFormat("test_accuracy=%.4f", accuracy);
    scalars = {{"test_accuracy", accuracy}};
  }
  spdlog::info("final {}", *summary_line);
  for (const auto& [tag, value] : scalars) {
    if (tensorboard_ == nullptr) break;
    absl::Status written = tensorboard_->WriteScalar(tag, summary.steps, value);
    if (!written.ok()) spdlog::warn("{}", written.ToString());
  }
  if (!weights_path.empty() && script_loop_ != nullptr) {
    std::vector<NamedTensor> tensors = DenseTensorsOf(declared_layout_, weights);
    std::vector<std::string> names;
    std::vector<int> dims;
    for (const EmbeddingTableSlot& table : declared_layout_.embedding_tables()) {
      names.push_back(table.name);
      dims.push_back(static_cast<int>(table.dim));
    }
    if (!names.empty()) {
      PS_ASSIGN_OR_RETURN(const std::vector<TableRows> tables,
                          ps_client_->ExportTables(summary.steps));
      for (NamedTensor& tensor : TensorsOfTables(tables, names, dims))
        tensors.push_back(std::move(tensor));
    }
    PS_RETURN_IF_ERROR(WriteSafetensorsFile(weights_path, tensors));
    spdlog::info("wrote the final weights to {}", weights_path);
  } else if (!weights_path.empty() && ctr_trainer_ != nullptr) {
    std::vector<NamedTensor> tensors =
        DenseTensorsOf(MlpLayout(options_.spec.model.layers).model(), weights);
    PS_ASSIGN_OR_RETURN(const std::vector<TableRows> tables,
                        ps_client_->ExportTables(summary.steps));
    int64_t rows = 0;
    for (const TableRows& table : tables) rows += static_cast<int64_t>(table.ids.size());
    for (NamedTensor& tensor : TensorsOfTables(tables, options_.spec.model.embedding_dim))
      tensors.push_back(std::move(tensor));
    PS_RETURN_IF_ERROR(WriteSafetensorsFile(weights_path, tensors));
    spdlog::info("wrote the final weights to {} (the MLP and {} rows of {} tables)", weights_path,
                 rows, tables.size());
  } else if (!weights_path.empty()) {
    PS_RETURN_IF_ERROR(
        SaveDenseParameters(MlpLayout(options_.spec.model.layers).model(), weights, weights_path));
    spdlog::info("wrote the final weights to {}", weights_path);
  }
  return absl::OkStatus();
}

}  // namespace paramserver
