// The training loop of a model.type torch worker, driven by the user's script through
// the Python package (docs/PYTHON.md): the script computes each step's gradient and
// hands it over (Step); this pushes it, pulls the next values, rides out failed
// servers as the built-in loops do, and keeps the progress the heartbeats carry.
#ifndef PARAMSERVER_WORKER_SCRIPT_TRAINING_LOOP_H_
#define PARAMSERVER_WORKER_SCRIPT_TRAINING_LOOP_H_

#include <atomic>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/config/cluster_spec.h"
#include "worker/data_leaser.h"
#include "worker/ps_client.h"
#include "worker/step_recorder.h"
#include "worker/training_loop.h"

namespace paramserver {

struct ScriptTrainingOptions {
  int64_t total_parameters = 0;  // the declared model's dense parameters
  int embedding_tables = 0;
  TrainingSection training;  // training.max_steps, if set, is the progress's "of N"
  int64_t start_step = 0;
  absl::Duration recovery_timeout = absl::Seconds(30);
  ScalarSink on_scalar;  // may be empty
  absl::Duration progress_log_interval = absl::Seconds(5);
  // The scheduler's LeaseData, for job.batches() (may be empty: none).
  LeaseDataCall lease_data;
};

// One table's part of a step: the rows the script read (ids, strictly increasing) and
// their gradients (ids.size() x the table's dim).
struct TableStep {
  std::vector<int64_t> ids;
  std::vector<float> row_gradients;
};

// Thread-safe as TrainingLoop says: Step, PullRows and EndTraining on the script's
// thread; progress() and Stop() from any other.
class ScriptTrainingLoop : public TrainingLoop {
 public:
  ScriptTrainingLoop(ScriptTrainingOptions options, PsClient* ps);

  // The values the script's first step computes with (its start step's), into
  // `params` (total_parameters of them). Recovers as Step does.
  absl::Status PullCurrent(absl::Span<float> params);

  // The rows of `ids` (per table, strictly increasing) as the servers hold them at the
  // present step, into rows[t]. Recovers as Step does; INVALID_ARGUMENT for ids the
  // servers refuse (the message names them).
  absl::Status PullRows(const std::vector<std::vector<int64_t>>& ids,
                        std::vector<std::vector<float>>* rows);

  // One step: pushes `gradient` (total_parameters values: d(mean batch loss)/d(param))
  // and `tables` (one per table, empty where the step read no rows), then fills
  // `params` with the values of the next step. `loss` (NaN: not reported) and
  // `samples` feed the progress. A failed server is waited for up to the recovery
  // timeout and the step completes on its replacement (an acknowledged push is re-sent
  // to a moved shard, and applied once). After a sync rollback the push is dropped and
  // `params` holds the rolled-back values: the script's next batch is the servers' next
  // step. `settings` (null: the spec's): the script's optimizer settings for the step,
  // runs of the flat vector. `skip`: this worker skips the step (its loss scaler found
  // the gradient not finite; `gradient` and `tables` are not sent): in sync mode every
  // server skips it, in async and ssp modes this push applies nothing; `params` then
  // holds the next step's values all the same. `clip_grad_norm` (> 0, sync): the servers
  // clip the step's mean gradient to this global 2-norm, as clip_grad_norm_ after
  // averaging (the push gathers every dense shard's sum of squares; the pull brings the
  // coefficient, ClipCoefficient). With backup workers (training.sync.backup_workers), a
  // push every shard dropped as late counts no samples, and the next step is the servers'
  // (PsClient::last_push). CANCELLED after Stop() or EndTraining();
  // INVALID_ARGUMENT for what the servers refuse (sync: workers' settings that differ);
  // the recovery errors otherwise.
  absl::Status Step(absl::Span<const float> gradient, std::vector<TableStep> tables,
                    absl::Span<float> params, double loss, int64_t samples,
                    const StepHyperparameters* settings = nullptr, bool skip = false,
                    double clip_grad_norm = 0);

  // The script is done: Run() returns the summary. `test_accuracy` (unset: none) is
  // what the job's final line reports if this worker reports the result.
  void EndTraining(std::optional<double> test_accuracy) ABSL_LOCKS_EXCLUDED(mu_);
  std::optional<double> test_accuracy() const ABSL_LOCKS_EXCLUDED(mu_);

  // The step the next Step() pushes.
  int64_t step() const { return step_.load(); }

  // job.batches(): the indices (into a set of `example_count` examples) of the batch the
  // next Step trains, from the scheduler's leases (LeaseDataRequest in
  // proto/scheduler.proto; each epoch's order from training.shuffle and seed); nullopt
  // once every epoch is trained. Each batch must be trained by exactly one Step before
  // the next is taken (FAILED_PRECONDITION otherwise): the push of step s acknowledges
  // the batch leased for step s. A lease may move step() up (past this rank's earlier
  // pushes); a rewind (admitted again after being declared dead) drops the lease, which
  // the scheduler re-leases. INVALID_ARGUMENT for figures other than the first call's;
  // the scheduler's refusals (FAILED_PRECONDITION outside async mode).
  absl::StatusOr<std::optional<std::vector<int64_t>>> NextLeasedBatch(int64_t example_count,
                                                                      int batch_size)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Returns at once: the summary of the steps taken (every step is the script's).
  // CANCELLED if Stop() was called or EndTraining() was not.
  absl::StatusOr<TrainingSummary> Run() override;
  NodeProgress progress() const override { return recorder_.progress(); }
  int64_t total_steps() const override { return options_.training.max_steps; }
  void Stop() override { stop_requested_.store(true); }

 private:
  // Runs `call` until it succeeds, recovering from what a map change may cure. `call`
  // is told whether the map changed since its last try, and whether the servers rolled
  // back (step() moved back); it returns its status.
  struct RecoveryNews {
    bool map_changed = false;  // since the last try
    bool rewound = false;      // at any time during this call
  };
  absl::Status WithRecovery(const std::function<absl::Status(const RecoveryNews&)>& call);

  const ScriptTrainingOptions options_;
  PsClient* const ps_;
  // job.batches(), on the script's thread: the leaser (made at the first call, for its
  // set and batch size), the lease being trained, how many of its batches were handed
  // out, and whether a rewind voided it.
  std::unique_ptr<DataLeaser> leaser_;
  int64_t leased_examples_ = 0;
  int leased_batch_size_ = 0;
  std::optional<LeasedChunk> lease_;
  int64_t batches_handed_ = 0;
  std::atomic<bool> lease_void_{false};
  StepRecorder recorder_;
  std::atomic<int64_t> step_;
  std::atomic<bool> stop_requested_{false};
  absl::Time start_ = absl::InfiniteFuture();        // the first Step
  absl::Time last_step_end_ = absl::InfinitePast();  // the training time ends here
  TrainingSummary summary_;
  mutable absl::Mutex mu_;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<double> test_accuracy_ ABSL_GUARDED_BY(mu_);
};

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_SCRIPT_TRAINING_LOOP_H_
