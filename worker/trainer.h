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
#include "common/cluster_spec.h"
#include "common/mlp_parameters.h"
#include "proto/scheduler.pb.h"
#include "worker/compute_backend.h"
#include "worker/idx_dataset.h"
#include "worker/ps_client.h"
#include "worker/push_strategy.h"
#include "worker/step_recorder.h"
#include "worker/training_loop.h"

namespace paramserver {

struct TrainerOptions {
  int worker_rank = 0;
  int num_workers = 1;
  TrainingSection training;
  // Evaluate on the test set at the end of each epoch (the rank-0 worker does).
  bool evaluate_each_epoch = false;
  absl::Duration progress_log_interval = absl::Seconds(3);
  // The first step to run (PsClient::StartStep): a resumed or rejoining worker's is > 0.
  int64_t start_step = 0;
  // How long the trainer keeps retrying (refreshing the shard map with backoff) after
  // a pull or push fails for a reason a map change can cure, before giving up.
  absl::Duration recovery_timeout = absl::Seconds(30);
  // If set, receives the training curves as (tag, step, value) at each progress log
  // line ("loss", the mean since the last one; "samples_per_sec") and each evaluation
  // ("test_accuracy"), on the training thread.
  std::function<void(const std::string& tag, int64_t step, double value)> on_scalar;
};

// Thread-safe: Run on one thread; progress() and Stop() from any other.
class Trainer final : public TrainingLoop {
 public:
  // `train` holds the whole training set (the trainer reads only this worker's range);
  // `test` may be null unless evaluate_each_epoch. None are owned; all must outlive it.
  // INVALID_ARGUMENT if the worker's range holds no full batch.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(TrainerOptions options, MlpLayout layout,
                                                         const LabeledDataset* train,
                                                         const LabeledDataset* test, PsClient* ps,
                                                         ComputeBackend* backend);

  // Runs every step from start_step: (epochs x steps per epoch), capped at max_steps
  // when that is set. A pull or push that fails because a server died, moved shards or
  // was replaced is retried on the refreshed shard map (re-sending the last gradient,
  // which the servers apply once, and, after a sync rollback, rewinding to the
  // restored step), for up to recovery_timeout. Returns the first other error of a
  // pull, a push or the backend (naming the step), the last error once recovery times
  // out, FAILED_PRECONDITION if the loss goes non-finite or the scheduler declared this
  // worker dead, or CANCELLED after Stop().
  absl::StatusOr<TrainingSummary> Run() override;

  // Pulls the weights as of `step` updates, evaluates them on the test set and returns
  // the accuracy; the weights are left in *weights when that is not null.
  absl::StatusOr<double> Evaluate(int64_t step, std::vector<float>* weights);
  // The same on `test`, for a worker that was not given a test set at creation (one
  // that becomes the finisher when rank 0 is lost).
  absl::StatusOr<double> Evaluate(int64_t step, const LabeledDataset& test,
                                  std::vector<float>* weights);

  int64_t total_steps() const override { return total_steps_; }
  NodeProgress progress() const override;
  void Stop() override { stop_requested_.store(true); }

 private:
  Trainer(TrainerOptions options, MlpLayout layout, const LabeledDataset* train,
          const LabeledDataset* test, PsClient* ps, ComputeBackend* backend,
          int64_t steps_per_epoch);

  // Copies the examples at `position` of order_ into batch_features_/batch_labels_.
  BatchView GatherBatch(int64_t position);
  // After a failed pull or push: waits, refreshes the shard map, re-sends the last
  // push on a new map, and rewinds *step after a rollback (state_.give_up_at: when to
  // give up). Returns the error to give up with, or OK to retry.
  absl::Status Recover(const absl::Status& failure, int64_t* step,
                       std::optional<absl::Time>* give_up_at);
  // The rank-0 worker's evaluation at the end of an epoch. OK, or an error to stop
  // with; *rewind is set when a rollback was seen instead (the loop goes back).
  absl::Status MaybeEvaluateEpoch(int64_t step, int epoch, std::optional<int64_t>* rewind);
  // PullAll, recovering from map changes (for evaluation).
  absl::Status PullWithRecovery(int64_t step, absl::Span<float> params);

  const TrainerOptions options_;
  const MlpLayout layout_;
  const LabeledDataset* const train_;
  const LabeledDataset* const test_;
  PsClient* const ps_;
  ComputeBackend* const backend_;
  const int64_t steps_per_epoch_;
  const int64_t total_steps_;
  StepBuffers buffers_;
  StepState state_;
  std::unique_ptr<PushStrategy> strategy_;
  // The current epoch's example order (GatherBatch reads it).
  std::vector<int64_t> order_;
  // Progress logging: since the last line.
  std::vector<float> batch_features_;
  std::vector<uint8_t> batch_labels_;
  std::atomic<bool> stop_requested_{false};
  StepRecorder recorder_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_TRAINER_H_
