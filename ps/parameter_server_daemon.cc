#include "ps/parameter_server_daemon.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/config/storage_checks.h"
#include "common/files/s3_file_system.h"
#include "common/ops/logging.h"
#include "common/ops/process_memory.h"
#include "common/rpc/rpc_endpoints.h"
#include "common/security/security_policy.h"
#include "common/security/shard_map_signature.h"
#include "spdlog/spdlog.h"

namespace paramserver {

absl::StatusOr<std::unique_ptr<ParameterServerDaemon>> ParameterServerDaemon::Create(
    ParameterServerDaemonOptions options) {
  if (options.scheduler_address.empty())
    options.scheduler_address = options.spec.cluster.scheduler_address;
  PS_ASSIGN_OR_RETURN(HostedModel model, HostedModelFromSpec(options.spec));
  PS_ASSIGN_OR_RETURN(std::string cluster_token, ReadClusterToken(options.spec.security));
  PS_RETURN_IF_ERROR(CheckListenAddressIsSafe(options.listen_address, options.spec.security));
  std::unique_ptr<ParameterServerDaemon> daemon(
      new ParameterServerDaemon(std::move(options), std::move(model)));
  daemon->credentials_ = std::make_shared<CallCredentials>(cluster_token);
  daemon->callers_ =
      std::make_unique<CallerVerifier>(cluster_token, daemon->known_nodes_.AsLookup());
  PS_RETURN_IF_ERROR(daemon->Start());
  return daemon;
}

ParameterServerDaemon::ParameterServerDaemon(ParameterServerDaemonOptions options,
                                             HostedModel model)
    : options_(std::move(options)), model_(std::move(model)) {}

ParameterServerDaemon::~ParameterServerDaemon() {
  // Heartbeats first, while membership_ is still set: a callback in flight (a newer map,
  // a rejoin) calls through it.
  if (membership_ != nullptr) membership_->StopHeartbeats();
  if (catch_up_thread_.joinable()) catch_up_thread_.join();  // it calls through membership_
  membership_.reset();
  if (service_ != nullptr) service_->CloseShards();
  if (rpc_.server != nullptr)
    rpc_.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  host_.reset();         // before what it points to
  checkpoints_.reset();  // writes what is queued
}

absl::Status ParameterServerDaemon::Start() {
  const ClusterSpec& spec = options_.spec;
  PS_RETURN_IF_ERROR(CheckSpecStorage(spec, StorageUser::kServer));
  if (!spec.checkpoint.dir.empty()) {
    checkpoints_ = std::make_unique<CheckpointWriter>(spec.checkpoint.dir, spec.checkpoint.keep,
                                                      FileSystemFor(spec.checkpoint.dir));
  }
  // A pull waits at most this long for the step it asks for (sync, ssp).
  service_ = std::make_unique<ParameterServerServiceImpl>(
      callers_.get(), absl::Seconds(60), checkpoints_.get(), &metrics_,
      ParameterServerServiceImpl::kDefaultMaxWaitingPulls, options_.replica_apply_hold);
  metrics_.AddScrapedFamilies([this] { return ServerMetricFamilies(Figures()); });
  AddProcessMemoryMetrics(&metrics_);
  PS_ASSIGN_OR_RETURN(rpc_, StartRpcServer(options_.listen_address, service_->rpc_services()));
  PS_ASSIGN_OR_RETURN(metrics_http_,
                      MaybeServeMetrics(options_.metrics_port, options_.metrics_host, &metrics_, {},
                                        HttpsFiles{spec.security.tls_cert, spec.security.tls_key}));
  MembershipOptions membership;
  membership.scheduler_address = options_.scheduler_address;
  membership.role = NODE_ROLE_SERVER;
  PS_ASSIGN_OR_RETURN(membership.advertised_address,
                      ResolveAdvertisedAddress(options_.advertise_address, options_.listen_address,
                                               rpc_.port, options_.imds_endpoint));
  membership.rpc_timeout = absl::Milliseconds(spec.cluster.failure_timeout_ms);
  membership.heartbeat_interval = absl::Milliseconds(spec.cluster.heartbeat_interval_ms);
  membership.credentials = credentials_;
  const absl::Time deadline = absl::Now() + options_.startup_timeout;
  const absl::Time registering_since = absl::Now();
  PS_ASSIGN_OR_RETURN(membership_, ClusterMembership::Join(std::move(membership), deadline));
  const RegisterResponse& registered = membership_->registration();
  known_nodes_.SetScheduler(registered.scheduler_token_sha256(), registered.scheduler_map_key());
  node_name_ = registered.node_name();
  // A primary acknowledges alone (its backups all copying) only within half the failure
  // timeout of a heartbeat the scheduler answered: it is not declared dead meanwhile.
  replication_links_ =
      std::make_unique<ReplicationLinks>(node_name_, absl::Seconds(2), credentials_,
                                         absl::Milliseconds(spec.cluster.failure_timeout_ms) / 2);
  replication_links_->RenewLease(registering_since);
  PS_ASSIGN_OR_RETURN(ClusterView view,
                      membership_->scheduler()->WaitForReady(node_name_, deadline));
  ShardHostParts parts;
  parts.service = service_.get();
  parts.checkpoints = checkpoints_.get();
  parts.replication_links = replication_links_.get();
  parts.known_nodes = &known_nodes_;
  parts.credentials = credentials_;
  parts.refusals = refusals_;
  host_ = std::make_unique<ShardHost>(spec, node_name_, WorkerSlots(spec.cluster),
                                      std::move(model_), std::move(parts));
  service_->set_installer([this](const ShardMap& map) { return host_->ApplyShardMap(map); });
  // Heartbeats before the first map: serving it may restore shards from checkpoints
  // (seconds each from S3), and a server silent that long is declared dead as it joins.
  // No heartbeat catches up meanwhile (this install is the catch-up); a newer map the
  // scheduler pushes may still land first, and then this one is old news, not an error.
  {
    absl::MutexLock lock(&mu_);
    catching_up_ = true;
  }
  membership_->StartHeartbeats(HeartbeatHandlers{
      [this] { return MakeHeartbeat(); },
      [this](const HeartbeatResponse& response) { OnHeartbeatResponse(response); },
      [this](const absl::Status& refusal) { Rejoin(refusal); },
      // Twice the workers' limit: the servers outlive the workers' own wait, so that
      // rank 0 can still evaluate and write the final weights when it gives up.
      SchedulerOutagePolicy{2 * RecoveryTimeout(spec.cluster), [this](const absl::Status& why) {
                              spdlog::error("{}; shutting down", std::string(why.message()));
                              absl::MutexLock lock(&mu_);
                              scheduler_lost_ = why;
                              stop_requested_ = true;
                            }}});
  const absl::StatusOr<int64_t> served = host_->ApplyShardMap(view.shard_map());
  {
    absl::MutexLock lock(&mu_);
    catching_up_ = false;
  }
  if (!served.ok() && service_->epoch() <= view.shard_map().epoch()) return served.status();
  if (options_.watch_spot_interruptions) {
    // On a notice the scheduler drains this server (its shards move with their state);
    // it exits at its next heartbeat, as a drained server does.
    membership_->WatchSpotInterruptions(
        options_.imds_endpoint, options_.spot_poll_interval, [](const absl::Status& left) {
          if (!left.ok())
            spdlog::error("could not hand this server's shards off: {}", left.ToString());
        });
  }
  host_->MarkJoined();
  return absl::OkStatus();
}

ServerFigures ParameterServerDaemon::Figures() const {
  ServerFigures figures;
  for (const auto& [id, served] : service_->shards()) {
    ServerFigures::Shard& shard = figures.shards.emplace_back();
    shard.shard_id = id;
    shard.primary = served.primary;
    const ShardCounters counters = served.shard->counters();
    shard.applied_updates = counters.applied_updates;
    shard.skipped_steps = counters.skipped_steps;
    if (served.shard->is_embedding()) shard.embedding = served.shard->embedding_counters();
  }
  for (GradientRefusal reason : kGradientRefusals)
    figures.refusals.emplace_back(reason, refusals_->count(reason));
  figures.serving_epoch = service_->epoch();
  if (checkpoints_ != nullptr) {
    figures.checkpoint_failed_writes.emplace(checkpoints_->failure().failed_writes,
                                             checkpoints_->failed_writes());
  }
  return figures;
}

void ParameterServerDaemon::Rejoin(const absl::Status& refusal) {
  // We were stopped or cut off long enough to be replaced: what we hold is stale. Drop
  // it without writing anything (so it cannot shadow the newer state) and register again.
  spdlog::warn(
      "the scheduler refused our heartbeat ({}); dropping every shard and registering again",
      std::string(refusal.message()));
  host_->MarkJoined();  // it did join (perhaps while serving its first map)
  host_->DropAll();
  const absl::StatusOr<RegisterResponse> registered =
      membership_->Rejoin(absl::Now() + options_.startup_timeout);
  if (!registered.ok()) {
    spdlog::error("could not rejoin as {}: {}; shutting down", node_name_,
                  registered.status().ToString());
    Shutdown();
    return;
  }
  known_nodes_.SetScheduler(registered->scheduler_token_sha256(), registered->scheduler_map_key());
  spdlog::info("rejoined the cluster as {}; waiting for shards", node_name_);
}

HeartbeatRequest ParameterServerDaemon::MakeHeartbeat() const {
  heartbeat_sent_at_unix_ns_.store(absl::ToUnixNanos(absl::Now()));
  HeartbeatRequest request;
  // Read first: every push counted below was applied at or before this map.
  request.set_serving_epoch(service_->epoch());
  request.set_refused_gradients(refusals_->total());
  std::vector<int64_t> worker_next_steps;
  for (const auto& [id, served] : service_->shards()) {
    // The data leases (async jobs) settle on them; a hybrid job's async tables have none.
    if (options_.spec.training.mode == TrainingMode::kAsync) {
      const std::vector<int64_t> next = served.shard->worker_next_steps();
      if (worker_next_steps.size() < next.size()) worker_next_steps.resize(next.size(), 0);
      for (size_t r = 0; r < next.size(); ++r)
        worker_next_steps[r] = std::max(worker_next_steps[r], next[r]);
    }
    ShardStatus* status = request.add_shards();
    status->set_shard_id(id);
    const ShardCounters counters = served.shard->counters();
    status->set_applied_updates(counters.applied_updates);
    status->set_skipped_steps(counters.skipped_steps);
    status->set_late_pushes(counters.late_pushes);
    status->set_backup(!served.primary);
    status->set_checkpoint_step(
        checkpoints_ != nullptr && served.primary ? checkpoints_->newest_step(id) : -1);
    if (served.shard->is_embedding()) {
      const EmbeddingCounters counters = served.shard->embedding_counters();
      EmbeddingShardStats* rows = status->mutable_embedding();
      rows->set_rows(counters.rows);
      rows->set_bytes(counters.bytes);
      rows->set_minimum_bytes(counters.minimum_bytes);
      rows->set_evicted_rows(counters.evicted_rows);
      rows->set_dropped_gradients(counters.dropped_gradients);
      rows->set_pending_ids(counters.pending_ids);
    }
  }
  if (checkpoints_ != nullptr) {
    const CheckpointFailure failure = checkpoints_->failure();
    if (failure.failed_writes > 0) {
      CheckpointTrouble* trouble = request.mutable_checkpoint_trouble();
      trouble->set_failing_since_step(failure.failing_since_step);
      trouble->set_failed_writes(failure.failed_writes);
      // The scheduler keeps at most 512 bytes of it, and refuses a heartbeat past 4 KiB.
      trouble->set_error(failure.error.substr(0, 512));
    }
  }
  // A server holding no shard has applied no push: zeros (the scheduler reads a report
  // from every live server before it settles a fenced worker's lease).
  if (worker_next_steps.empty() && options_.spec.training.mode == TrainingMode::kAsync)
    worker_next_steps.assign(WorkerSlots(options_.spec.cluster), 0);
  for (int64_t next : worker_next_steps) request.add_worker_next_steps(next);
  const ShardMapConflicts conflicts = host_->conflicts();
  request.set_shard_map_conflicts(conflicts.count);
  request.set_last_shard_map_conflict(conflicts.last);
  return request;
}

void ParameterServerDaemon::OnHeartbeatResponse(const HeartbeatResponse& response) {
  // Still a member: a primary may acknowledge alone for a while (ReplicationLinks).
  if (replication_links_ != nullptr)
    replication_links_->RenewLease(absl::FromUnixNanos(heartbeat_sent_at_unix_ns_.load()));
  // A scheduler that took over from the saved state has an identity of its own, which
  // only its replies (on the channel to the scheduler's address) tell.
  if (!response.scheduler_map_key().empty() &&
      known_nodes_.SetScheduler(response.scheduler_token_sha256(), response.scheduler_map_key())) {
    spdlog::warn("the scheduler's identity changed (a scheduler took over); map key {}",
                 ShortDigest(response.scheduler_map_key()));
  }
  if (checkpoints_ != nullptr) checkpoints_->set_retain_from(response.checkpoint_retain_from());
  if (response.job_finished() || response.shutdown()) {
    spdlog::info("{}; shutting down",
                 !response.job_finished() ? "drained: every shard was handed off"
                 : response.shutdown()    ? "the scheduler shut the job down (psctl shutdown, or a "
                                            "loss it cannot recover from: its log says which)"
                                          : "the scheduler reports the job finished");
    Shutdown();
    return;
  }
  if (response.epoch() > service_->epoch()) {
    // The scheduler's push of the new map did not reach us (or is still on its way).
    MaybeCatchUpWithMap(response.epoch());
  }
}

void ParameterServerDaemon::MaybeCatchUpWithMap(int64_t epoch) {
  {
    absl::MutexLock lock(&mu_);
    if (catching_up_ || stop_requested_) return;
    catching_up_ = true;
  }
  // The previous catch-up has ended (catching_up_ was false): joining it does not wait.
  if (catch_up_thread_.joinable()) catch_up_thread_.join();
  catch_up_thread_ = std::thread([this, epoch] {
    CatchUpWithMap();
    spdlog::debug("caught up with the scheduler's map (epoch {} asked)", epoch);
  });
}

void ParameterServerDaemon::CatchUpWithMap() {
  absl::StatusOr<ClusterView> view = membership_->scheduler()->GetClusterView(node_name_);
  if (view.ok()) {
    absl::StatusOr<int64_t> serving = host_->ApplyShardMap(view->shard_map());
    if (!serving.ok()) {
      spdlog::error("cannot serve epoch {}: {}", view->shard_map().epoch(),
                    serving.status().ToString());
    }
  }
  absl::MutexLock lock(&mu_);
  catching_up_ = false;
}

absl::Status ParameterServerDaemon::Run() {
  {
    absl::MutexLock lock(&mu_);
    while (!mu_.AwaitWithTimeout(absl::Condition(&stop_requested_), absl::Seconds(60))) {
    }
  }
  for (const auto& [id, served] : service_->shards()) {
    const ShardCounters counters = served.shard->counters();
    if (!served.primary) {
      spdlog::info("shard {} (backup of {}): at update {}, log index {}", id, served.primary_name,
                   counters.applied_updates, served.shard->log_index());
      continue;
    }
    spdlog::info(
        "shard {}: {} updates applied, {} pushes accepted, {} duplicate pushes ignored, {} late "
        "pushes dropped, {} rejected, {} steps skipped",
        id, counters.applied_updates, counters.accepted_pushes, counters.duplicate_pushes,
        counters.late_pushes, counters.rejected_pushes, counters.skipped_steps);
  }
  absl::MutexLock lock(&mu_);
  return scheduler_lost_;
}

void ParameterServerDaemon::Shutdown() {
  absl::MutexLock lock(&mu_);
  stop_requested_ = true;
}

}  // namespace paramserver
