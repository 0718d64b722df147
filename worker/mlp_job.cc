#include "worker/mlp_job.h"

#include "absl/strings/str_format.h"
#include "common/base/status_macros.h"
#include "common/model/model_layout.h"
#include "spdlog/spdlog.h"
#include "worker/device_selection.h"

namespace paramserver {

MlpJob::MlpJob(ClusterSpec spec) : spec_(std::move(spec)), layout_(spec_.model.layers) {}

absl::Status MlpJob::LoadTrainingData(const DataSection& files, const std::string& device) {
  const ModelSection& model = spec_.model;
  PS_ASSIGN_OR_RETURN(train_,
                      LoadIdxDataset(files.train_images, files.train_labels, model.layers.front(),
                                     static_cast<int>(model.layers.back())));
  PS_ASSIGN_OR_RETURN(backend_, CreateComputeBackend(device, layout_, SystemGpus()));
  return absl::OkStatus();
}

ServerModel MlpJob::server_model() const { return {layout_.total_parameters(), {}}; }

absl::Status MlpJob::LoadTestSet(const DataSection& files) {
  const ModelSection& model = spec_.model;
  PS_ASSIGN_OR_RETURN(test_,
                      LoadIdxDataset(files.test_images, files.test_labels, model.layers.front(),
                                     static_cast<int>(model.layers.back())));
  test_loaded_ = true;
  return absl::OkStatus();
}

absl::Status MlpJob::CreateLoop(const JobEnvironment& environment) {
  TrainerOptions options;
  static_cast<StepLoopOptions&>(options) = StepLoopOptionsFor(environment, spec_.training);
  PS_ASSIGN_OR_RETURN(
      trainer_, Trainer::Create(options, layout_, &train_, environment.rank == 0 ? &test_ : nullptr,
                                environment.ps, backend_.get()));
  return absl::OkStatus();
}

absl::StatusOr<FinalEvaluation> MlpJob::EvaluateFinal(int64_t steps) {
  if (trainer_ == nullptr || !test_loaded_) {
    return absl::FailedPreconditionError("the final evaluation needs the loop and the test set");
  }
  PS_ASSIGN_OR_RETURN(const double accuracy, trainer_->Evaluate(steps, test_, &final_weights_));
  evaluated_step_ = steps;
  FinalEvaluation evaluation;
  evaluation.result.set_test_accuracy(accuracy);
  evaluation.summary_line = absl::StrFormat("test_accuracy=%.4f", accuracy);
  evaluation.scalars = {{"test_accuracy", accuracy}};
  return evaluation;
}

absl::Status MlpJob::WriteFinalWeights(int64_t steps, const std::string& path) {
  if (evaluated_step_ != steps) {
    return absl::FailedPreconditionError("the final weights are written after their evaluation");
  }
  PS_RETURN_IF_ERROR(SaveDenseParameters(layout_.model(), final_weights_, path));
  spdlog::info("wrote the final weights to {}", path);
  return absl::OkStatus();
}

}  // namespace paramserver
