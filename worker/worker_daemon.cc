#include "worker/worker_daemon.h"

#include <algorithm>
#include <functional>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "common/config/storage_checks.h"
#include "common/model/model_declaration.h"
#include "common/ops/logging.h"
#include "common/ops/process_memory.h"
#include "common/rpc/retry_policy.h"
#include "common/security/security_policy.h"
#include "spdlog/spdlog.h"
#include "worker/ctr_job.h"
#include "worker/mlp_job.h"
#include "worker/recovery.h"
#include "worker/rpc_fault_injector.h"
#include "worker/worker_metrics.h"

namespace paramserver {

absl::StatusOr<std::unique_ptr<WorkerDaemon>> WorkerDaemon::Create(WorkerDaemonOptions options) {
  if (options.scheduler_address.empty())
    options.scheduler_address = options.spec.cluster.scheduler_address;
  std::unique_ptr<WorkerDaemon> daemon(new WorkerDaemon(std::move(options)));
  PS_RETURN_IF_ERROR(daemon->Start());
  return daemon;
}

namespace {

// The job of the spec's model.type; *script is set for a torch script's.
std::unique_ptr<ModelJob> MakeModelJob(const ClusterSpec& spec, ScriptJob** script) {
  switch (spec.model.type) {
    case ModelType::kCtr:
      return std::make_unique<CtrJob>(spec);
    case ModelType::kTorch: {
      auto job = std::make_unique<ScriptJob>(spec);
      *script = job.get();
      return job;
    }
    case ModelType::kMlp:
      break;
  }
  return std::make_unique<MlpJob>(spec);
}

}  // namespace

WorkerDaemon::WorkerDaemon(WorkerDaemonOptions options) : options_(std::move(options)) {
  // In the body: script_job_'s initializer runs after job_'s.
  job_ = MakeModelJob(options_.spec, &script_job_);
}

WorkerDaemon::~WorkerDaemon() {
  // First the heartbeats, whose handlers call back through membership_ (Rejoin): a start
  // that failed after they began destroys the daemon while they run.
  if (membership_ != nullptr) membership_->StopHeartbeats();
  membership_.reset();
  if (rpc_.server != nullptr)
    rpc_.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

absl::Status WorkerDaemon::Start() {
  const ClusterSpec& spec = options_.spec;
  // Check the files before joining the cluster: a bad one should not hold up the others,
  // and an output that cannot be written is better found now than at the end.
  PS_RETURN_IF_ERROR(CheckSpecStorage(spec, StorageUser::kWorker));
  PS_RETURN_IF_ERROR(CheckSpecStorage(spec, StorageUser::kFinisher));
  if (script_job_ != nullptr) {
    // The script declares the model and drives the steps (DeclareModel, script()).
    PS_RETURN_IF_ERROR(JoinCluster());
    PS_RETURN_IF_ERROR(ServeMetrics());
    WatchSpotInterruptions();
    StartHeartbeats();
    return absl::OkStatus();
  }
  PS_RETURN_IF_ERROR(FetchData());
  // A worker told to use a GPU it cannot have says so here, before joining.
  PS_RETURN_IF_ERROR(job_->LoadTrainingData(
      data_, options_.device.empty() ? spec.worker.device : options_.device));
  PS_RETURN_IF_ERROR(JoinCluster());
  // Heard from as soon as registered, as a server is: what follows (rank 0's test set,
  // finding the start step while servers recover) may outlast cluster.failure_timeout_ms,
  // and a silent worker would be declared dead before its first step.
  StartHeartbeats();
  WatchSpotInterruptions();
  // A stop heard from here on (the job shut down, the scheduler lost, the slot taken)
  // ends the start-up at the next of its waits (for the cluster to form, the start step)
  // or between its steps: Run() says why.
  const std::function<bool()> stopped = [this] { return stop_requested_.load(); };
  const absl::Time deadline = absl::Now() + options_.startup_timeout;
  absl::StatusOr<ClusterView> view =
      membership_->scheduler()->WaitForReady(node_name_, deadline, stopped);
  if (stopped()) return absl::OkStatus();
  PS_RETURN_IF_ERROR(view.status());
  num_workers_ = std::max(view->expected_workers(), view->max_workers());
  if (options_.test_only_start_delay > absl::ZeroDuration()) {
    spdlog::warn("TEST ONLY: waiting {} ms before the first step",
                 absl::ToInt64Milliseconds(options_.test_only_start_delay));
    const absl::Time until = absl::Now() + options_.test_only_start_delay;
    while (absl::Now() < until && !stopped()) absl::SleepFor(absl::Milliseconds(10));
  }
  if (stopped()) return absl::OkStatus();
  if (rank_ == 0) PS_RETURN_IF_ERROR(job_->LoadTestSet(data_));
  PS_RETURN_IF_ERROR(ConnectToServers(*view, job_->server_model()));
  const absl::StatusOr<int64_t> start_step = FindStartStep();
  if (stopped()) return absl::OkStatus();
  PS_RETURN_IF_ERROR(start_step.status());
  PS_RETURN_IF_ERROR(CreateLoop(*start_step));
  return ServeMetrics();
}

absl::Status WorkerDaemon::CreateLoop(int64_t start_step) {
  JobEnvironment environment;
  environment.rank = rank_;
  environment.num_workers = num_workers_;
  environment.start_step = start_step;
  environment.recovery_timeout = RecoveryTimeout(options_.spec.cluster);
  PS_ASSIGN_OR_RETURN(environment.on_scalar, MakeScalarSink());
  environment.ps = ps_client_.get();
  environment.export_tables = [this](int64_t step) { return ps_client_->ExportTables(step); };
  // A torch script asks for leases itself (job.batches), its data section its own.
  if (options_.spec.data.sharding == DataSharding::kDynamic ||
      options_.spec.model.type == ModelType::kTorch) {
    environment.lease_data = [this](const LeaseDataRequest& request) {
      LeaseDataRequest named = request;
      named.set_node_name(node_name_);
      return membership_->scheduler()->LeaseData(named);
    };
  }
  PS_RETURN_IF_ERROR(job_->CreateLoop(environment));
  progress_source_.store(job_->loop());
  if (stop_requested_.load()) job_->loop()->Stop();
  return absl::OkStatus();
}

void WorkerDaemon::WatchSpotInterruptions() {
  if (!options_.watch_spot_interruptions) return;
  membership_->WatchSpotInterruptions(
      options_.imds_endpoint, options_.spot_poll_interval, [this](const absl::Status& left) {
        if (!left.ok()) spdlog::error("could not leave the job cleanly: {}", left.ToString());
        left_for_spot_ = true;
        if (!shut_down_by_operator_.exchange(true)) Shutdown();
      });
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
  MembershipOptions membership;
  membership.scheduler_address = options_.scheduler_address;
  membership.role = NODE_ROLE_WORKER;
  membership.advertised_address = advertised;
  membership.rpc_timeout = absl::Milliseconds(spec.cluster.failure_timeout_ms);
  membership.heartbeat_interval = absl::Milliseconds(spec.cluster.heartbeat_interval_ms);
  membership.credentials = credentials_;
  PS_ASSIGN_OR_RETURN(membership_, ClusterMembership::Join(std::move(membership),
                                                           absl::Now() + options_.startup_timeout));
  node_name_ = membership_->node_name();
  rank_ = membership_->rank();
  // Fixed data ranges are cut by the range's max: a rank's share is the same whoever
  // else is present (the shares of ranks nobody holds are not trained).
  num_workers_ = WorkerSlots(spec.cluster);
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

absl::Status WorkerDaemon::ConnectToServers(const ClusterView& view, const ServerModel& model) {
  const ClusterSpec& spec = options_.spec;
  GrpcPsClientOptions client_options;
  client_options.worker_rank = rank_;
  client_options.credentials = credentials_;
  client_options.rejoin_pending = rejoin_pending_;
  client_options.total_parameters = model.dense_parameters;
  client_options.embedding_dims = model.embedding_dims;
  client_options.wire_dtype = spec.training.wire_dtype;
  client_options.async_tables = spec.training.async_tables;
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
  client_options.await_map = [this](int64_t epoch,
                                    absl::Duration wait) -> absl::StatusOr<ShardMap> {
    PS_ASSIGN_OR_RETURN(ClusterView latest,
                        membership_->scheduler()->AwaitMapChange(node_name_, epoch, wait));
    return latest.shard_map();
  };
  PS_ASSIGN_OR_RETURN(
      ps_client_,
      GrpcPsClient::Create(client_options, view.shard_map(), [this]() -> absl::StatusOr<ShardMap> {
        PS_ASSIGN_OR_RETURN(ClusterView latest,
                            membership_->scheduler()->GetClusterView(node_name_));
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
  while (!start_step.ok() && !stop_requested_.load() && backoff.CanRetryBefore(give_up)) {
    backoff.Wait();
    if (ps_client_->RefreshShardMap().ok()) start_step = ps_client_->StartStep();
  }
  return start_step;
}

absl::Status WorkerDaemon::ServeMetrics() {
  const SecuritySection& security = options_.spec.security;
  metrics_.AddScrapedFamilies([this] { return WorkerMetricFamilies(progress(), job_->figure()); });
  AddProcessMemoryMetrics(&metrics_);
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
  membership_->StartHeartbeats(HeartbeatHandlers{
      [this] {
        HeartbeatRequest request;
        *request.mutable_progress() = progress();
        return request;
      },
      [this](const HeartbeatResponse& response) {
        if (response.job_finished()) job_finished_.store(true);
        if (response.shutdown() && !shut_down_by_operator_.exchange(true)) {
          spdlog::warn(
              "the scheduler shut the job down (psctl shutdown, or a loss it cannot recover "
              "from: its log says which); stopping");
          Shutdown();
        }
      },
      [this](const absl::Status& refusal) { Rejoin(refusal); },
      SchedulerOutagePolicy{RecoveryTimeout(options_.spec.cluster),
                            [this](const absl::Status& why) { OnSchedulerLost(why); }}});
}

absl::Status WorkerDaemon::DeclareModel(const ModelLayout& layout,
                                        absl::Span<const float> initial_values) {
  const ClusterSpec& spec = options_.spec;
  if (script_job_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this job trains the spec's model (model.type ", ModelTypeName(spec.model.type),
        "); a script declares its own only with model.type torch"));
  }
  PS_RETURN_IF_ERROR(script_job_->Declare(layout, initial_values));
  DeclareModelRequest request;
  request.set_node_name(node_name_);
  *request.mutable_model() = DeclarationOf(layout);
  DeclareModelResponse declared;
  PS_RETURN_IF_ERROR(RetryWhileSchedulerAway([&]() -> absl::Status {
    PS_ASSIGN_OR_RETURN(declared, membership_->scheduler()->DeclareModel(request));
    return absl::OkStatus();
  }));
  spdlog::info("declared the model: {} tensors, {} parameters, {} embedding tables{}",
               layout.dense_tensors().size(), layout.dense_parameters(),
               layout.embedding_tables().size(),
               declared.sets_initial_values() ? "; its values are the job's initial ones" : "");
  // A stop heard meanwhile (the heartbeats run since Start) ends the wait: CANCELLED to the
  // script, and Run() says why.
  PS_ASSIGN_OR_RETURN(ClusterView view, membership_->scheduler()->WaitForReady(
                                            node_name_, absl::Now() + options_.startup_timeout,
                                            [this] { return stop_requested_.load(); }));
  num_workers_ = std::max(view.expected_workers(), view.max_workers());
  PS_RETURN_IF_ERROR(ConnectToServers(view, script_job_->server_model()));
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
  return CreateLoop(start_step);
}

void WorkerDaemon::OnSchedulerLost(const absl::Status& why) {
  spdlog::error("{}; giving up on it", std::string(why.message()));
  {
    absl::MutexLock lock(&mu_);
    scheduler_lost_ = why;
  }
  StopTraining();
}

void WorkerDaemon::Rejoin(const absl::Status& refusal) {
  {
    absl::MutexLock lock(&mu_);
    if (!replaced_.ok()) return;  // tried once: the slot is another's
  }
  spdlog::warn("the scheduler refused our heartbeat ({}); registering again",
               std::string(refusal.message()));
  // Set before registering: the map that takes this worker back is published before the
  // registration answers, and the training thread may refresh to it first.
  rejoin_pending_->store(true);
  std::string other_slot;
  const absl::StatusOr<RegisterResponse> registered =
      membership_->Rejoin(absl::Now() + RecoveryTimeout(options_.spec.cluster), &other_slot);
  if (registered.ok()) {
    spdlog::info("admitted again as {}; training goes on at the job's present step", node_name_);
    return;
  }
  rejoin_pending_->store(false);
  if (other_slot.empty() && registered.status().code() != absl::StatusCode::kResourceExhausted) {
    // The scheduler away, say: the next refused heartbeat tries again (the training
    // loop's recovery timeout bounds the wait).
    spdlog::warn("could not register again: {}; trying at the next heartbeat",
                 registered.status().ToString());
    return;
  }
  if (!other_slot.empty()) {
    // Registering took a vacant slot this process cannot act as (its data, its steps):
    // give it back for a process started for it.
    const absl::Status left = membership_->scheduler()
                                  ->Leave(other_slot, "not taken: " + node_name_ + " rejoining")
                                  .status();
    if (!left.ok()) spdlog::warn("could not give {} back: {}", other_slot, left.ToString());
  }
  const absl::Status replaced = absl::FailedPreconditionError(
      absl::StrCat(node_name_, " was declared dead and could not take its slot back (",
                   registered.status().message(), "): another process trains it"));
  spdlog::error("{}; stopping", std::string(replaced.message()));
  {
    absl::MutexLock lock(&mu_);
    replaced_ = replaced;
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

const char* WorkerDaemon::StoppedByWhom() const {
  return left_for_spot_.load() ? "left the job on a spot interruption notice"
                               : "stopped: the scheduler shut the job down";
}

absl::Status WorkerDaemon::Run() {
  if (job_->loop() == nullptr && stop_requested_.load()) {
    // Stopped during the start-up (Start), before a loop was made.
    if (shut_down_by_operator_.load()) {
      spdlog::info("{} before the first step", StoppedByWhom());
      return absl::OkStatus();
    }
    absl::MutexLock lock(&mu_);
    if (!replaced_.ok()) return replaced_;
    if (!scheduler_lost_.ok()) return scheduler_lost_;
    return absl::CancelledError("stopped before the first step");
  }
  if (job_->loop() == nullptr) {
    return absl::FailedPreconditionError(
        "the script never declared its model (job.register), so there is nothing to finish");
  }
  absl::StatusOr<TrainingSummary> trained = job_->loop()->Run();
  if (!trained.ok() && shut_down_by_operator_.load()) {
    spdlog::info("{}: {}", StoppedByWhom(), std::string(trained.status().message()));
    return absl::OkStatus();
  }
  if (!trained.ok()) {
    absl::MutexLock lock(&mu_);
    if (!replaced_.ok()) return replaced_;
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
  if (summary.longest_step >= 0) {
    spdlog::info("step_times median_ms={:.3f} longest_ms={:.3f} at step {} ({:.1f}x the median)",
                 summary.median_step_seconds * 1e3, summary.longest_step_seconds * 1e3,
                 summary.longest_step,
                 summary.longest_step_seconds / std::max(1e-9, summary.median_step_seconds));
  }
  if (const RpcFaultInjector* faults = ps_client_faults_.get(); faults != nullptr) {
    spdlog::info("injected faults: {} requests dropped, {} responses dropped",
                 faults->dropped_requests(), faults->dropped_responses());
  }
  ReportFinishedRequest finished;
  finished.set_node_name(node_name_);
  finished.set_steps(summary.steps);
  finished.set_samples(summary.samples);
  finished.set_seconds(summary.seconds);
  const absl::Status reported = RetryWhileSchedulerAway(
      [&] { return membership_->scheduler()->ReportFinished(finished).status(); });
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
