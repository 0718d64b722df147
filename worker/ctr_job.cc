#include "worker/ctr_job.h"

#include "absl/strings/str_format.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/safetensors.h"
#include "common/model/mlp_parameters.h"
#include "common/model/model_layout.h"
#include "spdlog/spdlog.h"
#include "worker/device_selection.h"

namespace paramserver {

CtrJob::CtrJob(ClusterSpec spec)
    : spec_(std::move(spec)),
      shape_{spec_.model.dense_features, spec_.model.categorical_features,
             spec_.model.embedding_dim, spec_.model.layers, CtrTableDims(spec_.model)} {}

absl::Status CtrJob::LoadTrainingData(const DataSection& files, const std::string& device) {
  PS_ASSIGN_OR_RETURN(
      train_, LoadCriteoFiles(files.train, shape_.dense_features, shape_.categorical_features));
  spdlog::info("loaded {} training examples from {} file(s)", train_.example_count,
               files.train.size());
  PS_ASSIGN_OR_RETURN(compute_, CreateCtrCompute(device, shape_, SystemGpus()));
  return absl::OkStatus();
}

ServerModel CtrJob::server_model() const {
  return {MlpLayout(shape_.layers).total_parameters(), CtrTableDims(spec_.model)};
}

absl::Status CtrJob::LoadTestSet(const DataSection& files) {
  PS_ASSIGN_OR_RETURN(
      test_, LoadCriteoFiles(files.test, shape_.dense_features, shape_.categorical_features));
  test_loaded_ = true;
  return absl::OkStatus();
}

absl::Status CtrJob::CreateLoop(const JobEnvironment& environment) {
  CtrTrainerOptions options;
  static_cast<StepLoopOptions&>(options) = StepLoopOptionsFor(environment, spec_.training);
  options.shape = shape_;
  PS_ASSIGN_OR_RETURN(trainer_,
                      CtrTrainer::Create(options, &train_, environment.rank == 0 ? &test_ : nullptr,
                                         environment.ps, compute_.get()));
  export_tables_ = environment.export_tables;
  return absl::OkStatus();
}

absl::StatusOr<FinalEvaluation> CtrJob::EvaluateFinal(int64_t steps) {
  if (trainer_ == nullptr || !test_loaded_) {
    return absl::FailedPreconditionError("the final evaluation needs the loop and the test set");
  }
  PS_ASSIGN_OR_RETURN(const CtrEvaluation evaluation,
                      trainer_->Evaluate(steps, test_, &final_mlp_));
  evaluated_step_ = steps;
  FinalEvaluation evaluated;
  evaluated.result.set_ctr(true);
  evaluated.result.set_test_auc(evaluation.auc);
  evaluated.result.set_test_logloss(evaluation.logloss);
  evaluated.summary_line =
      absl::StrFormat("test_auc=%.4f test_logloss=%.4f", evaluation.auc, evaluation.logloss);
  evaluated.scalars = {{"test_auc", evaluation.auc}, {"test_logloss", evaluation.logloss}};
  return evaluated;
}

absl::Status CtrJob::WriteFinalWeights(int64_t steps, const std::string& path) {
  if (evaluated_step_ != steps || !export_tables_) {
    return absl::FailedPreconditionError("the final weights are written after their evaluation");
  }
  std::vector<NamedTensor> tensors = DenseTensorsOf(MlpLayout(shape_.layers).model(), final_mlp_);
  PS_ASSIGN_OR_RETURN(const std::vector<TableRows> tables, export_tables_(steps));
  int64_t rows = 0;
  for (const TableRows& table : tables) rows += static_cast<int64_t>(table.ids.size());
  for (NamedTensor& tensor : TensorsOfTables(tables, CtrTableDims(spec_.model)))
    tensors.push_back(std::move(tensor));
  PS_RETURN_IF_ERROR(WriteSafetensorsFile(path, tensors));
  spdlog::info("wrote the final weights to {} (the MLP and {} rows of {} tables)", path, rows,
               tables.size());
  return absl::OkStatus();
}

}  // namespace paramserver
