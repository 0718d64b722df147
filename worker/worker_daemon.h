// A worker process, wired up: registration, data loading, the PS client, the compute
// backend, the training loop, heartbeats and the end-of-job report.
#ifndef PARAMSERVER_WORKER_WORKER_DAEMON_H_
#define PARAMSERVER_WORKER_WORKER_DAEMON_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/config/cluster_spec.h"
#include "common/config/node_options.h"
#include "common/ops/metrics.h"
#include "common/rpc/cluster_membership.h"
#include "common/rpc/rpc_endpoints.h"
#include "common/security/peer_credentials.h"
#include "worker/grpc_ps_client.h"
#include "worker/model_job.h"
#include "worker/script_job.h"
#include "worker/tensorboard_writer.h"

namespace paramserver {

struct WorkerDaemonOptions : NodeOptions {
  std::string device;  // auto|cpu|gpu|gpu:N; overrides spec.worker.device when set
  // Test only: RPC faults injected into every pull and push (see RpcFaultOptions).
  std::string test_only_rpc_faults;
  // Test only: a wait after the cluster forms, before the first step (a slow start-up).
  absl::Duration test_only_start_delay;
  // How long the rank-0 worker waits for the others to finish before its final evaluation.
  absl::Duration finish_timeout = absl::Hours(1);
};

// Thread-safe.
class WorkerDaemon {
 public:
  // Loads its data, starts its (health-only) RPC server, registers, starts heartbeating
  // (at once: the rest of the start-up may outlast the failure timeout), waits for the
  // cluster to form, and makes its training loop. Errors name the bad file, the
  // unreachable scheduler, ... A stop heard during the start-up (a shutdown, the
  // scheduler lost, the slot taken) ends it with no loop made, and OK: Run() says why.
  // model.type torch: registers and starts heartbeats only; the script's DeclareModel
  // does the rest.
  static absl::StatusOr<std::unique_ptr<WorkerDaemon>> Create(WorkerDaemonOptions options);

  // model.type torch (the Python package's job.register): declares the script's model
  // to the scheduler (the first declaration is the job's; a later one must match it,
  // else FAILED_PRECONDITION naming the tensor), waits for the cluster to form, and,
  // if this worker's values are the job's initial ones, sets them on every dense shard
  // (`initial_values`: layout.dense_parameters() of them). Then script() drives the
  // steps and Run() finishes the job. FAILED_PRECONDITION for a built-in model or a
  // second call.
  absl::Status DeclareModel(const ModelLayout& layout, absl::Span<const float> initial_values);
  // The loop a torch script drives; null before DeclareModel.
  ScriptTrainingLoop* script() const {
    return script_job_ != nullptr ? script_job_->script() : nullptr;
  }
  ~WorkerDaemon();

  // Trains every step and reports to the scheduler. The rank-0 worker then waits for the
  // others, evaluates the final weights, writes output.weights if set, and reports the
  // final test accuracy. Returns the first error, or CANCELLED after Shutdown(). Stopped
  // before a loop was made (above): OK after the scheduler shut the job down or a spot
  // notice, else the reason (the slot taken, the scheduler lost), else CANCELLED.
  //
  // A scheduler outage is ridden out up to RecoveryTimeout(cluster): training goes on
  // (it needs the servers only) and reports to the scheduler are retried. Past it, Run()
  // stops training and returns UNAVAILABLE saying so; a rank-0 worker that has trained
  // every step still evaluates and writes output.weights first, and says it did.
  absl::Status Run();
  // Makes Run() return at the next step. Safe from any thread.
  void Shutdown();

  const std::string& node_name() const { return node_name_; }
  int rank() const { return rank_; }
  // The worker ranks the job may have (cluster.workers, or its range's max).
  int num_workers() const { return num_workers_; }

 private:
  explicit WorkerDaemon(WorkerDaemonOptions options);
  absl::Status Start();
  // Serves health checks, registers with the scheduler: membership_, node_name_, rank_.
  absl::Status JoinCluster();
  // The PS client for the map in `view`, routing `model`.
  absl::Status ConnectToServers(const ClusterView& view, const ServerModel& model);
  // The step this worker starts at (retried while servers install the map).
  absl::StatusOr<int64_t> FindStartStep();
  // The TensorBoard curves' sink (empty without output.tensorboard_dir); the writer's
  // error when the folder cannot be written.
  absl::StatusOr<ScalarSink> MakeScalarSink();
  // The metrics endpoint (--metrics_port), reading progress().
  absl::Status ServeMetrics();
  void StartHeartbeats();
  // What stopped a worker shut down by the scheduler or a spot notice, for its log.
  const char* StoppedByWhom() const;
  // With --watch_spot_interruptions: on a notice, leave the job and stop training.
  void WatchSpotInterruptions();
  // The job's training loop, starting at `start_step` (job_->CreateLoop); the heartbeats
  // and metrics read its progress from then on.
  absl::Status CreateLoop(int64_t start_step);
  // The training loop's progress (empty before a torch script declared its model).
  NodeProgress progress() const;
  // Fills data_: each data.* file's local path, an s3:// one downloaded first into
  // DefaultDownloadFolder(). Errors name the key.
  absl::Status FetchData();
  // As the finisher (rank 0, or the lowest-ranked live worker once rank 0 is lost):
  // waits for the others, evaluates on the test set, writes output.weights and reports.
  absl::Status FinishAsFinisher(const TrainingSummary& summary);
  // The finisher's evaluation (job_->EvaluateFinal) logged, drawn and put in `result`
  // (`summary_line`: "test_accuracy=0.8765", "test_auc=0.7712 test_logloss=0.4611"),
  // then output.weights written.
  absl::Status EvaluateAndSave(const TrainingSummary& summary, ReportResultRequest* result,
                               std::string* summary_line);
  // A worker other than rank 0, done training: returns once the job's result is in,
  // becoming the finisher itself if the scheduler names it.
  absl::Status AwaitJobEnd(const TrainingSummary& summary);
  // Called once by the heartbeat sender when the scheduler has not answered for the
  // recovery timeout: stops training and makes every wait on the scheduler give up.
  void OnSchedulerLost(const absl::Status& why);
  // The heartbeat thread's answer to a refused heartbeat (this worker was declared dead:
  // stopped or cut off past cluster.failure_timeout_ms): registers again, and the
  // training loop continues at the slot's present step once the servers take it back.
  // Another process holding the slot by then (the scheduler offers another name): this
  // worker gives that slot back, stops training and Run() says why.
  void Rejoin(const absl::Status& refusal);
  // Stops the training loop, now or (torch) once it is made.
  void StopTraining();
  // The status OnSchedulerLost was given, or OK while the scheduler answers.
  absl::Status scheduler_lost() const ABSL_LOCKS_EXCLUDED(mu_);
  // Calls `call` until it succeeds, fails with an error other than UNAVAILABLE or
  // DEADLINE_EXCEEDED, the recovery timeout passes (its last error is returned), or the
  // scheduler is declared lost (that status is returned).
  absl::Status RetryWhileSchedulerAway(const std::function<absl::Status()>& call)
      ABSL_LOCKS_EXCLUDED(mu_);

  const WorkerDaemonOptions options_;
  std::string node_name_ = "worker-?";
  int rank_ = -1;
  int num_workers_ = 0;
  RunningServer rpc_;
  std::shared_ptr<CallCredentials>
      credentials_;  // the cluster token and, once registered, this worker's credential
  // Registration, heartbeats and the spot watch; its scheduler() is the scheduler's client.
  std::unique_ptr<ClusterMembership> membership_;
  DataSection data_;  // the data files on this machine (see FetchData)
  std::unique_ptr<GrpcPsClient> ps_client_;
  std::shared_ptr<RpcFaultInjector> ps_client_faults_;  // test only
  std::unique_ptr<TensorBoardWriter> tensorboard_;      // null without output.tensorboard_dir
  // What this worker trains (model.type's job): its loop uses ps_client_, declared before.
  std::unique_ptr<ModelJob> job_;
  ScriptJob* script_job_ = nullptr;  // job_, for model.type torch
  // job_'s loop, for the heartbeat and metrics threads: set once it exists (a torch
  // script's is made by DeclareModel, after the heartbeats start).
  std::atomic<TrainingLoop*> progress_source_{nullptr};
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> shut_down_by_operator_{
      false};  // psctl shutdown or spot notice: Run() returns OK
  std::atomic<bool> left_for_spot_{false};
  std::atomic<bool> job_finished_{false};  // a heartbeat answer said the result is in
  mutable absl::Mutex mu_;
  absl::Status scheduler_lost_ ABSL_GUARDED_BY(mu_);
  absl::Status replaced_ ABSL_GUARDED_BY(mu_);  // Rejoin found the slot taken
  // Set by Rejoin, read by ps_client_ (GrpcPsClientOptions::rejoin_pending).
  const std::shared_ptr<std::atomic<bool>> rejoin_pending_ = std::make_shared<std::atomic<bool>>();
  MetricsRegistry metrics_;
  std::unique_ptr<MetricsHttpServer> metrics_http_;  // reads job_: declared after it
};

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_WORKER_DAEMON_H_
