// What a worker trains, one kind per model.type: MlpJob (worker/mlp_job.h), CtrJob
// (worker/ctr_job.h) and ScriptJob (worker/script_job.h, a torch script's). A job owns
// its data, its compute, its training loop, its final evaluation and the weights it
// writes. The WorkerDaemon keeps the cluster membership and the job's life: it fetches
// the data files, joins, connects the PS client, finds the start step, runs the loop and
// reports. It asks the job for the rest, in this order: LoadTrainingData (before joining),
// server_model (for the client), LoadTestSet (rank 0's; a worker that becomes the
// finisher later loads it after training), CreateLoop, loop()->Run, then, on the
// finisher, EvaluateFinal and WriteFinalWeights.
#ifndef PARAMSERVER_WORKER_MODEL_JOB_H_
#define PARAMSERVER_WORKER_MODEL_JOB_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/config/cluster_spec.h"
#include "common/model/embedding_init.h"
#include "proto/scheduler.pb.h"
#include "worker/data_leaser.h"
#include "worker/ps_client.h"
#include "worker/step_loop.h"
#include "worker/step_recorder.h"
#include "worker/training_loop.h"

namespace paramserver {

// What the servers hold of a job's model: the PS client routes by it.
struct ServerModel {
  int64_t dense_parameters = 0;
  std::vector<int> embedding_dims;  // one per embedding table
};

// What the daemon hands a job's loop and its end, once the cluster formed. Not owned;
// everything outlives the job.
struct JobEnvironment {
  int rank = 0;  // rank 0 evaluates after every epoch
  int num_workers = 1;
  int64_t start_step = 0;  // PsClient::StartStep
  absl::Duration recovery_timeout = absl::Seconds(30);
  ScalarSink on_scalar;  // the training curves; may be empty
  PsClient* ps = nullptr;
  // data.sharding: dynamic: the scheduler's LeaseData (empty: the fixed ranges).
  LeaseDataCall lease_data;
  // Every embedding table's rows as of `step`, for the final weights' file.
  std::function<absl::StatusOr<std::vector<TableRows>>(int64_t step)> export_tables;
};

// A built-in model's step loop options in `environment` (rank 0 evaluates each epoch).
inline StepLoopOptions StepLoopOptionsFor(const JobEnvironment& environment,
                                          const TrainingSection& training) {
  StepLoopOptions options;
  options.worker_rank = environment.rank;
  options.num_workers = environment.num_workers;
  options.training = training;
  options.evaluate_each_epoch = environment.rank == 0;
  options.start_step = environment.start_step;
  options.recovery_timeout = environment.recovery_timeout;
  options.on_scalar = environment.on_scalar;
  options.lease_data = environment.lease_data;
  return options;
}

// The finisher's evaluation of the final weights: what the result report carries, the
// line logged and reported ("test_accuracy=0.8765", "test_auc=0.7712
// test_logloss=0.4611"), and the curves' last points.
struct FinalEvaluation {
  ReportResultRequest result;
  std::string summary_line;
  std::vector<std::pair<std::string, double>> scalars;
};

// Which test-set figure a job's progress carries after each epoch (the metrics' gauges).
enum class EvaluationFigure { kNone, kAccuracy, kAuc };

// Thread-compatible: the daemon calls it from one thread at a time, in the order above
// (a script's Declare and CreateLoop from the script's thread); figure() and loop()'s
// progress() and Stop() are for any thread.
class ModelJob {
 public:
  virtual ~ModelJob() = default;

  // The training set from `files` (local paths) and the compute on `device`
  // (auto|cpu|gpu|gpu:N): a worker told to use a GPU it cannot have says so here, before
  // it joins. Errors name the file or the device.
  virtual absl::Status LoadTrainingData(const DataSection& files, const std::string& device) = 0;
  // Valid once the model is known (for a script's, once declared).
  virtual ServerModel server_model() const = 0;
  // The test set: rank 0's before training, another worker's once it becomes the
  // finisher. Errors name the file.
  virtual absl::Status LoadTestSet(const DataSection& files) = 0;
  // Makes the training loop, starting at environment.start_step. INVALID_ARGUMENT when
  // the worker's part of the data holds no full batch.
  virtual absl::Status CreateLoop(const JobEnvironment& environment) = 0;
  // Null before CreateLoop.
  virtual TrainingLoop* loop() const = 0;
  // The finisher, after `steps` updates: the final weights (pulled from the servers)
  // evaluated on the test set. The pulls ride out map changes as training's do.
  virtual absl::StatusOr<FinalEvaluation> EvaluateFinal(int64_t steps) = 0;
  // Writes the final weights as of `steps` to `path` (safetensors; the tables' rows too),
  // after EvaluateFinal. Errors name the path.
  virtual absl::Status WriteFinalWeights(int64_t steps, const std::string& path) = 0;
  virtual EvaluationFigure figure() const = 0;
};

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_MODEL_JOB_H_
