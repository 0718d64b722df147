// The training loop of one worker of a ctr model: per step, its batch's unique ids per
// table, the MLP and those rows (brought back by the previous step's push, or pulled),
// the sparse forward and backward pass (worker/ctr_compute.h), and one push of the
// MLP's gradient and the rows' gradients, whose reply brings the next batch's.
// The worker never holds a table: only the current batch's rows.
#ifndef PARAMSERVER_WORKER_CTR_TRAINER_H_
#define PARAMSERVER_WORKER_CTR_TRAINER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/cluster_spec.h"
#include "worker/criteo_dataset.h"
#include "worker/ctr_compute.h"
#include "worker/ctr_model.h"
#include "worker/ps_client.h"
#include "worker/step_recorder.h"
#include "worker/training_loop.h"

namespace paramserver {

struct CtrTrainerOptions {
  int worker_rank = 0;
  int num_workers = 1;
  TrainingSection training;
  CtrModelShape shape;
  // Evaluate on the test set at the end of each epoch (the rank-0 worker does).
  bool evaluate_each_epoch = false;
  absl::Duration progress_log_interval = absl::Seconds(3);
  int64_t start_step = 0;  // PsClient::StartStep
  // How long a failed pull or push is retried on refreshed maps before giving up.
  absl::Duration recovery_timeout = absl::Seconds(30);
  // Receives ("loss", "samples_per_sec", "test_auc", "test_logloss") as Trainer's does.
  std::function<void(const std::string& tag, int64_t step, double value)> on_scalar;
};

// A test-set evaluation: exact AUC (by sorting) and the mean log loss.
struct CtrEvaluation {
  double auc = 0;
  double logloss = 0;
  int64_t examples = 0;
};

class CtrTrainer final : public TrainingLoop {
 public:
  // `train` (this worker reads only its contiguous part, in the order training.shuffle
  // and seed give) and `test` (may be null unless evaluate_each_epoch) must outlive it.
  // INVALID_ARGUMENT if the shape is invalid, the data's widths differ from it, or the
  // worker's part holds no full batch.
  // `compute` (not owned, outlives it) runs each step's forward and backward pass.
  static absl::StatusOr<std::unique_ptr<CtrTrainer>> Create(CtrTrainerOptions options,
                                                            const CtrDataset* train,
                                                            const CtrDataset* test, PsClient* ps,
                                                            CtrCompute* compute);

  // Every step from start_step, as Trainer::Run: failed pulls and pushes are retried on
  // refreshed maps (re-sending the last push, rewinding after a sync rollback) for up to
  // recovery_timeout; FAILED_PRECONDITION for a non-finite loss.
  absl::StatusOr<TrainingSummary> Run() override;

  // Pulls the MLP and the test set's rows as of `step` updates, a batch at a time, and
  // scores `test`. The MLP's weights are left in *mlp when it is not null.
  absl::StatusOr<CtrEvaluation> Evaluate(int64_t step, const CtrDataset& test,
                                         std::vector<float>* mlp);

  int64_t total_steps() const override { return total_steps_; }
  NodeProgress progress() const override;
  void Stop() override { stop_requested_.store(true); }

 private:
  CtrTrainer(CtrTrainerOptions options, const CtrDataset* train, const CtrDataset* test,
             PsClient* ps, CtrCompute* compute, int64_t steps_per_epoch, int64_t mlp_parameters);

  // The batch at `position` of order_, gathered into batch_*.
  CtrBatchView GatherBatch(int64_t position);
  // One step: pull, compute, push, each timed into *summary; a step whose push failed
  // only pushes again. *loss gets the batch's mean loss (not finite: nothing was pushed).
  absl::Status TrainStep(int64_t step, int64_t position, float* loss, TrainingSummary* summary);
  // After a failed pull or push: refreshes the map, re-sends the last push on a new map,
  // rewinds *step after a rollback. The error to give up with, or OK to retry.
  absl::Status Recover(const absl::Status& failure, int64_t* step);
  absl::Status MaybeEvaluateEpoch(int64_t step, int epoch);

  const CtrTrainerOptions options_;
  const CtrDataset* const train_;
  const CtrDataset* const test_;
  PsClient* const ps_;
  CtrCompute* const compute_;
  const int64_t steps_per_epoch_;
  const int64_t total_steps_;
  std::vector<int64_t> order_;
  std::vector<float> batch_dense_, batch_labels_;
  std::vector<int64_t> batch_ids_;
  std::vector<float> mlp_;  // the MLP as last pulled
  // The last acknowledged push, re-sent after a map change.
  int64_t last_pushed_step_ = -1;
  BatchRows last_rows_;
  CtrStepResult last_result_;
  // The step whose MLP (in mlp_) and rows (prefetched_rows_) the last push brought back.
  int64_t prefetched_step_ = -1;
  std::vector<std::vector<float>> prefetched_rows_;
  // A step computed whose push was not acknowledged: retried as it is.
  int64_t unacknowledged_step_ = -1;
  BatchRows pending_rows_;
  CtrStepResult pending_result_;
  std::optional<absl::Time> give_up_at_;
  std::atomic<bool> stop_requested_{false};
  StepRecorder recorder_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_CTR_TRAINER_H_
