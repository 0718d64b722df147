// The training loop of one worker: pull, compute, push, step after step, over the
// worker's own range of the training set.
#ifndef PARAMSERVER_WORKER_TRAINER_H_
#define PARAMSERVER_WORKER_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/config/cluster_spec.h"
#include "common/model/mlp_parameters.h"
#include "proto/scheduler.pb.h"
#include "worker/compute_backend.h"
#include "worker/idx_dataset.h"
#include "worker/ps_client.h"
#include "worker/push_strategy.h"
#include "worker/step_loop.h"
#include "worker/training_loop.h"

namespace paramserver {

// The step loop's options (worker/step_loop.h): an mlp adds nothing to them.
struct TrainerOptions : StepLoopOptions {};

// Thread-safe: Run on one thread; progress() and Stop() from any other.
class Trainer final : public TrainingLoop, private StepModel {
 public:
  // `train` holds the whole training set (the trainer reads only this worker's range);
  // `test` may be null unless evaluate_each_epoch. None are owned; all must outlive it.
  // INVALID_ARGUMENT if the worker's range holds no full batch.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(TrainerOptions options, MlpLayout layout,
                                                         const LabeledDataset* train,
                                                         const LabeledDataset* test, PsClient* ps,
                                                         ComputeBackend* backend);

  // StepLoop::Run: every step from start_step, a failed pull or push retried on the
  // refreshed shard map (re-sending the last gradient, which the servers apply once,
  // and, after a sync rollback, rewinding to the restored step). Also
  // FAILED_PRECONDITION if the loss goes non-finite, and the backend's errors.
  absl::StatusOr<TrainingSummary> Run() override { return loop_.Run(this); }

  // Pulls the weights as of `step` updates, evaluates them on the test set and returns
  // the accuracy; the weights are left in *weights when that is not null.
  absl::StatusOr<double> Evaluate(int64_t step, std::vector<float>* weights);
  // The same on `test`, for a worker that was not given a test set at creation (one
  // that becomes the finisher when rank 0 is lost).
  absl::StatusOr<double> Evaluate(int64_t step, const LabeledDataset& test,
                                  std::vector<float>* weights);

  int64_t total_steps() const override { return loop_.total_steps(); }
  NodeProgress progress() const override { return loop_.progress(); }
  void Stop() override { loop_.Stop(); }

 private:
  Trainer(TrainerOptions options, MlpLayout layout, const LabeledDataset* train,
          const LabeledDataset* test, PsClient* ps, ComputeBackend* backend,
          int64_t steps_per_epoch);

  // StepModel: a step through the push strategy (training.overlap, push_bucket_kb).
  std::string compute_name() const override { return backend_->name(); }
  absl::StatusOr<StepResult> TrainStep(const StepInput& in, TrainingSummary* summary) override;
  void ForgetPrefetched() override { state_.ForgetPrefetched(); }
  absl::Status ResendLastPush() override;
  void Rewound(int64_t step) override;
  absl::Status EvaluateEpoch(int64_t step, int epoch, std::optional<int64_t>* rewind) override;

  // Copies the examples of the batch at `position` into batch_features_/batch_labels_.
  BatchView GatherBatch(int64_t position);
  // A pull of the dense values, recovering from map changes (for evaluation).
  absl::Status PullWithRecovery(int64_t step, absl::Span<float> params);

  const MlpLayout layout_;
  const LabeledDataset* const train_;
  const LabeledDataset* const test_;
  PsClient* const ps_;
  ComputeBackend* const backend_;
  StepLoop loop_;
  StepBuffers buffers_;
  StepState state_;
  std::unique_ptr<PushStrategy> strategy_;
  std::vector<float> batch_features_;
  std::vector<uint8_t> batch_labels_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_TRAINER_H_
