#include "scheduler/cluster_registry.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/model/model_declaration.h"
#include "common/model/optimizer_groups.h"
#include "common/security/secrets.h"
#include "common/wire/shard_layout.h"
#include "scheduler/shard_placement.h"
#include "spdlog/spdlog.h"

namespace paramserver {
namespace {

std::shared_ptr<const MapSigningKey> GenerateMapSigningKey() {
  absl::StatusOr<std::unique_ptr<MapSigningKey>> key = MapSigningKey::Generate();
  // Key generation fails only when OpenSSL cannot read the system's random source: a
  // broken machine (as for NewSecretToken), not bad input.
  if (!key.ok()) {
    spdlog::critical("{}", key.status().ToString());
    std::abort();
  }
  return std::move(*key);
}

}  // namespace

ClusterRegistry::ClusterRegistry(RegistryOptions options)
    : options_(std::move(options)),
      replication_(std::max(1, options_.cluster.replication)),
      roster_(options_.cluster),
      progress_(options_.ctr),
      shard_records_(options_.async_tables),
      layout_(options_.layout),
      data_leases_(options_.epochs, options_.chunk_batches, WorkerSlots(options_.cluster)),
      map_signing_key_(options_.map_signing_key != nullptr ? options_.map_signing_key
                                                           : GenerateMapSigningKey()) {}

void ClusterRegistry::MaybePlaceShards(absl::Time now) {
  const ClusterSection& cluster = options_.cluster;
  // Servers past min (cluster.servers' range) may have registered already: they are
  // placed on too; and workers past min train from the first map.
  if (shard_map_.has_value() || roster_.CountRole(NODE_ROLE_SERVER) < cluster.servers ||
      roster_.CountRole(NODE_ROLE_WORKER) < cluster.workers) {
    return;
  }
  if (options_.model_declared_by_workers && model_declared_by_.empty()) return;
  const std::vector<ServerEndpoint> servers = roster_.Servers(/*live_only=*/false);
  progress_.MarkAdvance(now);
  ShardMap map =
      PlaceShards(layout_, cluster.shards, cluster.embedding_shards, servers, /*epoch=*/1);
  AssignBackups(&map, servers, replication_);
  for (bool active : roster_.ActiveWorkers()) map.add_active_workers(active);
  if (options_.resume_step >= 0) {
    for (ShardAssignment& assignment : *map.mutable_shards()) {
      // A hybrid job's tables were checkpointed at their own update counts: each
      // restores its newest.
      if (options_.async_tables && assignment.kind() == SHARD_KIND_EMBEDDING_ROWS) {
        assignment.set_restore(SHARD_RESTORE_NEWEST);
        continue;
      }
      assignment.set_restore(SHARD_RESTORE_AT_STEP);
      assignment.set_restore_step(options_.resume_step);
    }
  }
  if (options_.model_declared_by_workers) {
    *map.mutable_model() = declared_model_;
    if (!options_.model_init_from && !options_.resumed_model.has_value())
      map.set_initial_values_from(model_declared_by_);
  }
  SealMap(&map);
  NoteBackupRoles(map);
  SetShardMapLocked(map);
  ++state_version_;
}

absl::StatusOr<DeclareModelResponse> ClusterRegistry::DeclareModel(const std::string& name,
                                                                   const ModelDeclaration& model,
                                                                   absl::Time now) {
  if (!options_.model_declared_by_workers) {
    return absl::FailedPreconditionError(
        "this job's model is the spec's (model.type mlp or ctr), not declared by workers: run "
        "a script through the Python package with model.type torch");
  }
  // Validated before the lock: the check allocates and walks the whole declaration.
  PS_ASSIGN_OR_RETURN(ModelLayout layout, LayoutOfDeclaration(model));
  // The spec's parameter groups must name this model's tensors.
  PS_RETURN_IF_ERROR(OptimizerSegments(options_.optimizer, layout).status());
  if (layout.dense_parameters() < options_.cluster.shards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cluster.shards (", options_.cluster.shards, ") exceeds the model's ",
        layout.dense_parameters(), " dense parameters: give fewer shards or more tensors"));
  }
  if (options_.resumed_model.has_value()) {
    PS_RETURN_IF_ERROR(CheckSameModel(*options_.resumed_model, model,
                                      "the job whose checkpoints this one resumes"));
  }
  DeclareModelResponse response;
  bool first = false;
  {
    absl::MutexLock lock(&mu_);
    const Node* node = roster_.Find(name);
    if (node == nullptr || node->role != NODE_ROLE_WORKER || !node->alive) {
      return absl::NotFoundError(absl::StrCat(name, " is not a live worker of this job"));
    }
    if (model_declared_by_.empty()) {
      declared_model_ = model;
      model_declared_by_ = name;
      layout_ = std::move(layout);
      ++state_version_;
      first = true;
      MaybePlaceShards(now);
    } else {
      PS_RETURN_IF_ERROR(CheckSameModel(declared_model_, model, model_declared_by_));
    }
    // The declarer's values are the initial ones (unless the shards restore from a
    // checkpoint or model.init_from); its retried call (or its replacement's, in the
    // same slot) is told so again.
    response.set_sets_initial_values(model_declared_by_ == name && !options_.model_init_from &&
                                     !options_.resumed_model.has_value());
  }
  if (first && options_.on_model_declared) options_.on_model_declared(model);
  return response;
}

void ClusterRegistry::SealMap(ShardMap* map) const {
  roster_.AddCredentials(map);
  map_signing_key_->Sign(map);
}

RegisterResponse ClusterRegistry::RegistrationOf(const Node& node) const {
  RegisterResponse response;
  response.set_node_name(node.name);
  response.set_rank(node.rank);
  response.set_scheduler_token_sha256(Sha256(scheduler_token_));
  response.set_scheduler_map_key(map_signing_key_->public_key());
  return response;
}

std::optional<KnownNode> ClusterRegistry::FindCredential(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  if (name == kSchedulerNodeName)
    return KnownNode{NODE_ROLE_UNSPECIFIED, -1, Sha256(scheduler_token_)};
  // A dead node's credential still says who it is (its heartbeat is answered "register
  // again"); a new registration into its slot replaces it.
  if (const Node* node = roster_.Find(name); node != nullptr)
    return KnownNode{node->role, node->rank, node->token_sha256};
  return std::nullopt;
}

void ClusterRegistry::NoteBackupRoles(const ShardMap& next) {
  std::map<int, const ShardAssignment*> present;
  if (shard_map_.has_value()) {
    for (const ShardAssignment& assignment : shard_map_->shards())
      present[assignment.shard_id()] = &assignment;
  }
  std::map<std::pair<std::string, int>, int64_t> since;
  for (const ShardAssignment& assignment : next.shards()) {
    // A new primary, or one that restores the shard, starts a log its backups have to
    // copy the shard to follow: until they report the copy, they hold nothing (a
    // primary's acknowledgements do not wait for a backup before it has copied).
    auto was = present.find(assignment.shard_id());
    const bool same_log = was != present.end() &&
                          was->second->server_name() == assignment.server_name() &&
                          assignment.restore() == SHARD_RESTORE_NONE;
    for (const ShardReplica& backup : assignment.backups()) {
      const std::pair<std::string, int> role{backup.server_name(), assignment.shard_id()};
      auto kept = backup_since_.find(role);
      since[role] = same_log && kept != backup_since_.end() ? kept->second : next.epoch();
    }
  }
  backup_since_ = std::move(since);
}

ShardMap ClusterRegistry::NextMap() const {
  ShardMap map = *shard_map_;
  map.set_epoch(map.epoch() + 1);
  for (ShardAssignment& assignment : *map.mutable_shards()) {
    assignment.set_restore(SHARD_RESTORE_NONE);
    assignment.set_restore_step(0);
  }
  map.clear_active_workers();
  for (bool active : roster_.ActiveWorkers()) map.add_active_workers(active);
  return map;
}

MapChange ClusterRegistry::Publish(PlannedMapChange planned) {
  ShardMap& map = planned.map;
  const std::vector<std::string>& losing_servers = planned.losing_servers;
  ++state_version_;
  for (ShardAssignment& assignment : *map.mutable_shards()) {
    if (const Node* server = roster_.FindServer(assignment.server_name()); server != nullptr) {
      assignment.set_server_address(server->address);
    }
    for (ShardReplica& backup : *assignment.mutable_backups()) {
      if (const Node* server = roster_.FindServer(backup.server_name()); server != nullptr) {
        backup.set_server_address(server->address);
      }
    }
  }
  SealMap(&map);
  NoteBackupRoles(map);
  SetShardMapLocked(map);
  MapChange change;
  change.map = std::move(map);
  change.summary = std::move(planned.summary);
  for (const Node& node : roster_.nodes()) {
    if (node.role != NODE_ROLE_SERVER || !node.alive) continue;
    const bool first =
        std::find(losing_servers.begin(), losing_servers.end(), node.name) != losing_servers.end();
    (first ? change.servers_first : change.servers_then).push_back(node.name);
    (first ? change.addresses_first : change.addresses_then).push_back(node.address);
  }
  return change;
}

absl::StatusOr<RegisterResponse> ClusterRegistry::Register(
    NodeRole role, const std::string& address, const std::string& node_token, absl::Time now,
    std::optional<MapChange>* change, const std::string& previous_node_token) {
  if (role != NODE_ROLE_SERVER && role != NODE_ROLE_WORKER) {
    return absl::InvalidArgumentError("register: role must be SERVER or WORKER");
  }
  if (address.find(':') == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("register: advertised address '", address, "' is not host:port"));
  }
  if (node_token.size() < 32 || node_token.size() > 128) {
    return absl::InvalidArgumentError(absl::StrCat(
        "register: the node's token must be 32 to 128 bytes, found ", node_token.size()));
  }
  if (previous_node_token.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("register: the previous node token must be at most 128 bytes, found ",
                     previous_node_token.size()));
  }
  const std::string token_sha256 = Sha256(node_token);
  const std::string previous_sha256 =
      previous_node_token.empty() ? std::string() : Sha256(previous_node_token);
  // A server joining a job whose servers all died takes their shards from disk.
  const int64_t rollback = role == NODE_ROLE_SERVER ? MaybeReadRollbackTarget(true) : -1;
  absl::MutexLock lock(&mu_);
  PS_ASSIGN_OR_RETURN(NodeRoster::Admission admitted,
                      roster_.Admit(role, address, token_sha256, now, previous_sha256));
  Node& node = *admitted.node;
  if (admitted.repeat) return RegistrationOf(node);
  ++state_version_;
  if (!shard_map_.has_value()) {
    MaybePlaceShards(now);
  } else if (admitted.rejoined) {
    if (role == NODE_ROLE_SERVER) {
      *change = Rebalance(node, rollback);
    } else if (admitted.grown) {
      *change = Publish(
          {NextMap(), {}, absl::StrCat(node.name, " joined at ", address, "; ", WorkersLine())});
    } else {
      *change = Publish({NextMap(),
                         {},
                         absl::StrCat(node.name, " rejoined at ", address, "; it trains again; ",
                                      WorkersLine())});
    }
  }
  return RegistrationOf(node);
}

MapChange ClusterRegistry::Rebalance(const Node& joined, int64_t rollback) {
  return Publish(PlanServerJoin(NextMap(), {joined.name, joined.address}, roster_.Servers(true),
                                RecoveryContextLocked(rollback)));
}

int64_t ClusterRegistry::MaybeReadRollbackTarget(bool only_when_a_primary_is_dead) {
  if (!options_.checkpoints || options_.mode != TrainingMode::kSync ||
      !options_.newest_complete_checkpoint) {
    return -1;
  }
  ModelLayout layout;
  {
    absl::MutexLock lock(&mu_);
    if (only_when_a_primary_is_dead &&
        (!shard_map_.has_value() || !HasDeadPrimary(*shard_map_, roster_.Servers(true)))) {
      return -1;
    }
    layout = layout_;
  }
  return options_.newest_complete_checkpoint(layout);
}

RecoveryContext ClusterRegistry::RecoveryContextLocked(int64_t rollback_step) const {
  RecoveryContext context;
  context.mode = options_.mode;
  context.async_tables = options_.async_tables;
  context.replication = replication_;
  context.checkpoints = options_.checkpoints;
  context.rollback_step = rollback_step;
  context.shards = &shard_records_.records();
  copying_.clear();
  if (shard_map_.has_value()) {
    // A backup holds its shard once its server listed it as copied in a heartbeat at or
    // after the epoch that gave it the role (unknown roles, after a takeover: any epoch).
    for (const ShardAssignment& assignment : shard_map_->shards()) {
      for (const ShardReplica& backup : assignment.backups()) {
        const Node* server = roster_.FindServer(backup.server_name());
        auto since = backup_since_.find({backup.server_name(), assignment.shard_id()});
        const int64_t needed = since != backup_since_.end() ? since->second : 0;
        const bool holds = server != nullptr &&
                           server->ready_backups.count(assignment.shard_id()) > 0 &&
                           server->ready_backups_epoch >= needed;
        if (!holds) copying_.insert({backup.server_name(), assignment.shard_id()});
      }
    }
  }
  context.copying = &copying_;
  return context;
}

absl::StatusOr<MapChange> ClusterRegistry::RecoverFromServerLoss(
    const Node& dead, int64_t rollback, std::optional<absl::Time> found_at) {
  RecoveryContext context = RecoveryContextLocked(rollback);
  std::set<std::string> failing;
  if (found_at.has_value()) {
    // Silent for half the failure timeout, and for two beats at least (a healthy server
    // is silent for up to one between beats): with a timeout under four beats, nobody.
    const absl::Duration lately =
        std::max(absl::Milliseconds(options_.cluster.failure_timeout_ms) / 2,
                 2 * absl::Milliseconds(options_.cluster.heartbeat_interval_ms));
    for (auto& [name, silent_for] : roster_.Silent(*found_at, lately, /*job_over=*/false)) {
      if (name != dead.name && roster_.FindServer(name) != nullptr) failing.insert(name);
    }
  }
  context.failing = &failing;
  PS_ASSIGN_OR_RETURN(
      PlannedMapChange planned,
      PlanServerLoss(NextMap(), dead.name, roster_.Servers(true, dead.name), context));
  return Publish(std::move(planned));
}

absl::StatusOr<MapChange> ClusterRegistry::Drain(const std::string& name) {
  absl::MutexLock lock(&mu_);
  Node* node = roster_.Find(name);
  if (node == nullptr || node->role != NODE_ROLE_SERVER || !node->alive) {
    return absl::NotFoundError(absl::StrCat(name, " is not a live server"));
  }
  if (!shard_map_.has_value())
    return absl::FailedPreconditionError("the cluster has not formed yet");
  PS_ASSIGN_OR_RETURN(PlannedMapChange planned,
                      PlanDrain(NextMap(), name, roster_.Servers(true, name),
                                RecoveryContextLocked(/*rollback_step=*/-1)));
  MapChange change = Publish(std::move(planned));
  node->alive = false;  // after Publish, which sends it the map first so that it hands off
  node->drained = true;
  node->drained_at_epoch = change.map.epoch();
  ++state_version_;
  return change;
}

absl::StatusOr<MapChange> ClusterRegistry::Leave(const std::string& name) {
  NodeRole role = NODE_ROLE_UNSPECIFIED;
  {
    absl::MutexLock lock(&mu_);
    const Node* node = roster_.Find(name);
    if (node == nullptr || !node->alive)
      return absl::NotFoundError(absl::StrCat(name, " is not a live node"));
    role = node->role;
  }
  return role == NODE_ROLE_SERVER ? Drain(name) : DeclareDead(name);
}

std::optional<MapChange> ClusterRegistry::BalancePrimaries(absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (!shard_map_.has_value() || replication_ < 2 || progress_.over()) return std::nullopt;
  std::map<std::string, std::set<int>> ready;
  for (const Node& node : roster_.nodes()) {
    if (node.role != NODE_ROLE_SERVER || !node.alive) continue;
    // A server still installing the map (or copying) has not said what it holds.
    if (node.serving_epoch != shard_map_->epoch()) return std::nullopt;
    if (now - node.last_heartbeat >
        2 * absl::Milliseconds(options_.cluster.heartbeat_interval_ms)) {
      return std::nullopt;
    }
    ready[node.name] = node.ready_backups;
  }
  std::optional<PlannedMapChange> planned =
      PlanPrimaryBalance(NextMap(), roster_.Servers(/*live_only=*/true), ready);
  if (!planned.has_value()) return std::nullopt;
  return Publish(*std::move(planned));
}

absl::StatusOr<MapChange> ClusterRegistry::DeclareDead(const std::string& name,
                                                       std::optional<absl::Time> found_at) {
  // Plan: a server's sync rollback target is disk I/O, read before the lock.
  bool server = false;
  {
    absl::MutexLock lock(&mu_);
    const Node* node = roster_.Find(name);
    server = node != nullptr && node->role == NODE_ROLE_SERVER;
  }
  const int64_t rollback =
      server ? MaybeReadRollbackTarget(/*only_when_a_primary_is_dead=*/false) : -1;
  // Act, under the lock.
  absl::MutexLock lock(&mu_);
  Node* node = roster_.Find(name);
  if (node == nullptr || !node->alive)
    return absl::NotFoundError(absl::StrCat(name, " is not a live node"));
  node->alive = false;
  ++state_version_;
  if (!shard_map_.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, " died before the cluster formed; waiting for a replacement"));
  }
  if (node->role == NODE_ROLE_SERVER) return RecoverFromServerLoss(*node, rollback, found_at);
  MapChange change = Publish(
      {NextMap(),
       {},
       absl::StrCat(
           name,
           options_.mode == TrainingMode::kSync ? " lost; sync steps complete without it" : " lost",
           data_leases_.Export().example_count() > 0
               ? "; its lease's untrained rest goes to another worker"
               : "; its share of the data is skipped until a worker rejoins in its place",
           "; ", WorkersLine())});
  FenceLeases(*node);
  return change;
}

std::string ClusterRegistry::WorkersLine() const {
  const int live = roster_.LiveWorkers();
  std::string line =
      absl::StrCat(live, " worker(s) train now (cluster.workers ", options_.cluster.workers,
                   WorkerSlots(options_.cluster) > options_.cluster.workers
                       ? absl::StrCat("..", WorkerSlots(options_.cluster))
                       : "",
                   ")");
  if (options_.mode == TrainingMode::kSync && options_.batch_size > 0) {
    absl::StrAppend(&line, ": each step's mean is over ", live, " x ", options_.batch_size, " = ",
                    int64_t{live} * options_.batch_size, " examples (the effective batch)");
  }
  return line;
}

void ClusterRegistry::FenceLeases(const Node& node) {
  data_leases_.Fence(node.rank, shard_map_->epoch());
  ++state_version_;
  SettleLeases();
}

void ClusterRegistry::SettleLeases() {
  if (!data_leases_.settling()) return;
  std::vector<ServerPushReport> reports;
  for (const Node& server : roster_.nodes()) {
    if (server.role != NODE_ROLE_SERVER || !server.alive) continue;
    reports.push_back({server.name, server.pushes_reported_at_epoch, server.worker_next_steps});
  }
  const int64_t before = data_leases_.changes();
  for (const std::string& line : data_leases_.Settle(reports))
    spdlog::info("data leases: {}", line);
  if (data_leases_.changes() != before) ++state_version_;
}

absl::StatusOr<LeaseDataResponse> ClusterRegistry::LeaseData(const LeaseDataRequest& request) {
  absl::MutexLock lock(&mu_);
  if (options_.mode != TrainingMode::kAsync) {
    return absl::FailedPreconditionError(
        absl::StrCat("data leases are for training.mode async; this job trains ",
                     TrainingModeName(options_.mode)));
  }
  const Node* node = roster_.Find(request.node_name());
  if (node == nullptr || node->role != NODE_ROLE_WORKER) {
    return absl::NotFoundError(absl::StrCat(request.node_name(), " is not a worker of this job"));
  }
  if (!node->alive) {
    return absl::FailedPreconditionError(absl::StrCat(
        request.node_name(), " was declared dead; register again before asking for data"));
  }
  if (!shard_map_.has_value()) {
    return absl::FailedPreconditionError("the cluster has not formed yet");
  }
  SettleLeases();
  const int64_t changes = data_leases_.changes();
  PS_ASSIGN_OR_RETURN(LeaseDataResponse response, data_leases_.Lease(node->rank, request));
  if (data_leases_.changes() != changes) ++state_version_;
  return response;
}

void ClusterRegistry::NoteAlive(const std::string& name, absl::Time now) {
  absl::MutexLock lock(&mu_);
  Node* node = roster_.Find(name);
  if (node != nullptr && node->alive) node->last_heartbeat = std::max(node->last_heartbeat, now);
}

void ClusterRegistry::NoteToldJobFinished(const std::string& name) {
  absl::MutexLock lock(&mu_);
  Node* node = roster_.Find(name);
  // Only a finished worker waiting for the result acts on the view (it exits); a server,
  // or a worker still training, stops only on a heartbeat answer.
  if (node != nullptr && node->alive && node->role == NODE_ROLE_WORKER && node->finished &&
      progress_.result().has_value()) {
    node->told_to_stop = true;
  }
}

void ClusterRegistry::SetMapListener(std::function<void(int64_t epoch)> listener) {
  absl::MutexLock lock(&mu_);
  map_listener_ = std::move(listener);
  if (map_listener_) map_listener_(shard_map_.has_value() ? shard_map_->epoch() : 0);
}

ClusterView ClusterRegistry::View() const {
  absl::MutexLock lock(&mu_);
  ClusterView view = ViewFieldsLocked();
  if (shard_map_.has_value()) *view.mutable_shard_map() = *shard_map_;
  return view;
}

ClusterView ClusterRegistry::ViewWithoutMap(std::shared_ptr<const std::string>* map_bytes) const {
  absl::MutexLock lock(&mu_);
  if (map_bytes == nullptr) return ViewFieldsLocked();
  if (shard_map_.has_value() && serialized_map_ == nullptr) {
    serialized_map_ = std::make_shared<const std::string>(shard_map_->SerializeAsString());
  }
  *map_bytes = serialized_map_;
  return ViewFieldsLocked();
}

void ClusterRegistry::SetShardMapLocked(ShardMap map) {
  shard_map_ = std::move(map);
  serialized_map_.reset();  // the old map's bytes
  if (map_listener_) map_listener_(shard_map_->epoch());
}

ClusterView ClusterRegistry::ViewFieldsLocked() const {
  ClusterView view;
  view.set_ready(shard_map_.has_value());
  view.set_expected_servers(options_.cluster.servers);
  view.set_registered_servers(roster_.CountRole(NODE_ROLE_SERVER));
  view.set_expected_workers(options_.cluster.workers);
  view.set_max_workers(WorkerSlots(options_.cluster));
  view.set_registered_workers(roster_.CountRole(NODE_ROLE_WORKER));
  view.set_workers_finished(roster_.FinishedWorkers());
  view.set_live_workers(roster_.LiveWorkers());
  view.set_job_finished(progress_.result().has_value());
  view.set_finisher_rank(roster_.FinisherRank());
  return view;
}

absl::StatusOr<HeartbeatResponse> ClusterRegistry::Heartbeat(const HeartbeatRequest& request,
                                                             absl::Time now) {
  PS_RETURN_IF_ERROR(JobProgress::CheckHeartbeatFigures(request));
  absl::MutexLock lock(&mu_);
  Node* node = roster_.Find(request.node_name());
  if (node == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("heartbeat from unknown node '", request.node_name(), "'"));
  }
  if (node->drained) {
    // Still heard from (psctl scale waits for a drained server's heartbeats to stop).
    node->last_heartbeat = now;
    return DrainedReply(*node, request.serving_epoch());
  }
  if (!node->alive) {
    return absl::FailedPreconditionError(absl::StrCat(
        request.node_name(), " was declared dead and replaced; register again to rejoin"));
  }
  RecordHeartbeat(*node, request, now);
  if (progress_.over()) node->told_to_stop = true;
  HeartbeatResponse response;
  response.set_epoch(shard_map_.has_value() ? shard_map_->epoch() : 0);
  response.set_job_finished(progress_.over());
  response.set_shutdown(progress_.shutdown_requested());
  response.set_scheduler_token_sha256(Sha256(scheduler_token_));
  response.set_scheduler_map_key(map_signing_key_->public_key());
  response.set_checkpoint_retain_from(
      shard_map_.has_value() ? shard_records_.RetainFrom(*shard_map_) : -1);
  return response;
}

HeartbeatResponse ClusterRegistry::DrainedReply(const Node& node, int64_t serving_epoch) const {
  // Told to exit only once it serves the map that drained it: before, it may not have
  // written the handoff checkpoints of the shards that move without a backup.
  HeartbeatResponse drained;
  drained.set_epoch(shard_map_.has_value() ? shard_map_->epoch() : 0);
  drained.set_shutdown(serving_epoch >= node.drained_at_epoch);
  drained.set_scheduler_token_sha256(Sha256(scheduler_token_));
  drained.set_scheduler_map_key(map_signing_key_->public_key());
  return drained;
}

void ClusterRegistry::RecordHeartbeat(Node& node, const HeartbeatRequest& request, absl::Time now) {
  node.last_heartbeat = now;
  if (request.shard_map_conflicts() > node.shard_map_conflicts) {
    // Two maps of one epoch, both signed by this scheduler process or its predecessor: a
    // bug worth an operator's attention (the server kept the first).
    spdlog::error("{} refused {} conflicting shard map(s); the last: {}", node.name,
                  request.shard_map_conflicts() - node.shard_map_conflicts,
                  request.last_shard_map_conflict().substr(0, kMaxTroubleText));
    node.shard_map_conflicts = request.shard_map_conflicts();
  }
  if (node.role == NODE_ROLE_WORKER)
    progress_.RecordWorkerProgress(node.name, node.progress.step(), request.progress(), now);
  node.progress = request.progress();
  if (node.role != NODE_ROLE_SERVER) return;
  node.refused_gradients = request.refused_gradients();
  node.serving_epoch = request.serving_epoch();
  node.ready_backups_epoch = request.serving_epoch();
  if (!request.worker_next_steps().empty()) {
    node.worker_next_steps.assign(request.worker_next_steps().begin(),
                                  request.worker_next_steps().end());
    node.pushes_reported_at_epoch = request.serving_epoch();
    SettleLeases();
  }
  node.ready_backups.clear();
  for (const ShardStatus& shard : request.shards()) {
    if (shard.backup()) node.ready_backups.insert(shard.shard_id());
  }
  node.checkpoint_trouble = request.checkpoint_trouble();
  // A peer's text: bounded before it is kept and shown.
  if (node.checkpoint_trouble.error().size() > kMaxTroubleText)
    node.checkpoint_trouble.mutable_error()->resize(kMaxTroubleText);
  if (shard_map_.has_value() && request.serving_epoch() == shard_map_->epoch())
    shard_records_.Record(node.name, request, *shard_map_, now);
}

absl::StatusOr<ReportFinishedResponse> ClusterRegistry::ReportFinished(
    const ReportFinishedRequest& request, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (request.steps() < 0 || request.samples() < 0 || request.samples() > (int64_t{1} << 53) ||
      !(std::isfinite(request.seconds()) && request.seconds() >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("report from '", request.node_name(), "': steps ", request.steps(),
                     ", samples ", request.samples(), " and seconds ", request.seconds(),
                     " must be finite and >= 0 (samples at most 2^53)"));
  }
  Node* node = roster_.Find(request.node_name());
  if (node == nullptr || node->role != NODE_ROLE_WORKER || !node->alive) {
    return absl::NotFoundError(
        absl::StrCat("report from unknown or dead worker '", request.node_name(), "'"));
  }
  node->finished = true;
  node->last_heartbeat = now;
  node->summary = request;
  ++state_version_;
  ReportFinishedResponse response;
  response.set_workers_finished(roster_.FinishedWorkers());
  response.set_workers_total(roster_.LiveWorkers());
  return response;
}

absl::StatusOr<JobResult> ClusterRegistry::ReportResult(const ReportResultRequest& request) {
  absl::MutexLock lock(&mu_);
  if (progress_.result().has_value()) return *progress_.result();  // the first one stands
  const Node* node = roster_.Find(request.node_name());
  const int finisher = roster_.FinisherRank();
  if (node == nullptr || node->role != NODE_ROLE_WORKER || !node->alive || node->rank != finisher) {
    return absl::FailedPreconditionError(
        absl::StrCat("the final result must come from the lowest-ranked live worker (rank ",
                     finisher, "), not '", request.node_name(), "'"));
  }
  if (roster_.FinishedWorkers() < roster_.LiveWorkers()) {
    return absl::FailedPreconditionError(absl::StrCat("only ", roster_.FinishedWorkers(), " of ",
                                                      roster_.LiveWorkers(),
                                                      " live workers have finished"));
  }
  PS_ASSIGN_OR_RETURN(JobResult result,
                      progress_.SetResult(request, node->name, roster_.nodes(), absl::Now()));
  ++state_version_;
  return result;
}

std::vector<SilentNode> ClusterRegistry::SilentNodes(absl::Time now, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  std::vector<SilentNode> silent;
  for (auto& [name, silent_for] : roster_.Silent(now, timeout, progress_.over()))
    silent.push_back({std::move(name), silent_for});
  return silent;
}

void ClusterRegistry::ExcludeSchedulerPause(absl::Duration pause, absl::Time now) {
  absl::MutexLock lock(&mu_);
  roster_.ExcludePause(pause, now);
}

absl::StatusOr<std::pair<int64_t, std::vector<std::string>>> ClusterRegistry::PlanCheckpoint(
    absl::Time now, absl::Duration lead) const {
  absl::MutexLock lock(&mu_);
  if (!options_.checkpoints) return absl::FailedPreconditionError("checkpoint.dir is not set");
  if (!shard_map_.has_value())
    return absl::FailedPreconditionError("the cluster has not formed yet");
  std::vector<std::string> servers;
  for (const ServerEndpoint& server : roster_.Servers(/*live_only=*/true))
    servers.push_back(server.address);
  return std::make_pair(shard_records_.StepAfter(now, lead), servers);
}

bool ClusterRegistry::job_finished() const {
  absl::MutexLock lock(&mu_);
  return progress_.over();
}

void ClusterRegistry::RequestShutdown() {
  absl::MutexLock lock(&mu_);
  if (progress_.RequestShutdown()) ++state_version_;
}

bool ClusterRegistry::EndJobUnfinished(absl::Status why) {
  absl::MutexLock lock(&mu_);
  if (!progress_.EndUnfinished(std::move(why))) return false;
  ++state_version_;
  return true;
}

absl::Status ClusterRegistry::ended_unfinished() const {
  absl::MutexLock lock(&mu_);
  return progress_.ended_unfinished();
}

ClusterRegistry::Snapshot ClusterRegistry::TakeSnapshot(bool with_history) const {
  absl::MutexLock lock(&mu_);
  Snapshot snapshot;
  snapshot.cluster = options_.cluster;
  snapshot.mode = options_.mode;
  snapshot.async_tables = options_.async_tables;
  snapshot.replication = replication_;
  snapshot.nodes = roster_.nodes();
  for (Node& node : snapshot.nodes) node.token_sha256.clear();
  snapshot.shard_map = shard_map_;
  snapshot.shard_records = shard_records_.records();
  snapshot.data_leases = data_leases_.Export();
  if (with_history) snapshot.history = progress_.history();
  snapshot.result = progress_.result();
  snapshot.ctr = options_.ctr;
  snapshot.batch_size = options_.batch_size;
  snapshot.shutdown_requested = progress_.shutdown_requested();
  snapshot.last_advance = progress_.last_advance();
  snapshot.started = started_;
  snapshot.finished = progress_.finished();
  return snapshot;
}

bool ClusterRegistry::all_servers_told_to_stop() const {
  absl::MutexLock lock(&mu_);
  // After a shutdown the workers must hear it too: they would otherwise train on. After
  // the result, so must the finished workers other than the one that reported it: they
  // wait for it, in case they must evaluate in a lost rank 0's place.
  const std::vector<Node>& nodes = roster_.nodes();
  return std::all_of(
      nodes.begin(), nodes.end(), [this](const Node& n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        const bool waits_for_result = progress_.result().has_value() &&
                                      n.role == NODE_ROLE_WORKER && n.finished &&
                                      n.name != progress_.result_reporter();
        const bool must_hear = n.role == NODE_ROLE_SERVER ||
                               (progress_.shutdown_requested() && !n.finished) || waits_for_result;
        return !must_hear || !n.alive || n.told_to_stop;
      });
}

}  // namespace paramserver
