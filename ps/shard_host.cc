#include "ps/shard_host.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/embedding_checkpoint_files.h"
#include "common/files/s3_file_system.h"
#include "common/model/mlp_parameters.h"
#include "common/model/model_declaration.h"
#include "common/model/optimizer_groups.h"
#include "common/rpc/progress_watchdog.h"
#include "common/rpc/retry_policy.h"
#include "common/rpc/rpc_endpoints.h"
#include "common/security/shard_map_signature.h"
#include "common/wire/shard_layout.h"
#include "ps/dense_update_rule.h"
#include "ps/shard_map_admission.h"
#include "spdlog/spdlog.h"

namespace paramserver {
namespace {

// Between attempts to copy a shard from its primary (which may still be installing).
constexpr BackoffPolicy kShardCopyBackoff{absl::Milliseconds(2), absl::Milliseconds(200)};
// The copies of one map's new backups run side by side, this many at most.
constexpr size_t kMaxCopiesAtOnce = 8;
// A new backup's copy of its primary's state: how long it retries a primary not ready
// yet, and the bound on the whole call (a shard of tens of GiB, at a few hundred MB/s).
// How long it waits for the next piece of the state is ShardHostParts::copy_stall.
constexpr absl::Duration kShardCopyRetryWindow = absl::Seconds(30);
constexpr absl::Duration kShardCopyBound = absl::Hours(1);
// How long a primary handed to its backup waits for the backup to receive its last log
// entries (the scheduler installs the map on the new primary only after): then it copies
// the shard back from the new primary instead.
constexpr absl::Duration kHandOverTimeout = absl::Milliseconds(500);

}  // namespace

ShardHost::ShardHost(ClusterSpec spec, std::string node_name, int num_workers, HostedModel model,
                     ShardHostParts parts)
    : spec_(std::move(spec)),
      node_name_(std::move(node_name)),
      num_workers_(num_workers),
      parts_(std::move(parts)),
      model_(std::move(model)) {}

void ShardHost::DropAll() {
  absl::MutexLock install_lock(&install_mu_);
  parts_.service->CloseShards();
  parts_.service->InstallShards(node_name_, 0, {});
  served_map_digest_.clear();
  served_active_workers_.clear();
}

ShardMapConflicts ShardHost::conflicts() const {
  absl::MutexLock lock(&conflict_mu_);
  return conflicts_;
}

void ShardHost::CountConflict(const absl::Status& conflict) {
  spdlog::error("{}", std::string(conflict.message()));
  absl::MutexLock lock(&conflict_mu_);
  ++conflicts_.count;
  conflicts_.last = std::string(conflict.message());
}

ParameterShardOptions ShardHost::ShardOptions(const ShardAssignment& assignment) const {
  const ClusterSpec& spec = spec_;
  ParameterShardOptions shard_options;
  shard_options.shard_id = assignment.shard_id();
  shard_options.range = {assignment.begin(), assignment.end()};
  shard_options.mode =
      ShardTrainingMode(spec.training, assignment.kind() == SHARD_KIND_EMBEDDING_ROWS);
  shard_options.num_workers = num_workers_;
  shard_options.staleness = spec.training.staleness;
  shard_options.backup_workers = spec.training.backup_workers;
  shard_options.optimizer = spec.training.optimizer;
  shard_options.optimizer_segments =
      SegmentsWithin(model_.optimizer_segments, {assignment.begin(), assignment.end()});
  shard_options.checkpoint_every_steps = spec.checkpoint.every_steps;
  shard_options.checkpoint_at_next_update =
      spec.training.async_tables && assignment.kind() == SHARD_KIND_EMBEDDING_ROWS;
  shard_options.embedding_deltas = spec.checkpoint.embedding_deltas;
  if (parts_.checkpoints != nullptr) {
    shard_options.checkpoint_held = [writer = parts_.checkpoints, id = assignment.shard_id()](
                                        int64_t step) { return writer->Holds(id, step); };
  }
  shard_options.max_gradient_norm = spec.training.max_gradient_norm;
  shard_options.refusals = parts_.refusals;
  if (assignment.kind() == SHARD_KIND_EMBEDDING_ROWS) {
    auto embedding = std::make_shared<EmbeddingShardOptions>();
    const int buckets = std::max(1, assignment.embedding_buckets());
    for (const EmbeddingTableOptions& table : model_.embedding_tables)
      embedding->shape.dims.push_back(table.dim);
    embedding->shape.bucket = assignment.embedding_bucket();
    embedding->shape.bucket_count = buckets;
    embedding->tables = model_.embedding_tables;
    // A table's max_rows bounds it over all servers: each bucket keeps its share.
    for (EmbeddingTableOptions& table : embedding->tables) {
      table.max_rows = (table.max_rows + buckets - 1) / buckets;
    }
    shard_options.embedding = std::move(embedding);
  }
  return shard_options;
}

absl::StatusOr<std::shared_ptr<ParameterShard>> ShardHost::FreshShard(
    const ShardAssignment& assignment, const ParameterShardOptions& shard_options, int64_t epoch) {
  const ParameterRange range{assignment.begin(), assignment.end()};
  std::shared_ptr<ParameterShard> shard;
  if (shard_options.embedding != nullptr) {
    PS_ASSIGN_OR_RETURN(ShardState rows,
                        LoadEmbeddingShard(assignment, ShardSource::kInitialValues));
    shard = std::make_shared<ParameterShard>(shard_options, std::move(rows));
  } else if (model_.initial_parameters.empty()) {
    // A torch model without init_from: the declaring worker sets the values
    // (ParameterServerServiceImpl::SetInitialValues), which writes the step-0
    // checkpoint.
    return std::shared_ptr<ParameterShard>(ParameterShard::AwaitingInitialValues(shard_options));
  } else {
    std::vector<float> values(model_.initial_parameters.begin() + range.begin,
                              model_.initial_parameters.begin() + range.end);
    shard = std::make_shared<ParameterShard>(shard_options, std::move(values));
  }
  if (parts_.checkpoints != nullptr) {
    // The step-0 checkpoint: a rollback before the first periodic one comes back here.
    // A failure (a full disk) does not stop training: the writer reports it in every
    // heartbeat until a checkpoint is written.
    ShardState initial = shard->Snapshot();
    initial.epoch = epoch;
    parts_.checkpoints->WriteNow(initial).IgnoreError();
  }
  return shard;
}

absl::StatusOr<std::shared_ptr<ParameterShard>> ShardHost::BuildShard(
    const ShardInstallPlan::Primary& planned, int64_t epoch,
    const std::shared_ptr<ParameterShard>& held) {
  const ShardAssignment& assignment = *planned.assignment;
  const ParameterRange range{assignment.begin(), assignment.end()};
  const ParameterShardOptions shard_options = ShardOptions(assignment);
  const bool embedding = shard_options.embedding != nullptr;
  absl::StatusOr<ShardState> state;
  // The newest checkpoint written for this shard (its own, or a handoff).
  auto load_newest = [&]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(install_mu_) -> absl::StatusOr<ShardState> {
    if (embedding) return LoadEmbeddingShard(assignment, ShardSource::kRestoreNewest);
    return LoadNewestShardCheckpoint(FileSystemFor(parts_.checkpoints->dir()),
                                     parts_.checkpoints->dir(), assignment.shard_id(), range);
  };
  switch (planned.source) {
    case ShardSource::kKeepHeld:
      return held;
    case ShardSource::kInitialValues:
      return FreshShard(assignment, shard_options, epoch);
    case ShardSource::kRestoreAtStep:
      state = embedding
                  ? LoadEmbeddingShard(assignment, ShardSource::kRestoreAtStep)
                  : LoadRangeAtStep(FileSystemFor(parts_.checkpoints->dir()),
                                    parts_.checkpoints->dir(), range, assignment.restore_step());
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
              " from its previous owner did not appear in ", parts_.checkpoints->dir()));
        }
        absl::SleepFor(absl::Milliseconds(20));
      }
      break;
    }
  }
  if (!state.ok()) return state.status();
  state->shard_id = assignment.shard_id();
  if (!embedding) {
    PS_RETURN_IF_ERROR(CheckResumableState(shard_options.optimizer, *state));
  }
  spdlog::info(
      "shard {}: restored from its checkpoint at step {}{}", assignment.shard_id(), state->step,
      held != nullptr ? absl::StrCat(" (it was at ", held->counters().applied_updates, ")") : "");
  return std::make_shared<ParameterShard>(shard_options, *std::move(state));
}

absl::Status ShardHost::AwaitOwnCredential(const ShardMap& map, absl::Duration timeout) const {
  const NodeCredential* own = nullptr;
  for (const NodeCredential& credential : map.credentials()) {
    if (credential.node_name() == node_name_) own = &credential;
  }
  if (own == nullptr) return absl::OkStatus();  // not a member at this epoch: nothing to present
  const absl::Time deadline = absl::Now() + timeout;
  while (!parts_.credentials->Presents(own->node_name(), own->token_sha256())) {
    if (absl::Now() >= deadline) {
      return absl::UnavailableError(absl::StrCat("epoch ", map.epoch(), " names a credential of ",
                                                 node_name_,
                                                 " that this server has not received yet"));
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return absl::OkStatus();
}

absl::StatusOr<ShardInstallPlan> ShardHost::PlanInstall(
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
  context.total_parameters = model_.dense_parameters;
  context.embedding_tables = static_cast<int>(model_.embedding_tables.size());
  context.checkpoints_enabled = parts_.checkpoints != nullptr;
  context.rejoining = serving == 0 && joined_.load();
  return PlanShardMapInstall(held_summary, map, context);
}

absl::StatusOr<ServedShard> ShardHost::ServePrimary(const ShardInstallPlan::Primary& planned,
                                                    int64_t epoch, const ServedShard* held,
                                                    bool served_alike) {
  const ShardAssignment& assignment = *planned.assignment;
  ServedShard served;
  PS_ASSIGN_OR_RETURN(served.shard,
                      BuildShard(planned, epoch, held != nullptr ? held->shard : nullptr));
  served.primary_name = node_name_;
  // A backup promoted with its primary alive: that primary, a backup now, handed the
  // shard over (ShardHost::HandOver) with this very state before this map came here.
  std::string handed_over_by;
  if (planned.source == ShardSource::kKeepHeld && held != nullptr && !held->primary) {
    served.shard->Reopen();  // had it been handed over from here before
    for (const ShardReplica& backup : assignment.backups()) {
      if (backup.server_name() == held->primary_name) handed_over_by = held->primary_name;
    }
  }
  // The same object, primary here before and now: calls routed with the older maps
  // still reach it, so workers go on without refreshing theirs.
  if (served_alike && planned.source == ShardSource::kKeepHeld && held != nullptr &&
      held->primary) {
    served.routed_since = held->routed_since;
  }
  if (assignment.backups_size() == 0) {
    served.shard->ServeAlone();
    return served;
  }
  if (!planned.keep_replicator && parts_.replication_links == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", assignment.shard_id(), " has backups, but this server replicates to none"));
  }
  served.replicator = planned.keep_replicator
                          ? held->replicator
                          : parts_.replication_links->NewReplicator(assignment.shard_id());
  std::vector<BackupTarget> backups;
  for (const ShardReplica& backup : assignment.backups()) {
    backups.push_back({backup.server_name(), backup.server_address()});
  }
  // Under the shard's lock: every entry after this index reaches the new backups.
  served.shard->SetLogSink(served.replicator, [&](int64_t log_index) {
    served.replicator->SetBackups(epoch, backups, log_index);
    if (!handed_over_by.empty()) served.replicator->BackupHolds(handed_over_by, log_index);
  });
  return served;
}

std::vector<int> ShardHost::HandOver(int64_t epoch, const std::map<int, ServedShard>& held,
                                     ShardInstallPlan* plan, std::map<int, ServedShard>* next) {
  // Closed first, all of them: no call changes them from here on, and their last log
  // entries travel to the new primaries side by side.
  for (const ShardAssignment* assignment : plan->handovers) {
    held.at(assignment->shard_id())
        .shard->Close(
            absl::StrCat("handed over to ", assignment->server_name(), " at epoch ", epoch));
  }
  const absl::Time deadline = absl::Now() + kHandOverTimeout;
  std::vector<int> handed_over;
  std::vector<const ShardAssignment*> handovers;
  handovers.swap(plan->handovers);
  for (const ShardAssignment* assignment : handovers) {
    const int id = assignment->shard_id();
    const ServedShard& was = held.at(id);
    const int64_t last = was.shard->log_index();
    const absl::Status handed =
        was.replicator->AwaitBackup(assignment->server_name(), last, deadline);
    if (handed.ok()) {
      // The new primary has received every entry this one did (it applies them before it
      // serves): the same state, whose log this one follows from here.
      (*next)[id] = ServedShard{was.shard, false, assignment->server_name(), nullptr};
      handed_over.push_back(id);
      plan->handovers.push_back(assignment);
      continue;
    }
    spdlog::warn("shard {}: not handed over to {} ({}); it copies the shard from it instead", id,
                 assignment->server_name(), handed.ToString());
    plan->held[id] = HeldShardFate::kClose;
    plan->backups_to_copy.push_back(assignment);
  }
  return handed_over;
}

absl::StatusOr<std::vector<int>> ShardHost::RetireHeld(const ShardInstallPlan& plan,
                                                       const std::map<int, ServedShard>& held,
                                                       const std::map<int, ServedShard>& next) {
  std::vector<int> handed_off;
  for (const auto& [id, fate] : plan.held) {
    const ServedShard& was = held.at(id);
    switch (fate) {
      case HeldShardFate::kKeep:
        // A primary that is a backup now (handed over) follows its successor's log.
        if (was.primary && !next.at(id).primary) was.shard->SetLogSink(nullptr, {});
        break;
      case HeldShardFate::kHandOff: {
        // Moved to another server: it resumes from this handoff, losing nothing.
        was.shard->Close(absl::StrCat("moved away at epoch ", plan.epoch));
        ShardState handoff = was.shard->Snapshot();
        handoff.epoch = plan.epoch;
        PS_RETURN_IF_ERROR(parts_.checkpoints->WriteNow(handoff));
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

std::vector<bool> ShardHost::ActiveWorkersOf(const ShardMap& map) const {
  std::vector<bool> active(num_workers_, true);
  for (int r = 0; r < map.active_workers_size() && r < num_workers_; ++r)
    active[r] = map.active_workers(r);
  return active;
}

void ShardHost::SetActiveWorkers(const ShardMap& map, const std::map<int, ServedShard>& next) {
  const std::vector<bool> active = ActiveWorkersOf(map);
  for (const auto& [id, served] : next) {
    if (!served.primary) continue;  // a backup changes only through its primary's log
    ActiveWorkersOutcome changed = served.shard->SetActiveWorkers(active);
    if (changed.checkpoint.has_value() && parts_.checkpoints != nullptr) {
      changed.checkpoint->epoch = map.epoch();
      parts_.checkpoints->Enqueue(*std::move(changed.checkpoint));
    }
  }
}

absl::Status ShardHost::AdoptDeclaredModel(const ShardMap& map) {
  const ClusterSpec& spec = spec_;
  if (spec.model.type != ModelType::kTorch || model_adopted_) return absl::OkStatus();
  absl::StatusOr<ModelLayout> layout = LayoutOfDeclaration(map.model());
  if (!layout.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the shard map of epoch ", map.epoch(),
                     " declares no usable model: ", layout.status().message()));
  }
  // Everything is made first and kept only once all of it is: a map that fails here is
  // adopted afresh by the next one.
  std::vector<EmbeddingTableOptions> tables;
  for (size_t t = 0; t < layout->embedding_tables().size(); ++t) {
    const EmbeddingTableSlot& slot = layout->embedding_tables()[t];
    tables.push_back(EmbeddingTableOptionsFor(spec, static_cast<int>(t), static_cast<int>(slot.dim),
                                              slot.settings));
  }
  std::vector<float> initial_parameters;
  if (!spec.model.init_from.empty()) {
    PS_ASSIGN_OR_RETURN(initial_parameters, LoadDenseParameters(*layout, spec.model.init_from));
  }
  std::vector<OptimizerSegment> segments;
  // Parameter groups, and the buffers (which no optimizer updates), make runs of their own.
  if (!spec.training.optimizer.groups.empty() ||
      layout->trained_parameters() < layout->dense_parameters()) {
    PS_ASSIGN_OR_RETURN(segments, OptimizerSegments(spec.training.optimizer, *layout));
  }
  model_.embedding_tables = std::move(tables);
  if (!spec.model.init_from.empty()) model_.initial_parameters = std::move(initial_parameters);
  model_.optimizer_segments = std::move(segments);
  model_.dense_parameters = layout->dense_parameters();
  model_adopted_ = true;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ShardHost::ApplyShardMap(const ShardMap& map) {
  // Only the scheduler's maps, before anything of this one is acted on (a forged map
  // must not even make a copy in progress give up).
  PS_RETURN_IF_ERROR(VerifyShardMapSignature(map, parts_.known_nodes->scheduler_map_key()));
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
  const int64_t serving = parts_.service->epoch();
  absl::StatusOr<MapAdmission> admission =
      AdmitShardMap(map, ServedMap{serving, served_map_digest_});
  if (absl::IsAborted(admission.status())) CountConflict(admission.status());
  if (!admission.ok()) return admission.status();
  if (*admission == MapAdmission::kAlreadyServed) return serving;
  // Who may call this server from now on: the members of this map.
  parts_.known_nodes->ReplaceNodes(map.credentials());
  PS_RETURN_IF_ERROR(AdoptDeclaredModel(map));
  parts_.service->set_initial_values_from(map.initial_values_from());
  const std::map<int, ServedShard> held = parts_.service->shards();
  PS_ASSIGN_OR_RETURN(ShardInstallPlan plan, PlanInstall(map, serving, held));
  // Calls meeting a shard closed from here on are answered "stale epoch": the workers
  // refresh their map at once.
  parts_.service->BeginInstall(map.epoch());

  // A map that keeps the served one's live workers, with no rewind since it (in this map
  // or one this server skipped), serves a kept primary alike (ServePrimary).
  const std::vector<bool> active_workers = ActiveWorkersOf(map);
  const bool served_alike =
      serving > 0 && active_workers == served_active_workers_ && map.rewind_epoch() <= serving;
  std::map<int, ServedShard> next;
  for (const ShardInstallPlan::Primary& planned : plan.primaries) {
    auto was = held.find(planned.assignment->shard_id());
    PS_ASSIGN_OR_RETURN(next[planned.assignment->shard_id()],
                        ServePrimary(planned, map.epoch(),
                                     was != held.end() ? &was->second : nullptr, served_alike));
  }
  for (int id : plan.kept_backups) next[id] = held.at(id);
  const std::vector<int> handed_over = HandOver(map.epoch(), held, &plan, &next);
  PS_ASSIGN_OR_RETURN(const std::vector<int> handed_off, RetireHeld(plan, held, next));
  SetActiveWorkers(map, next);
  std::vector<int> primaries, backups;
  for (const auto& [id, served] : next) (served.primary ? primaries : backups).push_back(id);
  std::set<int> copying;
  for (const ShardAssignment* assignment : plan.backups_to_copy)
    copying.insert(assignment->shard_id());
  spdlog::info(
      "serving epoch {}: primary of shards [{}]{}{}{}{}; mode {}", map.epoch(),
      absl::StrJoin(primaries, ", "),
      backups.empty() ? "" : absl::StrCat("; backup of [", absl::StrJoin(backups, ", "), "]"),
      copying.empty()
          ? ""
          : absl::StrCat("; copying [", absl::StrJoin(copying, ", "), "] from their primaries"),
      handed_over.empty() ? ""
                          : absl::StrCat("; handed [", absl::StrJoin(handed_over, ", "),
                                         "] over to their new primaries"),
      handed_off.empty() ? ""
                         : absl::StrCat("; handed off [", absl::StrJoin(handed_off, ", "), "]"),
      TrainingModesText(spec_.training));
  parts_.service->InstallShards(node_name_, map.epoch(), std::move(next), copying);
  served_map_digest_ = ShardMapDigest(map);
  served_active_workers_ = active_workers;
  PS_RETURN_IF_ERROR(CopyFromPrimaries(plan.backups_to_copy, map.epoch()));
  return map.epoch();
}

absl::Status ShardHost::CopyFromPrimaries(const std::vector<const ShardAssignment*>& assignments,
                                          int64_t epoch) {
  // Side by side: a step that meets the map waits for every new backup's copy (its
  // pushes are acknowledged once the backups hold them), so the copies' latencies must
  // not add up.
  // One channel per primary, shared by its copies (a stub is thread-safe).
  std::map<std::string, std::unique_ptr<ParameterServer::Stub>> stubs;
  std::vector<ParameterShardOptions> options;
  std::vector<ParameterServer::Stub*> primaries;
  for (const ShardAssignment* assignment : assignments) {
    options.push_back(ShardOptions(*assignment));
    std::unique_ptr<ParameterServer::Stub>& stub = stubs[assignment->server_address()];
    if (stub == nullptr) {
      stub =
          ParameterServer::NewStub(CreateChannel(assignment->server_address(), parts_.credentials));
    }
    primaries.push_back(stub.get());
  }
  std::vector<absl::Status> copied(assignments.size());
  // At most kMaxCopiesAtOnce at a time: each holds a shard's whole state in flight.
  std::atomic<size_t> next{0};
  auto copy_next = [&] {
    for (size_t i = next++; i < assignments.size(); i = next++)
      copied[i] = CopyFromPrimary(*assignments[i], options[i], *primaries[i], epoch);
  };
  std::vector<std::thread> copies;
  for (size_t t = 1; t < std::min(assignments.size(), kMaxCopiesAtOnce); ++t)
    copies.emplace_back(copy_next);
  copy_next();
  for (std::thread& copy : copies) copy.join();
  for (const absl::Status& status : copied) PS_RETURN_IF_ERROR(status);
  return absl::OkStatus();
}

absl::Status ShardHost::CopyFromPrimary(const ShardAssignment& assignment,
                                        const ParameterShardOptions& shard_options,
                                        ParameterServer::Stub& primary, int64_t epoch) const {
  FetchShardStateRequest request;
  request.set_shard_id(assignment.shard_id());
  request.set_epoch(epoch);
  // The primary may still be installing this epoch (or restoring the shard).
  const absl::Time first_try = absl::Now();
  absl::Time give_up = first_try + kShardCopyRetryWindow;
  ExponentialBackoff backoff(kShardCopyBackoff);
  int64_t most_received = -1;  // the most bytes of the state any attempt received
  while (true) {
    const absl::Time began = absl::Now();
    ReplicaStateAssembler assembler({shard_options.range, shard_options.num_workers,
                                     shard_options.embedding.get(), &shard_options.optimizer});
    absl::Status refused;  // a piece the assembler refused
    grpc::Status status;
    bool stalled = false;
    int64_t primary_epoch = 0;  // the epoch a refusing primary serves (kServingEpochMetadata)
    {
      grpc::ClientContext context;
      // The copy's length depends on the shard's size, so the deadline that bounds it
      // is the stall between pieces; the call's own is a backstop.
      context.set_deadline(absl::ToChronoTime(first_try + kShardCopyBound));
      ProgressWatchdog watchdog(parts_.copy_stall, [&context] { context.TryCancel(); });
      std::unique_ptr<grpc::ClientReader<ShardStatePiece>> reader =
          primary.FetchShardState(&context, request);
      ShardStatePiece piece;
      while (reader->Read(&piece)) {
        // Progress is the header or bytes of the state, not empty pieces.
        if (piece.has_state() || !piece.data().empty()) watchdog.Progress();
        if (refused.ok()) refused = assembler.Add(std::move(piece));
        // A refused piece ends the copy; so does a newer map, whose install decides
        // where this shard's copy comes from (below).
        if (!refused.ok() || newest_map_epoch_.load() > epoch) context.TryCancel();
      }
      watchdog.Stop();
      stalled = watchdog.fired();
      status = reader->Finish();
      primary_epoch = ServingEpochNamed(context);
    }
    if (!refused.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("copying shard ", assignment.shard_id(),
                                                     " from its primary ", assignment.server_name(),
                                                     ": ", refused.message()));
    }
    if (status.ok()) {
      PS_ASSIGN_OR_RETURN(ReplicaState replica, assembler.Finish());
      PS_ASSIGN_OR_RETURN(std::unique_ptr<ParameterShard> shard,
                          ParameterShard::FromReplica(shard_options, std::move(replica)));
      const int64_t log_index = shard->log_index();
      ServedShard served{std::shared_ptr<ParameterShard>(std::move(shard)), false,
                         assignment.server_name(), nullptr};
      if (parts_.service->FinishCopy(epoch, assignment.shard_id(), std::move(served))) {
        spdlog::info("shard {}: copied from its primary {} at log index {} ({} MiB in {})",
                     assignment.shard_id(), assignment.server_name(), log_index,
                     assembler.bulk_bytes_received() >> 20,
                     absl::FormatDuration(absl::Now() - began));
      }
      return absl::OkStatus();
    }
    if (stalled && status.error_code() == grpc::StatusCode::CANCELLED) {
      status = grpc::Status(
          grpc::StatusCode::DEADLINE_EXCEEDED,
          absl::StrCat("no piece of the state for ", absl::FormatDuration(parts_.copy_stall),
                       " after ", assembler.bulk_bytes_received(), " of ",
                       assembler.bulk_bytes_expected(), " bytes"));
    }
    // Retries are for a primary not ready yet, or a copy cut off: one that got further
    // than any before counts its wait anew, within the whole copy's bound.
    if (assembler.bulk_bytes_received() > most_received) {
      most_received = assembler.bulk_bytes_received();
      give_up = std::min(absl::Now() + kShardCopyRetryWindow, first_try + kShardCopyBound);
    }
    // A newer map came in meanwhile, or the primary refused the copy as asked under an
    // older map than it serves (this server has not heard of the newer one yet: a worker
    // joined as the cluster formed): that map's install decides where this shard's copy
    // comes from. Not an error: the first map's install failing would end the server.
    const bool primary_moved_on =
        status.error_code() == grpc::StatusCode::FAILED_PRECONDITION && primary_epoch > epoch;
    if (newest_map_epoch_.load() > epoch || primary_moved_on) {
      spdlog::info("shard {}: copy at epoch {} abandoned for the newer map's ({})",
                   assignment.shard_id(), epoch, status.error_message());
      return absl::OkStatus();
    }
    // CANCELLED here is the primary's doing (this side's cancellations were dealt with
    // above): it cancels its calls as it shuts down, and may be back, or replaced by a
    // newer map, within the retry window.
    const bool retry = IsRetryable(static_cast<absl::StatusCode>(status.error_code()),
                                   /*deadline_exceeded_too=*/true) ||
                       status.error_code() == grpc::StatusCode::CANCELLED;
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

}  // namespace paramserver
