// model.type torch: the user's PyTorch script (through the Python package) declares its
// model, computes every step's gradient and drives the steps (ScriptTrainingLoop); the
// final evaluation is the test accuracy the script reported, if any, and the weights
// are written as the declared tensors and embedding tables.
#ifndef PARAMSERVER_WORKER_SCRIPT_JOB_H_
#define PARAMSERVER_WORKER_SCRIPT_JOB_H_

#include <memory>
#include <string>

#include "absl/types/span.h"
#include "common/config/cluster_spec.h"
#include "common/model/model_layout.h"
#include "worker/model_job.h"
#include "worker/script_training_loop.h"

namespace paramserver {

class ScriptJob final : public ModelJob {
 public:
  // REQUIRES: a checked spec of model.type torch.
  explicit ScriptJob(ClusterSpec spec);

  // The script's model (job.register), before the daemon declares it to the scheduler:
  // FAILED_PRECONDITION once a loop exists (register once), INVALID_ARGUMENT for
  // `initial_values` of another size than the layout's dense parameters, and
  // model.init_from's error when that file does not hold this model (naming the tensor).
  // A declaration that failed at the scheduler may be made again.
  absl::Status Declare(const ModelLayout& layout, absl::Span<const float> initial_values);
  const ModelLayout& layout() const { return layout_; }
  // The loop the script drives; null before CreateLoop.
  ScriptTrainingLoop* script() const { return loop_.get(); }

  // The script has its own data: nothing to load.
  absl::Status LoadTrainingData(const DataSection&, const std::string&) override {
    return absl::OkStatus();
  }
  ServerModel server_model() const override;
  absl::Status LoadTestSet(const DataSection&) override { return absl::OkStatus(); }
  absl::Status CreateLoop(const JobEnvironment& environment) override;
  TrainingLoop* loop() const override { return loop_.get(); }
  absl::StatusOr<FinalEvaluation> EvaluateFinal(int64_t steps) override;
  absl::Status WriteFinalWeights(int64_t steps, const std::string& path) override;
  EvaluationFigure figure() const override { return EvaluationFigure::kNone; }

 private:
  const ClusterSpec spec_;
  ModelLayout layout_;
  std::unique_ptr<ScriptTrainingLoop> loop_;
  std::function<absl::StatusOr<std::vector<TableRows>>(int64_t)> export_tables_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_SCRIPT_JOB_H_
