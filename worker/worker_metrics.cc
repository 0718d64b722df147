#include "worker/worker_metrics.h"

namespace paramserver {

std::vector<ScrapedFamily> WorkerMetricFamilies(const NodeProgress& progress,
                                                EvaluationFigure figure) {
  const auto gauge = [](const char* name, const char* help, double value) {
    return ScrapedFamily{name, help, /*counter=*/false, {{{}, value}}};
  };
  std::vector<ScrapedFamily> families = {
      gauge("worker_step", "Steps this worker has trained (the next step's number).",
            static_cast<double>(progress.step())),
      gauge("worker_total_steps", "Steps this worker trains in all.",
            static_cast<double>(progress.total_steps())),
      gauge("worker_epoch", "The training epoch (pass over the data) this worker is in.",
            static_cast<double>(progress.epoch())),
      gauge("worker_loss", "The last step's mean training loss (cross-entropy; ctr: BCE).",
            progress.loss()),
      gauge("worker_samples_per_second", "Training samples per second since this worker began.",
            progress.samples_per_sec()),
  };
  const bool evaluated = progress.accuracy_step() > 0;
  ScrapedFamily accuracy{"worker_test_accuracy",
                         "The latest test-set accuracy this worker evaluated (rank 0, after each "
                         "epoch); absent until the first.",
                         false,
                         {}};
  if (evaluated && figure == EvaluationFigure::kAccuracy)
    accuracy.samples.push_back({{}, progress.test_accuracy()});
  ScrapedFamily auc{"worker_test_auc",
                    "A ctr model's latest test-set AUC (rank 0, after each epoch); absent until "
                    "the first.",
                    false,
                    {}};
  if (evaluated && figure == EvaluationFigure::kAuc)
    auc.samples.push_back({{}, progress.test_auc()});
  families.push_back(std::move(accuracy));
  families.push_back(std::move(auc));
  return families;
}

}  // namespace paramserver
