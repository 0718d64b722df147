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
#include "common/config/cluster_spec.h"
#include "worker/criteo_dataset.h"
#include "worker/ctr_compute.h"
#include "worker/ctr_model.h"
#include "worker/ps_client.h"
#include "worker/step_loop.h"
#include "worker/training_loop.h"

namespace paramserver {

// The step loop's options (worker/step_loop.h; on_scalar also receives "test_auc" and
// "test_logloss") and the model's shape.
struct CtrTrainerOptions : StepLoopOptions {
  CtrModelShape shape;
};

// A test-set evaluation: exact AUC (by sorting) and the mean log loss.
struct CtrEvaluation {
  double auc = 0;
  double logloss = 0;
  int64_t examples = 0;
};

// Thread-safe: Run on one thread; progress() and Stop() from any other.
class CtrTrainer final : public TrainingLoop, private StepModel {
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

  // StepLoop::Run: every step from start_step, failed pulls and pushes retried on
  // refreshed maps (re-sending the last push, rewinding after a sync rollback); also
  // FAILED_PRECONDITION for a non-finite loss, and the compute's errors.
  absl::StatusOr<TrainingSummary> Run() override { return loop_.Run(this); }

  // Pulls the MLP and the test set's rows as of `step` updates, a batch at a time, and
  // scores `test`. The MLP's weights are left in *mlp when it is not null.
  absl::StatusOr<CtrEvaluation> Evaluate(int64_t step, const CtrDataset& test,
                                         std::vector<float>* mlp);

  int64_t total_steps() const override { return loop_.total_steps(); }
  NodeProgress progress() const override { return loop_.progress(); }
  void Stop() override { loop_.Stop(); }

 private:
  CtrTrainer(CtrTrainerOptions options, const CtrDataset* train, const CtrDataset* test,
             PsClient* ps, CtrCompute* compute, int64_t steps_per_epoch, int64_t mlp_parameters);

  // StepModel: the batch's unique ids per table, the MLP and those rows (brought back by
  // the previous push, or pulled), the forward and backward pass, one push (whose reply
  // brings the next batch's rows within an epoch).
  std::string compute_name() const override { return compute_->name(); }
  absl::StatusOr<StepResult> TrainStep(const StepInput& in, TrainingSummary* summary) override;
  void ForgetPrefetched() override { prefetched_step_ = -1; }
  absl::Status ResendLastPush() override;
  void Rewound(int64_t step) override;
  absl::Status EvaluateEpoch(int64_t step, int epoch, std::optional<int64_t>* rewind) override;

  // The batch at `position` of the epoch's order, gathered into batch_*.
  CtrBatchView GatherBatch(int64_t position);

  const CtrModelShape shape_;
  const CtrDataset* const train_;
  const CtrDataset* const test_;
  PsClient* const ps_;
  CtrCompute* const compute_;
  StepLoop loop_;
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
};

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_CTR_TRAINER_H_
