#include "worker/worker_daemon.h"

#include <algorithm>
#include <functional>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/embedding_init.h"
#include "common/logging.h"
#include "common/mlp_parameters.h"
#include "common/model_declaration.h"
#include "common/retry_policy.h"
#include "common/s3_file_system.h"
#include "common/safetensors.h"
#include "common/security_policy.h"
#include "common/status_macros.h"
#include "common/storage_checks.h"
#include "spdlog/spdlog.h"
#include "worker/device_selection.h"
#include "worker/recovery.h"
#include "worker/rpc_fault_injector.h"

namespace paramserver {

absl::StatusOr<std::unique_ptr<WorkerDaemon>> WorkerDaemon::Create(WorkerDaemonOptions options) {
  if (options.scheduler_address.empty())
    options.scheduler_address = options.spec.cluster.scheduler_address;
  std::unique_ptr<WorkerDaemon> daemon(new WorkerDaemon(std::move(options)));
  PS_RETURN_IF_ERROR(daemon->Start());
  return daemon;
}

WorkerDaemon::WorkerDaemon(WorkerDaemonOptions options) : options_(std::move(options)) {}

WorkerDaemon::~WorkerDaemon() {
  heartbeats_.reset();
  if (rpc_.server != nullptr)
    rpc_.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

absl::Status WorkerDaemon::Start() {
  const ClusterSpec& spec = options_.spec;
  const MlpLayout layout(spec.model.layers);
  const bool ctr = spec.model.type == ModelType::kCtr;
  const bool torch = spec.model.type == ModelType::kTorch;
  // Check the files before joining the cluster: a bad one should not hold up the others,
  // and an output that cannot be written is better found now than at the end.
  PS_RETURN_IF_ERROR(CheckSpecStorage(spec, StorageUser::kWorker));
  PS_RETURN_IF_ERROR(CheckSpecStorage(spec, StorageUser::kFinisher));
  if (torch) {
    // The script declares the model and drives the steps (DeclareModel, script()).
    PS_RETURN_IF_ERROR(JoinCluster());
    PS_RETURN_IF_ERROR(ServeMetrics());
    WatchSpotInterruptions();
    StartHeartbeats();
    return absl::OkStatus();
  }
  PS_RETURN_IF_ERROR(FetchData());
  PS_RETURN_IF_ERROR(LoadTrainingData());
  PS_RETURN_IF_ERROR(JoinCluster());
  const absl::Time deadline = absl::Now() + options_.startup_timeout;
  PS_ASSIGN_OR_RETURN(ClusterView view, scheduler_->WaitForReady(node_name_, deadline));
  num_workers_ = view.expected_workers();
  if (rank_ == 0) PS_RETURN_IF_ERROR(LoadTestSet());
  std::vector<int> embedding_dims;
  if (ctr) embedding_dims.assign(spec.model.categorical_features, spec.model.embedding_dim);
  PS_RETURN_IF_ERROR(ConnectToServers(view, layout.total_parameters(), embedding_dims));
  PS_ASSIGN_OR_RETURN(const int64_t start_step, FindStartStep());

  PS_RETURN_IF_ERROR(CreateTrainer(start_step));
  progress_source_.store(trainer_.get());
  PS_RETURN_IF_ERROR(ServeMetrics());
  WatchSpotInterruptions();
  StartHeartbeats();
  return absl::OkStatus();
}

absl::Status WorkerDaemon::CreateTrainer(int64_t start_step) {
  const ClusterSpec& spec = options_.spec;
  TrainerOptions trainer_options;
  trainer_options.worker_rank = rank_;
  trainer_options.num_workers = num_workers_;
  trainer_options.training = spec.training;
  trainer_options.evaluate_each_epoch = rank_ == 0;
  trainer_options.recovery_timeout = RecoveryTimeout(spec.cluster);
  PS_ASSIGN_OR_RETURN(trainer_options.on_scalar, MakeScalarSink());
  trainer_options.start_step = start_step;
  if (spec.model.type == ModelType::kCtr) {
    CtrTrainerOptions ctr_options;
    ctr_options.worker_rank = rank_;
    ctr_options.num_workers = num_workers_;
    ctr_options.training = spec.training;
    ctr_options.shape = {spec.model.dense_features, spec.model.categorical_features,
                         spec.model.embedding_dim, spec.model.layers};
    ctr_options.evaluate_each_epoch = rank_ == 0;
    ctr_options.start_step = start_step;
    ctr_options.recovery_timeout = trainer_options.recovery_timeout;
    ctr_options.on_scalar = trainer_options.on_scalar;
    PS_ASSIGN_OR_RETURN(
        std::unique_ptr<CtrTrainer> trainer,
        CtrTrainer::Create(ctr_options, &ctr_train_, rank_ == 0 ? &ctr_test_ : nullptr,
                           ps_client_.get(), ctr_compute_.get()));
    ctr_trainer_ = trainer.get();
    trainer_ = std::move(trainer);
  } else {
    PS_ASSIGN_OR_RETURN(
        std::unique_ptr<Trainer> trainer,
        Trainer::Create(trainer_options, MlpLayout(spec.model.layers), &train_,
                        rank_ == 0 ? &test_ : nullptr, ps_client_.get(), backend_.get()));
    mlp_trainer_ = trainer.get();
    trainer_ = std::move(trainer);
  }
  return absl::OkStatus();
}

void WorkerDaemon::WatchSpotInterruptions() {
  if (options_.watch_spot_interruptions) {
    spot_watcher_ = std::make_unique<SpotInterruptionWatcher>(
        InstanceMetadataClient(options_.imds_endpoint), options_.spot_poll_interval,
        [this](const std::string& notice) {
          absl::StatusOr<LeaveResponse> left =
              scheduler_->Leave(node_name_, "spot interruption: " + notice);
          if (!left.ok())
            spdlog::error("could not leave the job cleanly: {}", left.status().ToString());
          left_for_spot_ = true;
          if (!shut_down_by_operator_.exchange(true)) Shutdown();
        });
  }
}

absl::Status WorkerDaemon::JoinCluster() {
  const ClusterSpec& spec = options_.spec;
  // Only the health service: requests are a few bytes.
  PS_ASSIGN_OR_RETURN(rpc_, StartRpcServer(options_.listen_address, {},
                                           /*max_receive_bytes=*/64 << 10));
  PS_ASSIGN_OR_RETURN(const std::string advertised,
                      ResolveAdvertisedAddress(options_.advertise_address, options_.listen_address,
                                               rpc_.port, options_.imds_endpoint));
  PS_ASSIGN_OR_RETURN(const std::string cluster_token, ReadClusterToken(spec.security));
  PS_RETURN_IF_ERROR(CheckListenAddressIsSafe(options_.listen_address, spec.security));
  credentials_ = std::make_shared<CallCredentials>(cluster_token);
  scheduler_ = std::make_unique<SchedulerClient>(
      options_.scheduler_address, absl::Milliseconds(spec.cluster.failure_timeout_ms),
      credentials_);
  PS_ASSIGN_OR_RETURN(
      RegisterResponse registered,
      scheduler_->Register(NODE_ROLE_WORKER, advertised, absl::Now() + options_.startup_timeout));
  node_name_ = registered.node_name();
  rank_ = registered.rank();
  num_workers_ = spec.cluster.workers;
  spdlog::info(
      "registered with the scheduler at {} as {} (rank {}); this node's lines are "
      "tagged [{}] from here on",
      options_.scheduler_address, node_name_, rank_, node_name_);
  SetLogNodeName(node_name_);
  return absl::OkStatus();
}

absl::StatusOr<ScalarSink> WorkerDaemon::MakeScalarSink() {
  if (tensorboard_ == nullptr && !options_.spec.output.tensorboard_dir.empty()) {
    PS_ASSIGN_OR_RETURN(tensorboard_, TensorBoardWriter::Create(absl::StrCat(
                                          options_.spec.output.tensorboard_dir, "/", node_name_)));
    spdlog::info("writing training curves for TensorBoard to {}", tensorboard_->path());
  }
  if (tensorboard_ == nullptr) return ScalarSink();
  return [this](const std::string& tag, int64_t step, double value) {
    absl::Status written = tensorboard_->WriteScalar(tag, step, value);
    if (!written.ok()) spdlog::warn("{}", written.ToString());
  };
}

absl::Status WorkerDaemon::ConnectToServers(const ClusterView& view, int64_t total_parameters,
                                            std::vector<int> embedding_dims) {
  const ClusterSpec& spec = options_.spec;
  GrpcPsClientOptions client_options;
  client_options.worker_rank = rank_;
  client_options.credentials = credentials_;
  client_options.total_parameters = total_parameters;
  client_options.embedding_dims = std::move(embedding_dims);
  client_options.wire_dtype = spec.training.wire_dtype;
  client_options.push_bucket_values = spec.training.push_bucket_kb * 1024 / sizeof(float);
  // Short RPC deadlines: a call to a server that stopped answering (SIGSTOP, a cut
  // link) ends soon after the scheduler has replaced it; a pull that merely waits for
  // slower workers is re-issued.
  const absl::Duration rpc_deadline =
      std::max(absl::Milliseconds(500), absl::Milliseconds(spec.cluster.failure_timeout_ms) / 2);
  client_options.push_timeout = rpc_deadline;
  client_options.pull_timeout = rpc_deadline;
  if (!options_.test_only_rpc_faults.empty()) {
    PS_ASSIGN_OR_RETURN(RpcFaultOptions faults,
                        ParseRpcFaultOptions(options_.test_only_rpc_faults));
    client_options.faults = std::make_shared<RpcFaultInjector>(faults);
    ps_client_faults_ = client_options.faults;
    spdlog::warn("TEST ONLY: injecting RPC faults: {}", options_.test_only_rpc_faults);
  }
  PS_ASSIGN_OR_RETURN(
      ps_client_,
      GrpcPsClient::Create(client_options, view.shard_map(), [this]() -> absl::StatusOr<ShardMap> {
        PS_ASSIGN_OR_RETURN(ClusterView latest, scheduler_->GetClusterView(node_name_));
        return latest.shard_map();
      }));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> WorkerDaemon::FindStartStep() {
  // A fresh job starts at 0; a resumed one at its checkpoint; a worker replacing a dead
  // one at the cluster's present step. Servers may still be installing the map: retry.
  absl::StatusOr<int64_t> start_step = ps_client_->StartStep();
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  ExponentialBackoff backoff({absl::Milliseconds(100), absl::Milliseconds(100)});
  while (!start_step.ok() && backoff.CanRetryBefore(give_up)) {
    backoff.Wait();
    if (ps_client_->RefreshShardMap().ok()) start_step = ps_client_->StartStep();
  }
  return start_step;
}

absl::Status WorkerDaemon::ServeMetrics() {
  const SecuritySection& security = options_.spec.security;
  // One metric per unit (docs/OPERATIONS.md lists the names each replaced).
  const auto progress_gauge = [this](const char* name, const char* help,
                                     std::function<double(const NodeProgress&)> read) {
    metrics_.AddGauge(name, help, [this, read] {
      return std::vector<std::pair<MetricLabels, double>>{{{}, read(progress())}};
    });
  };
  progress_gauge("worker_step", "Steps this worker has trained (the next step's number).",
                 [](const NodeProgress& p) { return static_cast<double>(p.step()); });
  progress_gauge("worker_total_steps", "Steps this worker trains in all.",
                 [](const NodeProgress& p) { return static_cast<double>(p.total_steps()); });
  progress_gauge("worker_epoch", "The training epoch (pass over the data) this worker is in.",
                 [](const NodeProgress& p) { return static_cast<double>(p.epoch()); });
  progress_gauge("worker_loss", "The last step's mean training loss (cross-entropy; ctr: BCE).",
                 [](const NodeProgress& p) { return p.loss(); });
  progress_gauge("worker_samples_per_second",
                 "Training samples per second since this worker began.",
                 [](const NodeProgress& p) { return p.samples_per_sec(); });
  metrics_.AddGauge(
      "worker_test_accuracy",
      "The latest test-set accuracy this worker evaluated (rank 0, after each epoch); "
      "absent until the first.",
      [this] {
        const NodeProgress now = progress();
        std::vector<std::pair<MetricLabels, double>> samples;
        if (now.accuracy_step() > 0 && mlp_trainer_ != nullptr)
          samples.push_back({{}, now.test_accuracy()});
        return samples;
      });
  metrics_.AddGauge("worker_test_auc",
                    "A ctr model's latest test-set AUC (rank 0, after each epoch); absent until "
                    "the first.",
                    [this] {
                      const NodeProgress now = progress();
                      std::vector<std::pair<MetricLabels, double>> samples;
                      if (now.accuracy_step() > 0 && ctr_trainer_ != nullptr)
                        samples.push_back({{}, now.test_auc()});
                      return samples;
                    });
  PS_ASSIGN_OR_RETURN(metrics_http_,
                      MaybeServeMetrics(options_.metrics_port, options_.metrics_host, &metrics_, {},
                                        HttpsFiles{security.tls_cert, security.tls_key}));
  return absl::OkStatus();
}

NodeProgress WorkerDaemon::progress() const {
  const TrainingLoop* loop = progress_source_.load();
  return loop != nullptr ? loop->progress() : NodeProgress();
}

void WorkerDaemon::StartHeartbeats() {
  const ClusterSpec& spec = options_.spec;
  heartbeats_ = std::make_unique<HeartbeatSender>(
      scheduler_.get(), node_name_, absl::Milliseconds(spec.cluster.heartbeat_interval_ms),
      [this] {
        HeartbeatRequest request;
        *request.mutable_progress() = progress();
        return request;
      },
      [this](const HeartbeatResponse& response) {
        if (response.job_finished()) job_finished_.store(true);
        if (response.shutdown() && !shut_down_by_operator_.exchange(true)) {
          spdlog::warn("an operator shut the job down; stopping");
          Shutdown();
        }
      },
      /*on_refused=*/nullptr,
      SchedulerOutagePolicy{RecoveryTimeout(spec.cluster),
                            [this](const absl::Status& why) { OnSchedulerLost(why); }});
}

absl::Status WorkerDaemon::DeclareModel(const ModelLayout& layout,
                                        absl::Span<const float> initial_values) {
  const ClusterSpec& spec = options_.spec;
  if (spec.model.type != ModelType::kTorch) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this job trains the spec's model (model.type ", ModelTypeName(spec.model.type),
        "); a script declares its own only with model.type torch"));
  }
  if (script_loop_ != nullptr) {
    return absl::FailedPreconditionError("the model is declared already (register once)");
  }
  if (initial_values.size() != static_cast<size_t>(layout.dense_parameters())) {
    return absl::InvalidArgumentError(absl::StrCat(initial_values.size(),
                                                   " initial values for a model of ",
                                                   layout.dense_parameters(), " parameters"));
  }
  if (!spec.model.init_from.empty()) {
    // The file must hold this model, named and shaped as declared: said here, by name,
    // rather than by a server at placement.
    PS_RETURN_IF_ERROR(LoadDenseParameters(layout, spec.model.init_from).status());
  }
  DeclareModelRequest request;
  request.set_node_name(node_name_);
  *request.mutable_model() = DeclarationOf(layout);
  DeclareModelResponse declared;
  PS_RETURN_IF_ERROR(RetryWhileSchedulerAway([&]() -> absl::Status {
    PS_ASSIGN_OR_RETURN(declared, scheduler_->DeclareModel(request));
    return absl::OkStatus();
  }));
  spdlog::info("declared the model: {} tensors, {} parameters, {} embedding tables{}",
               layout.dense_tensors().size(), layout.dense_parameters(),
               layout.embedding_tables().size(),
               declared.sets_initial_values() ? "; its values are the job's initial ones" : "");
  PS_ASSIGN_OR_RETURN(ClusterView view,
                      scheduler_->WaitForReady(node_name_, absl::Now() + options_.startup_timeout));
  num_workers_ = view.expected_workers();
  std::vector<int> embedding_dims;
  for (const EmbeddingTableSlot& table : layout.embedding_tables())
    embedding_dims.push_back(static_cast<int>(table.dim));
  PS_RETURN_IF_ERROR(ConnectToServers(view, layout.dense_parameters(), embedding_dims));
  if (declared.sets_initial_values()) {
    std::optional<absl::Time> give_up_at;
    while (true) {
      const absl::Status set = ps_client_->SetInitialValues(initial_values);
      if (set.ok()) break;
      PS_RETURN_IF_ERROR(WaitForRecovery(ps_client_.get(), set, /*step=*/0,
                                         RecoveryTimeout(spec.cluster), &give_up_at)
                             .status());
    }
  }
  PS_ASSIGN_OR_RETURN(const int64_t start_step, FindStartStep());
  ScriptTrainingOptions loop_options;
  loop_options.total_parameters = layout.dense_parameters();
  loop_options.embedding_tables = static_cast<int>(layout.embedding_tables().size());
  loop_options.training = spec.training;
  loop_options.start_step = start_step;
  loop_options.recovery_timeout = RecoveryTimeout(spec.cluster);
  PS_ASSIGN_OR_RETURN(loop_options.on_scalar, MakeScalarSink());
  auto loop = std::make_unique<ScriptTrainingLoop>(loop_options, ps_client_.get());
  script_loop_ = loop.get();
  declared_layout_ = layout;
  trainer_ = std::move(loop);
  progress_source_.store(trainer_.get());
  if (stop_requested_.load()) trainer_->Stop();
  return absl::OkStatus();
}

void WorkerDaemon::OnSchedulerLost(const absl::Status& why) {
  spdlog::error("{}; giving up on it", std::string(why.message()));
  {
    absl::MutexLock lock(&mu_);
    scheduler_lost_ = why;
  }
  StopTraining();
}

void WorkerDaemon::StopTraining() {
  stop_requested_.store(true);
  // A torch worker's loop may not exist yet: DeclareModel stops it once made.
  if (TrainingLoop* loop = progress_source_.load(); loop != nullptr) loop->Stop();
}

absl::Status WorkerDaemon::scheduler_lost() const {
  absl::MutexLock lock(&mu_);
  return scheduler_lost_;
}

absl::Status WorkerDaemon::RetryWhileSchedulerAway(const std::function<absl::Status()>& call) {
  absl::Time next_log = absl::Now();
  // The heartbeats declare the scheduler lost within the recovery timeout of its last
  // answer; this deadline also ends a scheduler that answers heartbeats but not this.
  const absl::Time give_up = absl::Now() + RecoveryTimeout(options_.spec.cluster);
  while (true) {
    const absl::Status status = call();
    if (status.ok() ||
        (status.code() != absl::StatusCode::kUnavailable &&
         status.code() != absl::StatusCode::kDeadlineExceeded) ||
        absl::Now() >= give_up) {
      return status;
    }
    if (absl::Now() >= next_log) {
      spdlog::warn(
          "{}; retrying while the scheduler is away (for up to cluster.recovery_timeout_ms)",
          std::string(status.message()));
      next_log = absl::Now() + absl::Seconds(10);
    }
    {
      absl::MutexLock lock(&mu_);
      auto lost = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !scheduler_lost_.ok(); };
      if (mu_.AwaitWithTimeout(absl::Condition(&lost), absl::Milliseconds(500)))
        return scheduler_lost_;
    }
  }
}

absl::Status WorkerDaemon::Run() {
  if (trainer_ == nullptr) {
    return absl::FailedPreconditionError(
        "the script never declared its model (job.register), so there is nothing to finish");
  }
  absl::StatusOr<TrainingSummary> trained = trainer_->Run();
  if (!trained.ok() && shut_down_by_operator_.load()) {
    spdlog::info("{}: {}",
                 left_for_spot_.load() ? "left the job on a spot interruption notice"
                                       : "shut down by the operator",
                 std::string(trained.status().message()));
    return absl::OkStatus();
  }
  if (absl::Status lost = scheduler_lost(); !trained.ok() && !lost.ok()) {
    // Not every step was trained: these weights are not the job's, and none are written.
    return absl::UnavailableError(
        absl::StrCat(lost.message(), "; training ", trained.status().message(),
                     ", before its last step: no weights were written (the servers' "
                     "checkpoints hold the newest state)"));
  }
  PS_ASSIGN_OR_RETURN(TrainingSummary summary, std::move(trained));
  spdlog::info("finished {} steps, {} samples in {:.1f} s ({:.0f} samples/s)", summary.steps,
               summary.samples, summary.seconds, summary.samples / std::max(1e-9, summary.seconds));
  const double per_step_ms = 1e3 / std::max<int64_t>(1, summary.steps_run);
  spdlog::info(
      "step_profile pull_ms={:.3f} compute_ms={:.3f} push_ms={:.3f} other_ms={:.3f} "
      "early_push_buckets={:.2f} (mean per step)",
      summary.pull_seconds * per_step_ms, summary.compute_seconds * per_step_ms,
      summary.push_seconds * per_step_ms,
      (summary.seconds - summary.pull_seconds - summary.compute_seconds - summary.push_seconds) *
          per_step_ms,
      static_cast<double>(summary.early_push_buckets) / std::max<int64_t>(1, summary.steps_run));
  if (const RpcFaultInjector* faults = ps_client_faults_.get(); faults != nullptr) {
    spdlog::info("injected faults: {} requests dropped, {} responses dropped",
                 faults->dropped_requests(), faults->dropped_responses());
  }
  ReportFinishedRequest finished;
  finished.set_node_name(node_name_);
  finished.set_steps(summary.steps);
  finished.set_samples(summary.samples);
  finished.set_seconds(summary.seconds);
  const absl::Status reported =
      RetryWhileSchedulerAway([&] { return scheduler_->ReportFinished(finished).status(); });
  if (rank_ == 0) return FinishAsFinisher(summary);
  if (!reported.ok() && !scheduler_lost().ok()) {
    return absl::UnavailableError(absl::StrCat(reported.message(), "; this worker trained all its ",
                                               summary.steps, " steps, but could not report them"));
  }
  PS_RETURN_IF_ERROR(reported);
  return AwaitJobEnd(summary);
}

void WorkerDaemon::Shutdown() { StopTraining(); }

}  // namespace paramserver
