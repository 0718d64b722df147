// model.type ctr: embedding tables (one per categorical field, held by the servers) and
// an MLP over them and the dense features, trained on Criteo-format files by the
// built-in CtrTrainer; the final evaluation is the test set's AUC and log loss, and the
// weights are written as the MLP's tensors and every table's rows.
#ifndef PARAMSERVER_WORKER_CTR_JOB_H_
#define PARAMSERVER_WORKER_CTR_JOB_H_

#include <memory>
#include <string>
#include <vector>

#include "common/config/cluster_spec.h"
#include "worker/criteo_dataset.h"
#include "worker/ctr_compute.h"
#include "worker/ctr_trainer.h"
#include "worker/model_job.h"

namespace paramserver {

class CtrJob final : public ModelJob {
 public:
  // REQUIRES: a checked spec of model.type ctr.
  explicit CtrJob(ClusterSpec spec);

  absl::Status LoadTrainingData(const DataSection& files, const std::string& device) override;
  ServerModel server_model() const override;
  absl::Status LoadTestSet(const DataSection& files) override;
  absl::Status CreateLoop(const JobEnvironment& environment) override;
  TrainingLoop* loop() const override { return trainer_.get(); }
  absl::StatusOr<FinalEvaluation> EvaluateFinal(int64_t steps) override;
  absl::Status WriteFinalWeights(int64_t steps, const std::string& path) override;
  EvaluationFigure figure() const override { return EvaluationFigure::kAuc; }

 private:
  const ClusterSpec spec_;
  const CtrModelShape shape_;
  CtrDataset train_;
  CtrDataset test_;
  bool test_loaded_ = false;
  std::unique_ptr<CtrCompute> compute_;
  std::unique_ptr<CtrTrainer> trainer_;
  std::function<absl::StatusOr<std::vector<TableRows>>(int64_t)> export_tables_;
  int64_t evaluated_step_ = -1;  // the step final_mlp_ is of
  std::vector<float> final_mlp_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_CTR_JOB_H_
