// model.type mlp: a dense MLP trained on an IDX image set (Fashion-MNIST's format) by the
// built-in Trainer, on the CPU or a GPU; the final evaluation is the test-set accuracy,
// and the weights are written as the MLP's tensors.
#ifndef PARAMSERVER_WORKER_MLP_JOB_H_
#define PARAMSERVER_WORKER_MLP_JOB_H_

#include <memory>
#include <string>
#include <vector>

#include "common/config/cluster_spec.h"
#include "common/model/mlp_parameters.h"
#include "worker/compute_backend.h"
#include "worker/idx_dataset.h"
#include "worker/model_job.h"
#include "worker/trainer.h"

namespace paramserver {

class MlpJob final : public ModelJob {
 public:
  // REQUIRES: a checked spec of model.type mlp (its layers are valid).
  explicit MlpJob(ClusterSpec spec);

  absl::Status LoadTrainingData(const DataSection& files, const std::string& device) override;
  ServerModel server_model() const override;
  absl::Status LoadTestSet(const DataSection& files) override;
  absl::Status CreateLoop(const JobEnvironment& environment) override;
  TrainingLoop* loop() const override { return trainer_.get(); }
  absl::StatusOr<FinalEvaluation> EvaluateFinal(int64_t steps) override;
  absl::Status WriteFinalWeights(int64_t steps, const std::string& path) override;
  EvaluationFigure figure() const override { return EvaluationFigure::kAccuracy; }

 private:
  const ClusterSpec spec_;
  const MlpLayout layout_;
  LabeledDataset train_;
  LabeledDataset test_;
  bool test_loaded_ = false;
  std::unique_ptr<ComputeBackend> backend_;
  std::unique_ptr<Trainer> trainer_;
  int64_t evaluated_step_ = -1;  // the step final_weights_ are of
  std::vector<float> final_weights_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_MLP_JOB_H_
