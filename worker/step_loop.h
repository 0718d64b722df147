// The loop of steps the built-in models share (Trainer for an mlp, CtrTrainer for a ctr
// model): the worker's part of the training set and each epoch's order of it, the stop
// check, recovery after a failed pull or push (wait, refresh the shard map, re-send or
// rewind), the record of every completed step and the rank-0 evaluation at the end of
// each epoch. A model says how one step is trained, what it re-sends and forgets, and
// how it evaluates (StepModel); the loop says when.
#ifndef PARAMSERVER_WORKER_STEP_LOOP_H_
#define PARAMSERVER_WORKER_STEP_LOOP_H_

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/config/cluster_spec.h"
#include "proto/scheduler.pb.h"
#include "worker/data_leaser.h"
#include "worker/ps_client.h"
#include "worker/push_strategy.h"
#include "worker/step_recorder.h"
#include "worker/training_loop.h"

namespace paramserver {

struct StepLoopOptions {
  int worker_rank = 0;
  int num_workers = 1;
  TrainingSection training;  // batch_size, epochs, max_steps, shuffle and seed
  // Evaluate on the test set at the end of each epoch but the last (the rank-0 worker
  // does; the last is the job's final evaluation).
  bool evaluate_each_epoch = false;
  absl::Duration progress_log_interval = absl::Seconds(3);
  // The first step to run (PsClient::StartStep): a resumed or rejoining worker's is > 0.
  int64_t start_step = 0;
  // How long a failed pull or push is retried on refreshed shard maps (with backoff)
  // before giving up.
  absl::Duration recovery_timeout = absl::Seconds(30);
  // If set, receives the training curves as (tag, step, value): "loss" (the mean since
  // the last progress line) and "samples_per_sec" at each progress line, and each
  // evaluation's figures, on the training thread.
  ScalarSink on_scalar;
  // data.sharding: dynamic: the scheduler's LeaseData call. Set, the loop trains the
  // leases it hands out (worker/data_leaser.h) instead of this rank's fixed range, until
  // every epoch is trained.
  LeaseDataCall lease_data;
};

// What one step came to, when it did not end the run.
struct StepResult {
  // OK once every shard acknowledged the step's push; else the pull's or the push's
  // error, which the loop recovers from before it tries the step again.
  absl::Status transfer;
  float loss = 0;  // the batch's mean loss, when `transfer` is OK
};

// One model's steps, as StepLoop drives them: every call is on the training thread.
class StepModel {
 public:
  virtual ~StepModel() = default;
  // What computes the steps, for the log ("cpu", "cuda:0").
  virtual std::string compute_name() const = 0;
  // Trains step `in.step`, at `in.position` of the epoch (StepLoop::BatchExamples says
  // which examples): pull, compute, push, each timed into *summary. A step whose push
  // failed is pushed again as it was when it is tried again. An error ends the run: the
  // compute failed, or the loss is not finite (FAILED_PRECONDITION, saying what to lower).
  virtual absl::StatusOr<StepResult> TrainStep(const StepInput& in, TrainingSummary* summary) = 0;
  // A transfer failed: what came back with it may be partial, so the next step pulls
  // (and computes) afresh.
  virtual void ForgetPrefetched() = 0;
  // The shard map changed: re-sends the last acknowledged push (a moved shard's new
  // owner may lack it; the others ignore the repeat). OK if there is none.
  virtual absl::Status ResendLastPush() = 0;
  // The servers rolled back: training goes on at `step`, and the last push is not
  // theirs any more.
  virtual void Rewound(int64_t step) = 0;
  // The end of `epoch`: evaluates the weights after `step` updates, logs the figures,
  // hands them to the curves and the progress. OK, or the error to stop with. A model
  // whose evaluation saw the servers roll back sets *rewind (training goes back there);
  // the ctr model's does not yet (its evaluation gives up, and training goes on).
  virtual absl::Status EvaluateEpoch(int64_t step, int epoch, std::optional<int64_t>* rewind) = 0;
};

// Thread-safe: Run (and whatever the model calls back) on one thread; progress() and
// Stop() from any other.
class StepLoop {
 public:
  // The steps of an epoch for `example_count` examples shared by options.num_workers;
  // INVALID_ARGUMENT when the smallest worker's share holds no full batch (with leases:
  // when the whole set holds none; the figure is then an estimate of a worker's).
  static absl::StatusOr<int64_t> StepsPerEpoch(const StepLoopOptions& options,
                                               int64_t example_count);

  // `steps_per_epoch` as StepsPerEpoch gave it; `ps` (not owned) outlives the loop.
  StepLoop(StepLoopOptions options, int64_t example_count, int64_t steps_per_epoch, PsClient* ps);

  // Every step from start_step: (epochs x steps per epoch), capped at max_steps when
  // that is set; with options.lease_data, every lease's batches until the scheduler says
  // every epoch is trained (a lease may move the step up: LeaseDataResponse). A step whose transfer
  // failed because a server died, moved shards or was replaced is retried on the refreshed map (see
  // Recover) for up to recovery_timeout. Returns the model's first error, the last transfer error
  // once recovery times out or cannot help, FAILED_PRECONDITION if the scheduler declared this
  // worker dead, or CANCELLED after Stop().
  absl::StatusOr<TrainingSummary> Run(StepModel* model);

  // After `failure` at *step: waits, refreshes the shard map and, when it changed,
  // rewinds *step after a rollback (model->Rewound) or re-sends the last push
  // (model->ResendLastPush). *give_up_at (set at the first failure) bounds the retries.
  // The error to give up with, or OK to try again from *step. For a model's own pulls
  // (an evaluation's) too.
  // Logs `step`'s completion when it `recovered` from a failure, with the time it `took`.
  static void LogRecovered(bool recovered, int64_t step, absl::Duration took);
  absl::Status Recover(StepModel* model, const absl::Status& failure, int64_t* step,
                       std::optional<absl::Time>* give_up_at);

  // The examples (indices into the training set) of the batch at `position` of the
  // current epoch's order (with leases: of the current lease): training.batch_size of
  // them.
  absl::Span<const int64_t> BatchExamples(int64_t position) const;

  const StepLoopOptions& options() const { return options_; }
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t total_steps() const { return total_steps_; }
  StepRecorder* recorder() { return &recorder_; }
  NodeProgress progress() const { return recorder_.progress(); }
  void Stop() { stop_requested_.store(true); }

 private:
  // Run with options_.lease_data.
  absl::StatusOr<TrainingSummary> RunLeased(StepModel* model);
  // The servers' present step (PsClient::StartStep) for a worker admitted again at
  // `step`, asked again through map changes (WaitForRecovery) until the recovery
  // timeout, whose error it returns.
  absl::StatusOr<int64_t> PresentStep(int64_t step);
  // With backup workers, after step `step` completed: the servers' step when every shard
  // is past step + 1 (the others went on without this worker), where training goes on;
  // nullopt otherwise. *dropped: every shard dropped the push as late (its batch's
  // examples were not trained; counted and logged here).
  std::optional<int64_t> ServersStepAhead(int64_t step, bool* dropped);

  const StepLoopOptions options_;
  const int64_t example_count_;
  const int64_t steps_per_epoch_;
  const int64_t total_steps_;
  PsClient* const ps_;
  std::vector<int64_t> order_;  // the current epoch's example order
  // A map change happened since the last completed step (its log line says so).
  bool recovering_ = false;
  bool rewound_ = false;                  // the last Recover moved the step (a rollback, a rejoin)
  int64_t late_steps_ = 0;                // pushes every shard dropped as late
  std::optional<absl::Time> give_up_at_;  // while recovering a step: when to give up
  std::atomic<bool> stop_requested_{false};
  StepRecorder recorder_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_STEP_LOOP_H_
