#include "ps/parameter_server_daemon.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/embedding_checkpoint_files.h"
#include "common/logging.h"
#include "common/mlp_parameters.h"
#include "common/model_declaration.h"
#include "common/retry_policy.h"
#include "common/rpc_endpoints.h"
#include "common/s3_file_system.h"
#include "common/security_policy.h"
#include "common/shard_layout.h"
#include "common/shard_map_signature.h"
#include "common/status_macros.h"
#include "common/storage_checks.h"
#include "ps/shard_map_admission.h"
#include "spdlog/spdlog.h"

namespace paramserver {

namespace {
// Between attempts to copy a shard from its primary (which may still be installing).
constexpr BackoffPolicy kShardCopyBackoff{absl::Milliseconds(10), absl::Milliseconds(500)};
}  // namespace

absl::StatusOr<std::unique_ptr<ParameterServerDaemon>> ParameterServerDaemon::Create(
    ParameterServerDaemonOptions options) {
  if (options.scheduler_address.empty())
    options.scheduler_address = options.spec.cluster.scheduler_address;
  const ModelSection& model = options.spec.model;
  MlpLayout layout(model.layers);
  std::vector<float> initial;
  std::vector<TableRows> initial_rows;
  if (model.type == ModelType::kTorch) {
    // Declared by the script at run time: see AdoptDeclaredModel.
  } else if (model.init_from.empty()) {
    initial = InitializeMlpParameters(layout, model.init_seed);
  } else {
    PS_ASSIGN_OR_RETURN(initial, LoadDenseParameters(layout.model(), model.init_from));
    if (model.type == ModelType::kCtr) {
      PS_ASSIGN_OR_RETURN(std::vector<NamedTensor> tensors, ReadSafetensorsFile(model.init_from));
      PS_ASSIGN_OR_RETURN(initial_rows,
                          EmbeddingRowsFromTensors(tensors, model.categorical_features,
                                                   model.embedding_dim, model.init_from));
    }
  }
  PS_ASSIGN_OR_RETURN(std::string cluster_token, ReadClusterToken(options.spec.security));
  PS_RETURN_IF_ERROR(CheckListenAddressIsSafe(options.listen_address, options.spec.security));
  std::unique_ptr<ParameterServerDaemon> daemon(
      new ParameterServerDaemon(std::move(options), std::move(initial), std::move(initial_rows)));
  daemon->credentials_ = std::make_shared<CallCredentials>(cluster_token);
  daemon->callers_ =
      std::make_unique<CallerVerifier>(cluster_token, daemon->known_nodes_.AsLookup());
  PS_RETURN_IF_ERROR(daemon->Start());
  return daemon;
}

ParameterServerDaemon::ParameterServerDaemon(ParameterServerDaemonOptions options,
                                             std::vector<float> initial_parameters,
                                             std::vector<TableRows> initial_rows)
    : options_(std::move(options)),
      initial_parameters_(std::move(initial_parameters)),
      initial_rows_(std::move(initial_rows)),
      dense_parameters_(static_cast<int64_t>(initial_parameters_.size())) {
  const ModelSection& model = options_.spec.model;
  if (model.type != ModelType::kCtr) return;
  for (int t = 0; t < model.categorical_features; ++t) {
    EmbeddingTableOptions table;
    table.dim = model.embedding_dim;
    table.optimizer = options_.spec.training.embedding_optimizer;
    table.init_seed = model.init_seed;
    table.table_index = t;
    table.min_count = model.min_count;
    embedding_tables_.push_back(table);
  }
}

ParameterServerDaemon::~ParameterServerDaemon() {
  heartbeats_.reset();
  if (service_ != nullptr) service_->CloseShards();
  if (rpc_.server != nullptr)
    rpc_.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
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
  service_ = std::make_unique<ParameterServerServiceImpl>(callers_.get(), absl::Seconds(60),
                                                          checkpoints_.get(), &metrics_);
  metrics_.AddScrapedFamilies([this] { return ServerMetricFamilies(Figures()); });
  PS_ASSIGN_OR_RETURN(rpc_, StartRpcServer(options_.listen_address, service_->rpc_services()));
  PS_ASSIGN_OR_RETURN(metrics_http_,
                      MaybeServeMetrics(options_.metrics_port, options_.metrics_host, &metrics_, {},
                                        HttpsFiles{spec.security.tls_cert, spec.security.tls_key}));
  PS_ASSIGN_OR_RETURN(advertised_address_,
                      ResolveAdvertisedAddress(options_.advertise_address, options_.listen_address,
                                               rpc_.port, options_.imds_endpoint));
  const std::string& advertised = advertised_address_;
  const absl::Duration rpc_timeout = absl::Milliseconds(spec.cluster.failure_timeout_ms);
  scheduler_ =
      std::make_unique<SchedulerClient>(options_.scheduler_address, rpc_timeout, credentials_);
  const absl::Time deadline = absl::Now() + options_.startup_timeout;
  PS_ASSIGN_OR_RETURN(RegisterResponse registered,
                      scheduler_->Register(NODE_ROLE_SERVER, advertised, deadline));
  known_nodes_.SetScheduler(registered.scheduler_token_sha256(), registered.scheduler_map_key());
  node_name_ = registered.node_name();
  spdlog::info(
      "registered with the scheduler at {}; serving on {}; this node's lines are tagged [{}] from "
      "here on",
      options_.scheduler_address, advertised, node_name_);
  SetLogNodeName(node_name_);
  replication_links_ =
      std::make_unique<ReplicationLinks>(node_name_, absl::Seconds(2), credentials_);
  PS_ASSIGN_OR_RETURN(ClusterView view, scheduler_->WaitForReady(node_name_, deadline));
  num_workers_ = view.expected_workers();
  service_->set_installer([this](const ShardMap& map) { return ApplyShardMap(map); });
  PS_RETURN_IF_ERROR(ApplyShardMap(view.shard_map()).status());
  if (options_.watch_spot_interruptions) {
    // On a notice the scheduler drains this server (its shards move with their state);
    // it exits at its next heartbeat, as a drained server does.
    spot_watcher_ = std::make_unique<SpotInterruptionWatcher>(
        InstanceMetadataClient(options_.imds_endpoint), options_.spot_poll_interval,
        [this](const std::string& notice) {
          absl::StatusOr<LeaveResponse> left =
              scheduler_->Leave(node_name_, "spot interruption: " + notice);
          if (!left.ok())
            spdlog::error("could not hand this server's shards off: {}", left.status().ToString());
        });
  }
  heartbeats_ = std::make_unique<HeartbeatSender>(
      scheduler_.get(), node_name_, absl::Milliseconds(spec.cluster.heartbeat_interval_ms),
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
                            }});
  return absl::OkStatus();
}

ServerFigures ParameterServerDaemon::Figures() const {
  ServerFigures figures;
  for (const auto& [id, served] : service_->shards()) {
    ServerFigures::Shard& shard = figures.shards.emplace_back();
    shard.shard_id = id;
    shard.primary = served.primary;
    shard.applied_updates = served.shard->counters().applied_updates;
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
  {
    absl::MutexLock install_lock(&install_mu_);
    service_->CloseShards();
    service_->InstallShards(node_name_, 0, {});
    served_map_digest_.clear();
  }
  absl::StatusOr<RegisterResponse> registered = scheduler_->Register(
      NODE_ROLE_SERVER, advertised_address_, absl::Now() + options_.startup_timeout);
  if (registered.ok())
    known_nodes_.SetScheduler(registered->scheduler_token_sha256(),
                              registered->scheduler_map_key());
  if (!registered.ok() || registered->node_name() != node_name_) {
    spdlog::error("could not rejoin as {}: {}; shutting down", node_name_,
                  registered.ok() ? "given another name " + registered->node_name()
                                  : registered.status().ToString());
    Shutdown();
    return;
  }
  spdlog::info("rejoined the cluster as {}; waiting for shards", node_name_);
}

HeartbeatRequest ParameterServerDaemon::MakeHeartbeat() const {
  HeartbeatRequest request;
  request.set_serving_epoch(service_->epoch());
  request.set_refused_gradients(refusals_->total());
  for (const auto& [id, served] : service_->shards()) {
    ShardStatus* status = request.add_shards();
    status->set_shard_id(id);
    status->set_applied_updates(served.shard->counters().applied_updates);
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
  absl::MutexLock lock(&conflict_mu_);
  request.set_shard_map_conflicts(shard_map_conflicts_);
  request.set_last_shard_map_conflict(last_shard_map_conflict_);
  return request;
}

void ParameterServerDaemon::OnHeartbeatResponse(const HeartbeatResponse& response) {
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
                 : response.shutdown()    ? "an operator shut the job down"
                                          : "the scheduler reports the job finished");
    Shutdown();
    return;
  }
  if (response.epoch() > service_->epoch()) {
    // The scheduler's push of the new map did not reach us (or is still on its way).
    absl::StatusOr<ClusterView> view = scheduler_->GetClusterView(node_name_);
    if (view.ok()) {
      absl::StatusOr<int64_t> serving = ApplyShardMap(view->shard_map());
      if (!serving.ok())
        spdlog::error("cannot serve epoch {}: {}", response.epoch(), serving.status().ToString());
    }
  }
}

ParameterShardOptions ParameterServerDaemon::ShardOptions(const ShardAssignment& assignment) const {
  const ClusterSpec& spec = options_.spec;
  ParameterShardOptions shard_options;
  shard_options.shard_id = assignment.shard_id();
  shard_options.range = {assignment.begin(), assignment.end()};
  shard_options.mode = spec.training.mode;
  shard_options.num_workers = num_workers_;
  shard_options.staleness = spec.training.staleness;
  shard_options.adam = spec.training.optimizer;
  shard_options.checkpoint_every_steps = spec.checkpoint.every_steps;
  shard_options.max_gradient_norm = spec.training.max_gradient_norm;
  shard_options.refusals = refusals_;
  if (assignment.kind() == SHARD_KIND_EMBEDDING_ROWS) {
    auto embedding = std::make_shared<EmbeddingShardOptions>();
    const int buckets = std::max(1, assignment.embedding_buckets());
    for (const EmbeddingTableOptions& table : embedding_tables_)
      embedding->shape.dims.push_back(table.dim);
    embedding->shape.bucket = assignment.embedding_bucket();
    embedding->shape.bucket_count = buckets;
    embedding->tables = embedding_tables_;
    // model.max_rows bounds a table over all servers: each bucket keeps its share.
    for (EmbeddingTableOptions& table : embedding->tables) {
      table.max_rows = (spec.model.max_rows + buckets - 1) / buckets;
    }
    shard_options.embedding = std::move(embedding);
  }
  return shard_options;
}

absl::StatusOr<ShardState> ParameterServerDaemon::LoadEmbeddingShard(
    const ShardAssignment& assignment, ShardSource source) const {
  const int tables = static_cast<int>(embedding_tables_.size());
  const int bucket = assignment.embedding_bucket();
  const int buckets = assignment.embedding_buckets();
  const int state_floats_per_element =
      StateFloatsPerElement(options_.spec.training.embedding_optimizer.type);
  ShardState state;
  state.shard_id = assignment.shard_id();
  switch (source) {
    case ShardSource::kInitialValues:
      for (int t = 0; t < tables; ++t) {
        const int dim = embedding_tables_[t].dim;
        const int state_floats = dim * state_floats_per_element;
        EmbeddingShardState& table = state.tables.emplace_back();
        table.table_index = t;
        table.dim = dim;
        table.state_floats = state_floats;
        table.shard_id = bucket;
        table.shard_count = buckets;
        if (t >= static_cast<int>(initial_rows_.size())) continue;
        const TableRows& given = initial_rows_[t];
        for (size_t i = 0; i < given.ids.size(); ++i) {
          if (EmbeddingShardOf(t, given.ids[i], buckets) != bucket) continue;
          table.ids.push_back(given.ids[i]);
          table.rows.insert(table.rows.end(), given.rows.begin() + i * dim,
                            given.rows.begin() + (i + 1) * dim);
        }
        table.state.assign(table.ids.size() * state_floats, 0.0f);
      }
      return state;
    case ShardSource::kRestoreAtStep: {
      PS_ASSIGN_OR_RETURN(state.tables, LoadEmbeddingBucketAtStep(
                                            FileSystemFor(checkpoints_->dir()), checkpoints_->dir(),
                                            tables, bucket, buckets, assignment.restore_step()));
      break;
    }
    default:
      PS_ASSIGN_OR_RETURN(state.tables,
                          LoadNewestEmbeddingBucket(FileSystemFor(checkpoints_->dir()),
                                                    checkpoints_->dir(), tables, bucket, buckets));
      break;
  }
  for (const EmbeddingShardState& table : state.tables) {
    const int dim = table.table_index >= 0 && table.table_index < tables
                        ? embedding_tables_[table.table_index].dim
                        : -1;
    const int state_floats = dim * state_floats_per_element;
    if (table.dim != dim || table.state_floats != state_floats) {
      return absl::FailedPreconditionError(
          absl::StrCat("embedding shard ", assignment.shard_id(), ": the checkpoint's table C",
                       table.table_index + 1, " has rows of dim ", table.dim, " with ",
                       table.state_floats, " optimizer floats; this model's have dim ", dim,
                       " and ", state_floats, " (another embedding_dim or embedding_optimizer)"));
    }
    state.step = table.step;
    state.epoch = std::max(state.epoch, table.epoch);
  }
  return state;
}

absl::StatusOr<std::shared_ptr<ParameterShard>> ParameterServerDaemon::BuildShard(
    const ShardInstallPlan::Primary& planned, int64_t epoch,
    const std::shared_ptr<ParameterShard>& held) {
  const ShardAssignment& assignment = *planned.assignment;
  const ParameterRange range{assignment.begin(), assignment.end()};
  const ParameterShardOptions shard_options = ShardOptions(assignment);
  const bool embedding = shard_options.embedding != nullptr;
  absl::StatusOr<ShardState> state;
  // The newest checkpoint written for this shard (its own, or a handoff).
  auto load_newest = [&]() -> absl::StatusOr<ShardState> {
    if (embedding) return LoadEmbeddingShard(assignment, ShardSource::kRestoreNewest);
    return LoadNewestShardCheckpoint(FileSystemFor(checkpoints_->dir()), checkpoints_->dir(),
                                     assignment.shard_id(), range);
  };
  switch (planned.source) {
    case ShardSource::kKeepHeld:
      return held;
    case ShardSource::kInitialValues: {
      std::shared_ptr<ParameterShard> shard;
      if (embedding) {
        PS_ASSIGN_OR_RETURN(ShardState rows,
                            LoadEmbeddingShard(assignment, ShardSource::kInitialValues));
        shard = std::make_shared<ParameterShard>(shard_options, std::move(rows));
      } else if (initial_parameters_.empty()) {
        // A torch model without init_from: the declaring worker sets the values
        // (ParameterServerServiceImpl::SetInitialValues), which writes the step-0
        // checkpoint.
        return std::shared_ptr<ParameterShard>(
            ParameterShard::AwaitingInitialValues(shard_options));
      } else {
        std::vector<float> values(initial_parameters_.begin() + range.begin,
                                  initial_parameters_.begin() + range.end);
        shard = std::make_shared<ParameterShard>(shard_options, std::move(values));
      }
      if (checkpoints_ != nullptr) {
        // The step-0 checkpoint: a rollback before the first periodic one comes back here.
        // A failure (a full disk) does not stop training: the writer reports it in every
        // heartbeat until a checkpoint is written.
        ShardState initial = shard->Snapshot();
        initial.epoch = epoch;
        checkpoints_->WriteNow(initial).IgnoreError();
      }
      return shard;
    }
    case ShardSource::kRestoreAtStep:
      state = embedding ? LoadEmbeddingShard(assignment, ShardSource::kRestoreAtStep)
                        : LoadRangeAtStep(FileSystemFor(checkpoints_->dir()), checkpoints_->dir(),
                                          range, assignment.restore_step());
      break;
    case ShardSource::kRestoreNewest:
      state = load_newest();
      break;
    case ShardSource::kRestoreHandoff: {
      // A handoff is written by the previous owner as it installs this same map: wait
      // (a bounded time) for a checkpoint stamped with this epoch.
      const absl::Time deadline = absl::Now() + absl::Seconds(10);
      while (true) {
        state = load_newest();
        if (state.ok() && state->epoch >= epoch) break;
        if (absl::Now() > deadline) {
          return absl::DeadlineExceededError(absl::StrCat(
              "shard ", assignment.shard_id(), ": the handoff checkpoint of epoch ", epoch,
              " from its previous owner did not appear in ", checkpoints_->dir()));
        }
        absl::SleepFor(absl::Milliseconds(20));
      }
      break;
    }
  }
  if (!state.ok()) return state.status();
  spdlog::info(
      "shard {}: restored from its checkpoint at step {}{}", assignment.shard_id(), state->step,
      held != nullptr ? absl::StrCat(" (it was at ", held->counters().applied_updates, ")") : "");
  state->shard_id = assignment.shard_id();
  return std::make_shared<ParameterShard>(shard_options, *std::move(state));
}

absl::Status ParameterServerDaemon::AwaitOwnCredential(const ShardMap& map,
                                                       absl::Duration timeout) const {
  const NodeCredential* own = nullptr;
  for (const NodeCredential& credential : map.credentials()) {
    if (credential.node_name() == node_name_) own = &credential;
  }
  if (own == nullptr) return absl::OkStatus();  // not a member at this epoch: nothing to present
  const absl::Time deadline = absl::Now() + timeout;
  while (!credentials_->Presents(own->node_name(), own->token_sha256())) {
    if (absl::Now() >= deadline) {
      return absl::UnavailableError(absl::StrCat("epoch ", map.epoch(), " names a credential of ",
                                                 node_name_,
                                                 " that this server has not received yet"));
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return absl::OkStatus();
}

absl::StatusOr<ShardInstallPlan> ParameterServerDaemon::PlanInstall(
    const ShardMap& map, int64_t serving, const std::map<int, ServedShard>& held) const {
  std::map<int, HeldShard> held_summary;
  for (const auto& [id, served] : held) {
    const ParameterShardOptions& options = served.shard->options();
    HeldShard& summary = held_summary[id];
    summary = {options.range, served.primary, served.primary_name, served.replicator != nullptr};
    if (options.embedding != nullptr) {
      summary.embedding_bucket = options.embedding->shape.bucket;
      summary.embedding_buckets = options.embedding->shape.bucket_count;
    }
  }
  ShardInstallContext context;
  context.node_name = node_name_;
  context.total_parameters = dense_parameters_;
  context.embedding_tables = static_cast<int>(embedding_tables_.size());
  context.checkpoints_enabled = checkpoints_ != nullptr;
  context.rejoining = serving == 0 && heartbeats_ != nullptr;
  return PlanShardMapInstall(held_summary, map, context);
}

absl::StatusOr<ServedShard> ParameterServerDaemon::ServePrimary(
    const ShardInstallPlan::Primary& planned, int64_t epoch, const ServedShard* held) {
  const ShardAssignment& assignment = *planned.assignment;
  ServedShard served;
  PS_ASSIGN_OR_RETURN(served.shard,
                      BuildShard(planned, epoch, held != nullptr ? held->shard : nullptr));
  served.primary_name = node_name_;
  if (assignment.backups_size() == 0) {
    served.shard->SetLogSink(nullptr, {});
    return served;
  }
  served.replicator = planned.keep_replicator
                          ? held->replicator
                          : replication_links_->NewReplicator(assignment.shard_id());
  std::vector<BackupTarget> backups;
  for (const ShardReplica& backup : assignment.backups()) {
    backups.push_back({backup.server_name(), backup.server_address()});
  }
  // Under the shard's lock: every entry after this index reaches the new backups.
  served.shard->SetLogSink(served.replicator, [&](int64_t log_index) {
    served.replicator->SetBackups(epoch, backups, log_index);
  });
  return served;
}

absl::StatusOr<std::vector<int>> ParameterServerDaemon::RetireHeld(
    const ShardInstallPlan& plan, const std::map<int, ServedShard>& held,
    const std::map<int, ServedShard>& next) {
  std::vector<int> handed_off;
  for (const auto& [id, fate] : plan.held) {
    const ServedShard& was = held.at(id);
    switch (fate) {
      case HeldShardFate::kKeep:
        if (!next.at(id).primary) was.shard->SetLogSink(nullptr, {});
        break;
      case HeldShardFate::kHandOff: {
        // Moved to another server: it resumes from this handoff, losing nothing.
        was.shard->Close(absl::StrCat("moved away at epoch ", plan.epoch));
        ShardState handoff = was.shard->Snapshot();
        handoff.epoch = plan.epoch;
        PS_RETURN_IF_ERROR(checkpoints_->WriteNow(handoff));
        handed_off.push_back(id);
        break;
      }
      case HeldShardFate::kClose:
        was.shard->Close(absl::StrCat("replaced at epoch ", plan.epoch));
        break;
    }
  }
  for (int id : plan.retired_replicators) held.at(id).replicator->Close();
  return handed_off;
}

void ParameterServerDaemon::SetActiveWorkers(const ShardMap& map,
                                             const std::map<int, ServedShard>& next) {
  std::vector<bool> active(num_workers_, true);
  for (int r = 0; r < map.active_workers_size() && r < num_workers_; ++r)
    active[r] = map.active_workers(r);
  for (const auto& [id, served] : next) {
    if (!served.primary) continue;  // a backup changes only through its primary's log
    ActiveWorkersOutcome changed = served.shard->SetActiveWorkers(active);
    if (changed.checkpoint.has_value() && checkpoints_ != nullptr) {
      changed.checkpoint->epoch = map.epoch();
      checkpoints_->Enqueue(*std::move(changed.checkpoint));
    }
  }
}

absl::Status ParameterServerDaemon::AdoptDeclaredModel(const ShardMap& map) {
  const ClusterSpec& spec = options_.spec;
  if (spec.model.type != ModelType::kTorch || model_adopted_) return absl::OkStatus();
  absl::StatusOr<ModelLayout> layout = LayoutOfDeclaration(map.model());
  if (!layout.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the shard map of epoch ", map.epoch(),
                     " declares no usable model: ", layout.status().message()));
  }
  for (size_t t = 0; t < layout->embedding_tables().size(); ++t) {
    EmbeddingTableOptions table;
    table.dim = static_cast<int>(layout->embedding_tables()[t].dim);
    table.optimizer = spec.training.embedding_optimizer;
    table.init_seed = spec.model.init_seed;
    table.table_index = static_cast<int>(t);
    table.min_count = spec.model.min_count;
    embedding_tables_.push_back(table);
  }
  if (!spec.model.init_from.empty()) {
    PS_ASSIGN_OR_RETURN(initial_parameters_, LoadDenseParameters(*layout, spec.model.init_from));
  }
  dense_parameters_ = layout->dense_parameters();
  model_adopted_ = true;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ParameterServerDaemon::ApplyShardMap(const ShardMap& map) {
  // Only the scheduler's maps, before anything of this one is acted on (a forged map
  // must not even make a copy in progress give up).
  PS_RETURN_IF_ERROR(VerifyShardMapSignature(map, known_nodes_.scheduler_map_key()));
  // The scheduler publishes the map that takes a (re)registered server in as soon as it
  // answers the registration: the map can arrive before the answer has set the new
  // credential here. Calls made for the map (copying shards from primaries) must
  // present the credential the map names.
  PS_RETURN_IF_ERROR(AwaitOwnCredential(map, absl::Seconds(5)));
  // Seen before waiting for the lock: a copy in progress for an older map gives up.
  int64_t newest = newest_map_epoch_.load();
  while (map.epoch() > newest && !newest_map_epoch_.compare_exchange_weak(newest, map.epoch())) {
  }
  absl::MutexLock install_lock(&install_mu_);
  const int64_t serving = service_->epoch();
  absl::StatusOr<MapAdmission> admission =
      AdmitShardMap(map, ServedMap{serving, served_map_digest_});
  if (absl::IsAborted(admission.status())) {
    spdlog::error("{}", std::string(admission.status().message()));
    absl::MutexLock lock(&conflict_mu_);
    ++shard_map_conflicts_;
    last_shard_map_conflict_ = std::string(admission.status().message());
  }
  if (!admission.ok()) return admission.status();
  if (*admission == MapAdmission::kAlreadyServed) return serving;
  // Who may call this server from now on: the members of this map.
  known_nodes_.ReplaceNodes(map.credentials());
  PS_RETURN_IF_ERROR(AdoptDeclaredModel(map));
  service_->set_initial_values_from(map.initial_values_from());
  const std::map<int, ServedShard> held = service_->shards();
  PS_ASSIGN_OR_RETURN(const ShardInstallPlan plan, PlanInstall(map, serving, held));

  std::map<int, ServedShard> next;
  for (const ShardInstallPlan::Primary& planned : plan.primaries) {
    auto was = held.find(planned.assignment->shard_id());
    PS_ASSIGN_OR_RETURN(
        next[planned.assignment->shard_id()],
        ServePrimary(planned, map.epoch(), was != held.end() ? &was->second : nullptr));
  }
  for (int id : plan.kept_backups) next[id] = held.at(id);
  PS_ASSIGN_OR_RETURN(const std::vector<int> handed_off, RetireHeld(plan, held, next));
  SetActiveWorkers(map, next);
  std::vector<int> primaries, backups;
  for (const auto& [id, served] : next) (served.primary ? primaries : backups).push_back(id);
  std::set<int> copying;
  for (const ShardAssignment* assignment : plan.backups_to_copy)
    copying.insert(assignment->shard_id());
  spdlog::info(
      "serving epoch {}: primary of shards [{}]{}{}{}; mode {}", map.epoch(),
      absl::StrJoin(primaries, ", "),
      backups.empty() ? "" : absl::StrCat("; backup of [", absl::StrJoin(backups, ", "), "]"),
      copying.empty()
          ? ""
          : absl::StrCat("; copying [", absl::StrJoin(copying, ", "), "] from their primaries"),
      handed_off.empty() ? ""
                         : absl::StrCat("; handed off [", absl::StrJoin(handed_off, ", "), "]"),
      std::string(TrainingModeName(options_.spec.training.mode)));
  service_->InstallShards(node_name_, map.epoch(), std::move(next), copying);
  served_map_digest_ = ShardMapDigest(map);
  for (const ShardAssignment* assignment : plan.backups_to_copy) {
    PS_RETURN_IF_ERROR(CopyFromPrimary(*assignment, map.epoch()));
  }
  return map.epoch();
}

absl::Status ParameterServerDaemon::CopyFromPrimary(const ShardAssignment& assignment,
                                                    int64_t epoch) {
  auto stub = ParameterServer::NewStub(CreateChannel(assignment.server_address(), credentials_));
  FetchShardStateRequest request;
  request.set_shard_id(assignment.shard_id());
  request.set_epoch(epoch);
  // The primary may still be installing this epoch (or restoring the shard).
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  ExponentialBackoff backoff(kShardCopyBackoff);
  while (true) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    ShardReplicaState state;
    const grpc::Status status = stub->FetchShardState(&context, request, &state);
    if (status.ok()) {
      const ParameterShardOptions shard_options = ShardOptions(assignment);
      PS_ASSIGN_OR_RETURN(
          ReplicaState replica,
          ReplicaStateFromProto(state, {shard_options.range, shard_options.num_workers,
                                        shard_options.embedding.get()}));
      PS_ASSIGN_OR_RETURN(std::unique_ptr<ParameterShard> shard,
                          ParameterShard::FromReplica(shard_options, std::move(replica)));
      const int64_t log_index = shard->log_index();
      ServedShard served{std::shared_ptr<ParameterShard>(std::move(shard)), false,
                         assignment.server_name(), nullptr};
      if (service_->FinishCopy(epoch, assignment.shard_id(), std::move(served))) {
        spdlog::info("shard {}: copied from its primary {} at log index {}", assignment.shard_id(),
                     assignment.server_name(), log_index);
      }
      return absl::OkStatus();
    }
    if (newest_map_epoch_.load() > epoch) {
      // A newer map came in meanwhile (the primary may serve it already): that map's
      // install decides where this shard's copy comes from. Not an error: the first
      // map's install failing would end the server.
      spdlog::info("shard {}: copy at epoch {} abandoned for the newer map's ({})",
                   assignment.shard_id(), epoch, status.error_message());
      return absl::OkStatus();
    }
    const bool retry = IsRetryable(static_cast<absl::StatusCode>(status.error_code()),
                                   /*deadline_exceeded_too=*/true);
    if (!retry || !backoff.CanRetryBefore(give_up)) {
      return absl::Status(
          static_cast<absl::StatusCode>(status.error_code()),
          absl::StrCat("copying shard ", assignment.shard_id(), " from its primary ",
                       assignment.server_name(), " (", assignment.server_address(), ") at epoch ",
                       epoch, ": ", status.error_message()));
    }
    backoff.Wait();
  }
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
        "shard {}: {} updates applied, {} pushes accepted, {} duplicate pushes ignored, {} "
        "rejected",
        id, counters.applied_updates, counters.accepted_pushes, counters.duplicate_pushes,
        counters.rejected_pushes);
  }
  absl::MutexLock lock(&mu_);
  return scheduler_lost_;
}

void ParameterServerDaemon::Shutdown() {
  absl::MutexLock lock(&mu_);
  stop_requested_ = true;
}

}  // namespace paramserver
