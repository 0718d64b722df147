#include "scheduler/cluster_registry.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model_declaration.h"
#include "common/secrets.h"
#include "common/shard_layout.h"
#include "common/status_macros.h"
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
      layout_(options_.layout),
      map_signing_key_(options_.map_signing_key != nullptr ? options_.map_signing_key
                                                           : GenerateMapSigningKey()) {}

void ClusterRegistry::MaybePlaceShards(absl::Time now) {
  const ClusterSection& cluster = options_.cluster;
  if (shard_map_.has_value() || CountRole(NODE_ROLE_SERVER) != cluster.servers ||
      CountRole(NODE_ROLE_WORKER) != cluster.workers) {
    return;
  }
  if (options_.model_declared_by_workers && model_declared_by_.empty()) return;
  std::vector<ServerEndpoint> servers;
  for (const Node& n : nodes_) {
    if (n.role == NODE_ROLE_SERVER) servers.push_back({n.name, n.address});
  }
  last_advance_ = now;
  ShardMap map =
      PlaceShards(layout_, cluster.shards, cluster.embedding_shards, servers, /*epoch=*/1);
  AssignBackups(&map, servers, replication_);
  for (int r = 0; r < cluster.workers; ++r) map.add_active_workers(true);
  if (options_.resume_step >= 0) {
    for (ShardAssignment& assignment : *map.mutable_shards()) {
      assignment.set_restore(SHARD_RESTORE_AT_STEP);
      assignment.set_restore_step(options_.resume_step);
    }
  }
  if (options_.model_declared_by_workers) {
    *map.mutable_model() = declared_model_;
    if (!options_.model_init_from) map.set_initial_values_from(model_declared_by_);
  }
  SealMap(&map);
  shard_map_ = map;
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
  if (layout.dense_parameters() < options_.cluster.shards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cluster.shards (", options_.cluster.shards, ") exceeds the model's ",
        layout.dense_parameters(), " dense parameters: give fewer shards or more tensors"));
  }
  absl::MutexLock lock(&mu_);
  Node* node = FindNode(name);
  if (node == nullptr || node->role != NODE_ROLE_WORKER || !node->alive) {
    return absl::NotFoundError(absl::StrCat(name, " is not a live worker of this job"));
  }
  DeclareModelResponse response;
  if (model_declared_by_.empty()) {
    declared_model_ = model;
    model_declared_by_ = name;
    layout_ = std::move(layout);
    ++state_version_;
    MaybePlaceShards(now);
  } else {
    PS_RETURN_IF_ERROR(CheckSameModel(declared_model_, model, model_declared_by_));
  }
  // The declarer's values are the initial ones; its retried call (or its replacement's,
  // in the same slot) is told so again.
  response.set_sets_initial_values(model_declared_by_ == name && !options_.model_init_from);
  return response;
}

void ClusterRegistry::SealMap(ShardMap* map) const {
  map->clear_credentials();
  for (const Node& node : nodes_) {
    if (!node.alive) continue;  // a dead node's credential dies with it
    NodeCredential* credential = map->add_credentials();
    credential->set_node_name(node.name);
    credential->set_role(node.role);
    credential->set_rank(node.rank);
    credential->set_token_sha256(node.token_sha256);
  }
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
  for (const Node& node : nodes_) {
    // A dead node's credential still says who it is (its heartbeat is answered "register
    // again"); a new registration into its slot replaces it.
    if (node.name == name) return KnownNode{node.role, node.rank, node.token_sha256};
  }
  return std::nullopt;
}

ClusterRegistry::Node* ClusterRegistry::FindNode(const std::string& name) {
  for (Node& node : nodes_) {
    if (node.name == name) return &node;
  }
  return nullptr;
}

const ClusterRegistry::Node* ClusterRegistry::FindServer(const std::string& name) const {
  for (const Node& node : nodes_) {
    if (node.name == name && node.role == NODE_ROLE_SERVER) return &node;
  }
  return nullptr;
}

int ClusterRegistry::CountRole(NodeRole role) const {
  return static_cast<int>(std::count_if(nodes_.begin(), nodes_.end(),
                                        [role](const Node& n) { return n.role == role; }));
}

int ClusterRegistry::FinishedWorkers() const {
  return static_cast<int>(std::count_if(nodes_.begin(), nodes_.end(),
                                        [](const Node& n) { return n.alive && n.finished; }));
}

int ClusterRegistry::LiveWorkers() const {
  return static_cast<int>(std::count_if(nodes_.begin(), nodes_.end(), [](const Node& n) {
    return n.alive && n.role == NODE_ROLE_WORKER;
  }));
}

ShardMap ClusterRegistry::NextMap() const {
  ShardMap map = *shard_map_;
  map.set_epoch(map.epoch() + 1);
  for (ShardAssignment& assignment : *map.mutable_shards()) {
    assignment.set_restore(SHARD_RESTORE_NONE);
    assignment.set_restore_step(0);
  }
  map.clear_active_workers();
  std::vector<bool> active(options_.cluster.workers, false);
  for (const Node& node : nodes_) {
    if (node.role == NODE_ROLE_WORKER && node.alive) active[node.rank] = true;
  }
  for (bool a : active) map.add_active_workers(a);
  return map;
}

MapChange ClusterRegistry::Publish(PlannedMapChange planned) {
  ShardMap& map = planned.map;
  const std::vector<std::string>& losing_servers = planned.losing_servers;
  ++state_version_;
  for (ShardAssignment& assignment : *map.mutable_shards()) {
    if (const Node* server = FindServer(assignment.server_name()); server != nullptr) {
      assignment.set_server_address(server->address);
    }
    for (ShardReplica& backup : *assignment.mutable_backups()) {
      if (const Node* server = FindServer(backup.server_name()); server != nullptr) {
        backup.set_server_address(server->address);
      }
    }
  }
  SealMap(&map);
  shard_map_ = map;
  MapChange change;
  change.map = std::move(map);
  change.summary = std::move(planned.summary);
  for (const Node& node : nodes_) {
    if (node.role != NODE_ROLE_SERVER || !node.alive) continue;
    const bool first =
        std::find(losing_servers.begin(), losing_servers.end(), node.name) != losing_servers.end();
    (first ? change.servers_first : change.servers_then).push_back(node.name);
    (first ? change.addresses_first : change.addresses_then).push_back(node.address);
  }
  return change;
}

absl::StatusOr<RegisterResponse> ClusterRegistry::Register(NodeRole role,
                                                           const std::string& address,
                                                           const std::string& node_token,
                                                           absl::Time now,
                                                           std::optional<MapChange>* change) {
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
  const std::string token_sha256 = Sha256(node_token);
  absl::MutexLock lock(&mu_);
  const bool server = role == NODE_ROLE_SERVER;
  const ClusterSection& cluster = options_.cluster;
  for (Node& node : nodes_) {
    if (node.role == role && node.address == address && node.alive) {
      // The same process again (its reply was lost, perhaps by the scheduler this one
      // took over from): the same answer. Another process at a live node's address
      // must wait until that node is declared dead.
      if (ConstantTimeEquals(node.token_sha256, token_sha256)) return RegistrationOf(node);
      return absl::UnavailableError(absl::StrCat(
          node.name, " at ", address,
          " is alive; another process there takes its place once it is declared dead (",
          cluster.failure_timeout_ms, " ms without a heartbeat)"));
    }
  }
  const int expected = server ? cluster.servers : cluster.workers;
  const int rank = CountRole(role);
  if (rank < expected) {
    Node node;
    node.name = absl::StrCat(server ? "ps-" : "worker-", rank);
    node.role = role;
    node.rank = rank;
    node.address = address;
    node.last_heartbeat = now;
    node.token_sha256 = token_sha256;
    nodes_.push_back(node);
    ++state_version_;
    MaybePlaceShards(now);
    return RegistrationOf(node);
  }
  // The cluster is complete: take the slot of a dead (or drained) node of this role,
  // if any. Nobody else is admitted: the cluster has the size its spec gives.
  Node* slot = nullptr;
  for (Node& node : nodes_) {
    if (node.role == role && !node.alive && (slot == nullptr || node.address == address))
      slot = &node;
  }
  if (slot == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the cluster already has its ", expected, server ? " servers" : " workers",
                     ", all alive; ", address, " was not admitted"));
  }
  slot->token_sha256 = token_sha256;
  slot->alive = true;
  slot->drained = false;
  ++state_version_;
  slot->address = address;
  slot->last_heartbeat = now;
  slot->finished = false;
  slot->shard_map_conflicts = 0;  // a new process counts its own
  slot->told_to_stop = false;
  if (shard_map_.has_value()) {
    if (server) {
      *change = Rebalance(*slot);
    } else {
      *change = Publish(
          {NextMap(), {}, absl::StrCat(slot->name, " rejoined at ", address, "; it trains again")});
    }
  }
  return RegistrationOf(*slot);
}

MapChange ClusterRegistry::Rebalance(const Node& joined) {
  return Publish(
      PlanServerJoin(NextMap(), {joined.name, joined.address}, LiveServers(""), replication_));
}

std::vector<ServerEndpoint> ClusterRegistry::LiveServers(const std::string& except) const {
  std::vector<ServerEndpoint> live;
  for (const Node& node : nodes_) {
    if (node.role == NODE_ROLE_SERVER && node.alive && node.name != except)
      live.push_back({node.name, node.address});
  }
  return live;
}

RecoveryContext ClusterRegistry::RecoveryContextLocked(int64_t rollback_step) const {
  RecoveryContext context;
  context.mode = options_.mode;
  context.replication = replication_;
  context.checkpoints = options_.checkpoints;
  context.rollback_step = rollback_step;
  context.shards = &shard_records_;
  return context;
}

absl::StatusOr<MapChange> ClusterRegistry::RecoverFromServerLoss(const Node& dead,
                                                                 int64_t rollback) {
  PS_ASSIGN_OR_RETURN(PlannedMapChange planned,
                      PlanServerLoss(NextMap(), dead.name, LiveServers(dead.name),
                                     RecoveryContextLocked(rollback)));
  return Publish(std::move(planned));
}

absl::StatusOr<MapChange> ClusterRegistry::Drain(const std::string& name) {
  absl::MutexLock lock(&mu_);
  Node* node = FindNode(name);
  if (node == nullptr || node->role != NODE_ROLE_SERVER || !node->alive) {
    return absl::NotFoundError(absl::StrCat(name, " is not a live server"));
  }
  if (!shard_map_.has_value())
    return absl::FailedPreconditionError("the cluster has not formed yet");
  PS_ASSIGN_OR_RETURN(
      PlannedMapChange planned,
      PlanDrain(NextMap(), name, LiveServers(name), RecoveryContextLocked(/*rollback_step=*/-1)));
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
    const Node* node = FindNode(name);
    if (node == nullptr || !node->alive)
      return absl::NotFoundError(absl::StrCat(name, " is not a live node"));
    role = node->role;
  }
  return role == NODE_ROLE_SERVER ? Drain(name) : DeclareDead(name);
}

absl::StatusOr<MapChange> ClusterRegistry::DeclareDead(const std::string& name) {
  // Plan: the sync rollback target is read from the checkpoint files, which is disk I/O:
  // never under the lock, where every heartbeat would wait behind it. It is read for a
  // server only, before the lock. A checkpoint completed meanwhile only makes this
  // target one checkpoint older than the newest; servers keep checkpoint.keep files per
  // shard, so it is still on disk (were it not, the restore names the missing file).
  bool server = false;
  {
    absl::MutexLock lock(&mu_);
    const Node* node = FindNode(name);
    server = node != nullptr && node->role == NODE_ROLE_SERVER;
  }
  const bool needs_rollback_target =
      server && options_.checkpoints && options_.mode == TrainingMode::kSync;
  ModelLayout layout;
  {
    absl::MutexLock lock(&mu_);
    layout = layout_;
  }
  const int64_t rollback = needs_rollback_target && options_.newest_complete_checkpoint
                               ? options_.newest_complete_checkpoint(layout)
                               : -1;
  // Act, under the lock.
  absl::MutexLock lock(&mu_);
  Node* node = FindNode(name);
  if (node == nullptr || !node->alive)
    return absl::NotFoundError(absl::StrCat(name, " is not a live node"));
  node->alive = false;
  ++state_version_;
  if (!shard_map_.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, " died before the cluster formed; waiting for a replacement"));
  }
  if (node->role == NODE_ROLE_SERVER) return RecoverFromServerLoss(*node, rollback);
  return Publish(
      {NextMap(),
       {},
       absl::StrCat(name,
                    " lost; sync steps complete without it and its share of the data is skipped "
                    "until a worker rejoins in its place")});
}

void ClusterRegistry::NoteAlive(const std::string& name, absl::Time now) {
  absl::MutexLock lock(&mu_);
  Node* node = FindNode(name);
  if (node != nullptr && node->alive) node->last_heartbeat = std::max(node->last_heartbeat, now);
}

ClusterView ClusterRegistry::View() const {
  absl::MutexLock lock(&mu_);
  ClusterView view;
  view.set_ready(shard_map_.has_value());
  view.set_expected_servers(options_.cluster.servers);
  view.set_registered_servers(CountRole(NODE_ROLE_SERVER));
  view.set_expected_workers(options_.cluster.workers);
  view.set_registered_workers(CountRole(NODE_ROLE_WORKER));
  if (shard_map_.has_value()) *view.mutable_shard_map() = *shard_map_;
  view.set_workers_finished(FinishedWorkers());
  view.set_live_workers(LiveWorkers());
  view.set_job_finished(result_.has_value());
  view.set_finisher_rank(FinisherRank());
  return view;
}

int ClusterRegistry::FinisherRank() const {
  int lowest = -1;
  for (const Node& node : nodes_) {
    if (node.role == NODE_ROLE_WORKER && node.alive && (lowest < 0 || node.rank < lowest))
      lowest = node.rank;
  }
  return lowest;
}

namespace {

// Shard `id`'s assignment in `map`, or null. Placement numbers shards 0..n-1 in order
// and every later map keeps that order: a heartbeat's look-up is O(1), not a scan.
const ShardAssignment* FindAssignment(const ShardMap& map, int id) {
  if (id >= 0 && id < map.shards_size() && map.shards(id).shard_id() == id) return &map.shards(id);
  for (const ShardAssignment& assignment : map.shards()) {
    if (assignment.shard_id() == id) return &assignment;
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<HeartbeatResponse> ClusterRegistry::Heartbeat(const HeartbeatRequest& request,
                                                             absl::Time now) {
  // The figures the ETA is computed from: a peer's numbers, checked before they are used.
  const NodeProgress& progress = request.progress();
  if (progress.total_steps() < 0 || progress.total_steps() > (int64_t{1} << 53) ||
      !std::isfinite(progress.steps_per_sec()) || progress.steps_per_sec() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("heartbeat from '", request.node_name(), "': progress total_steps ",
                     progress.total_steps(), " and steps_per_sec ", progress.steps_per_sec(),
                     " must be in [0, 2^53] and finite and >= 0"));
  }
  for (const ShardStatus& shard : request.shards()) {
    const EmbeddingShardStats& rows = shard.embedding();
    if (rows.rows() < 0 || !(std::isfinite(rows.bytes()) && rows.bytes() >= 0) ||
        rows.minimum_bytes() < 0 || rows.evicted_rows() < 0 || rows.dropped_gradients() < 0 ||
        rows.pending_ids() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("heartbeat from '", request.node_name(), "': shard ", shard.shard_id(),
                       "'s embedding figures must be finite and >= 0"));
    }
  }
  if (request.refused_gradients() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("heartbeat from '", request.node_name(),
                                                   "': refused_gradients ",
                                                   request.refused_gradients(), " must be >= 0"));
  }
  if (!(progress.test_auc() >= 0 && progress.test_auc() <= 1) ||
      !(std::isfinite(progress.test_logloss()) && progress.test_logloss() >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heartbeat from '", request.node_name(), "': progress test_auc ", progress.test_auc(),
        " and test_logloss ", progress.test_logloss(), " must be in [0, 1] and finite and >= 0"));
  }
  absl::MutexLock lock(&mu_);
  Node* node = FindNode(request.node_name());
  if (node == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("heartbeat from unknown node '", request.node_name(), "'"));
  }
  if (node->drained) {
    // Told to exit only once it serves the map that drained it: before, it may not have
    // written the handoff checkpoints of the shards that move without a backup.
    HeartbeatResponse drained;
    drained.set_epoch(shard_map_.has_value() ? shard_map_->epoch() : 0);
    drained.set_shutdown(request.serving_epoch() >= node->drained_at_epoch);
    drained.set_scheduler_token_sha256(Sha256(scheduler_token_));
    drained.set_scheduler_map_key(map_signing_key_->public_key());
    return drained;
  }
  if (!node->alive) {
    return absl::FailedPreconditionError(absl::StrCat(
        request.node_name(), " was declared dead and replaced; register again to rejoin"));
  }
  node->last_heartbeat = now;
  if (request.shard_map_conflicts() > node->shard_map_conflicts) {
    // Two maps of one epoch, both signed by this scheduler process or its predecessor: a
    // bug worth an operator's attention (the server kept the first).
    spdlog::error("{} refused {} conflicting shard map(s); the last: {}", node->name,
                  request.shard_map_conflicts() - node->shard_map_conflicts,
                  request.last_shard_map_conflict().substr(0, kMaxTroubleText));
    node->shard_map_conflicts = request.shard_map_conflicts();
  }
  if (node->role == NODE_ROLE_WORKER && request.progress().step() > node->progress.step()) {
    last_advance_ = now;
    std::vector<ProgressPoint>& points = history_[node->name];
    ProgressPoint& point = points.emplace_back();
    point.set_step(request.progress().step());
    point.set_loss(request.progress().loss());
    // The model's test score: a ctr model's is its AUC.
    point.set_test_accuracy(options_.ctr ? request.progress().test_auc()
                                         : request.progress().test_accuracy());
    point.set_samples_per_sec(request.progress().samples_per_sec());
    point.set_accuracy_step(request.progress().accuracy_step());
    if (points.size() > kMaxHistoryPoints) {
      // Keep every other point: the curve keeps its shape over the whole run.
      std::vector<ProgressPoint> thinned;
      for (size_t i = 0; i < points.size(); i += 2) thinned.push_back(points[i]);
      points = std::move(thinned);
    }
  }
  node->progress = request.progress();
  if (node->role == NODE_ROLE_SERVER) {
    node->refused_gradients = request.refused_gradients();
    node->checkpoint_trouble = request.checkpoint_trouble();
    // A peer's text: bounded before it is kept and shown.
    if (node->checkpoint_trouble.error().size() > kMaxTroubleText) {
      node->checkpoint_trouble.mutable_error()->resize(kMaxTroubleText);
    }
  }
  if (node->role == NODE_ROLE_SERVER && shard_map_.has_value() &&
      request.serving_epoch() == shard_map_->epoch()) {
    for (const ShardStatus& status : request.shards()) {
      if (status.backup()) continue;  // the primary reports the shard
      // Only shards the map gives this server as primary: a report of any other id
      // is not recorded (nor allocated for).
      const ShardAssignment* assignment = FindAssignment(*shard_map_, status.shard_id());
      if (assignment == nullptr || assignment->server_name() != node->name) continue;
      ShardRecord& record = shard_records_[status.shard_id()];
      record.applied_updates = status.applied_updates();
      record.checkpoint_step = status.checkpoint_step();
      record.embedding = status.embedding();
      if (!first_report_.has_value()) first_report_ = std::make_pair(now, status.applied_updates());
    }
  }
  if (result_.has_value() || shutdown_requested_) node->told_to_stop = true;
  HeartbeatResponse response;
  response.set_epoch(shard_map_.has_value() ? shard_map_->epoch() : 0);
  response.set_job_finished(result_.has_value() || shutdown_requested_);
  response.set_shutdown(shutdown_requested_);
  response.set_scheduler_token_sha256(Sha256(scheduler_token_));
  response.set_scheduler_map_key(map_signing_key_->public_key());
  int64_t retain_from = -1;
  if (shard_map_.has_value() &&
      static_cast<int>(shard_records_.size()) == shard_map_->shards_size()) {
    for (const auto& [id, record] : shard_records_) {
      if (record.checkpoint_step < 0) {
        retain_from = -1;
        break;
      }
      retain_from =
          retain_from < 0 ? record.checkpoint_step : std::min(retain_from, record.checkpoint_step);
    }
  }
  response.set_checkpoint_retain_from(retain_from);
  return response;
}

absl::StatusOr<ReportFinishedResponse> ClusterRegistry::ReportFinished(
    const ReportFinishedRequest& request, absl::Time now) {
  absl::MutexLock lock(&mu_);
  Node* node = FindNode(request.node_name());
  if (node == nullptr || node->role != NODE_ROLE_WORKER || !node->alive) {
    return absl::NotFoundError(
        absl::StrCat("report from unknown or dead worker '", request.node_name(), "'"));
  }
  node->finished = true;
  node->last_heartbeat = now;
  node->summary = request;
  ++state_version_;
  ReportFinishedResponse response;
  response.set_workers_finished(FinishedWorkers());
  response.set_workers_total(LiveWorkers());
  return response;
}

absl::StatusOr<JobResult> ClusterRegistry::ReportResult(const ReportResultRequest& request) {
  absl::MutexLock lock(&mu_);
  if (result_.has_value()) return *result_;  // a retried report: the first one stands
  Node* node = FindNode(request.node_name());
  if (node == nullptr || node->role != NODE_ROLE_WORKER || !node->alive ||
      node->rank != FinisherRank()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the final result must come from the lowest-ranked live worker (rank ",
                     FinisherRank(), "), not '", request.node_name(), "'"));
  }
  if (FinishedWorkers() < LiveWorkers()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "only ", FinishedWorkers(), " of ", LiveWorkers(), " live workers have finished"));
  }
  const bool scores_ok =
      request.no_test_accuracy() ? request.test_accuracy() == 0 && !request.ctr()
      : request.ctr()            ? request.test_auc() >= 0 && request.test_auc() <= 1 &&
                            std::isfinite(request.test_logloss()) && request.test_logloss() >= 0
                      : request.test_accuracy() >= 0 && request.test_accuracy() <= 1;
  if (!scores_ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("a result of test_accuracy ", request.test_accuracy(), ", test_auc ",
                     request.test_auc(), " and test_logloss ", request.test_logloss(),
                     ": an accuracy and an AUC lie in [0, 1], a log loss is finite and >= 0"));
  }
  result_reporter_ = node->name;
  JobResult result;
  result.test_accuracy = request.test_accuracy();
  result.ctr = request.ctr();
  result.test_auc = request.test_auc();
  result.test_logloss = request.test_logloss();
  result.without_score = request.no_test_accuracy();
  int64_t samples = 0;
  double seconds = 0;
  for (const Node& n : nodes_) {
    if (n.role != NODE_ROLE_WORKER) continue;
    samples += n.summary.samples();
    seconds = std::max(seconds, n.summary.seconds());
    result.steps = std::max(result.steps, n.summary.steps());
  }
  result.samples_per_sec = seconds > 0 ? samples / seconds : 0;
  result_ = result;
  finished_ = absl::Now();
  ++state_version_;
  return result;
}

std::vector<SilentNode> ClusterRegistry::SilentNodes(absl::Time now, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  std::vector<SilentNode> silent;
  for (const Node& node : nodes_) {
    if (!node.alive || node.finished ||
        ((result_.has_value() || shutdown_requested_) && node.told_to_stop))
      continue;
    if (now - node.last_heartbeat > timeout)
      silent.push_back({node.name, now - node.last_heartbeat});
  }
  return silent;
}

absl::StatusOr<std::pair<int64_t, std::vector<std::string>>> ClusterRegistry::PlanCheckpoint(
    absl::Time now, absl::Duration lead) const {
  absl::MutexLock lock(&mu_);
  if (!options_.checkpoints) return absl::FailedPreconditionError("checkpoint.dir is not set");
  if (!shard_map_.has_value())
    return absl::FailedPreconditionError("the cluster has not formed yet");
  int64_t newest = 0;
  for (const auto& [id, record] : shard_records_) newest = std::max(newest, record.applied_updates);
  double rate = 0;  // updates per second
  if (first_report_.has_value() && now - first_report_->first > absl::Milliseconds(100)) {
    rate = (newest - first_report_->second) / absl::ToDoubleSeconds(now - first_report_->first);
  }
  const int64_t step = newest + static_cast<int64_t>(rate * absl::ToDoubleSeconds(lead)) + 10;
  std::vector<std::string> servers;
  for (const Node& node : nodes_) {
    if (node.role == NODE_ROLE_SERVER && node.alive) servers.push_back(node.address);
  }
  return std::make_pair(step, servers);
}

SchedulerState ClusterRegistry::ExportState() const {
  absl::MutexLock lock(&mu_);
  SchedulerState state;
  for (const Node& node : nodes_) {
    SchedulerNodeState* saved = state.add_nodes();
    saved->set_name(node.name);
    saved->set_role(node.role);
    saved->set_rank(node.rank);
    saved->set_address(node.address);
    saved->set_alive(node.alive);
    saved->set_finished(node.finished);
    saved->set_drained(node.drained);
    saved->set_token_sha256(node.token_sha256);
    *saved->mutable_summary() = node.summary;
  }
  if (shard_map_.has_value()) *state.mutable_shard_map() = *shard_map_;
  if (!model_declared_by_.empty()) {
    *state.mutable_declared_model() = declared_model_;
    state.set_model_declared_by(model_declared_by_);
  }
  if (result_.has_value()) {
    state.set_has_result(true);
    state.set_test_accuracy(result_->test_accuracy);
    state.set_result_ctr(result_->ctr);
    state.set_test_auc(result_->test_auc);
    state.set_test_logloss(result_->test_logloss);
    state.set_result_without_score(result_->without_score);
    state.set_samples_per_sec(result_->samples_per_sec);
    state.set_steps(result_->steps);
  }
  return state;
}

int64_t ClusterRegistry::state_version() const {
  absl::MutexLock lock(&mu_);
  return state_version_;
}

absl::Status ClusterRegistry::CheckSavedState(const SchedulerState& state) const {
  // The file is the scheduler's own (0600), but a disk error, a hand edit or another
  // job's file must not index out of range: every number is checked before use.
  const ClusterSection& cluster = options_.cluster;
  std::set<std::string> names;
  std::set<std::pair<int, int>> ranks;
  for (const SchedulerNodeState& saved : state.nodes()) {
    const bool server = saved.role() == NODE_ROLE_SERVER;
    if (!server && saved.role() != NODE_ROLE_WORKER) {
      return absl::DataLossError(
          absl::StrCat("node '", saved.name(), "' has no server or worker role"));
    }
    const int expected = server ? cluster.servers : cluster.workers;
    if (saved.rank() < 0 || saved.rank() >= expected) {
      return absl::DataLossError(absl::StrCat("node '", saved.name(), "' has rank ", saved.rank(),
                                              "; this spec has ", expected,
                                              server ? " servers" : " workers"));
    }
    if (saved.name().empty() || !names.insert(saved.name()).second) {
      return absl::DataLossError(
          absl::StrCat("the node name '", saved.name(), "' is empty or repeats"));
    }
    if (!ranks.insert({saved.role(), saved.rank()}).second) {
      return absl::DataLossError(
          absl::StrCat("two ", server ? "servers" : "workers", " have rank ", saved.rank()));
    }
  }
  ModelLayout layout = options_.layout;
  if (!state.model_declared_by().empty()) {
    absl::StatusOr<ModelLayout> declared = LayoutOfDeclaration(state.declared_model());
    if (!options_.model_declared_by_workers || !declared.ok()) {
      return absl::DataLossError(absl::StrCat("the saved state holds a declared model, which ",
                                              options_.model_declared_by_workers
                                                  ? declared.status().message()
                                                  : "this spec's model type does not take"));
    }
    layout = *std::move(declared);
  } else if (options_.model_declared_by_workers && state.has_shard_map()) {
    return absl::DataLossError("the saved shard map has no declared model (model.type torch)");
  }
  if (state.has_shard_map()) {
    for (const ShardAssignment& assignment : state.shard_map().shards()) {
      const bool rows = assignment.kind() == SHARD_KIND_EMBEDDING_ROWS;
      if (rows && (layout.embedding_tables().empty() ||
                   assignment.embedding_buckets() != options_.cluster.embedding_shards ||
                   assignment.embedding_bucket() < 0 ||
                   assignment.embedding_bucket() >= assignment.embedding_buckets())) {
        return absl::DataLossError(absl::StrCat(
            "shard ", assignment.shard_id(), " holds embedding bucket ",
            assignment.embedding_bucket(), " of ", assignment.embedding_buckets(),
            "; this model has ", layout.embedding_tables().size(),
            " tables in cluster.embedding_shards = ", options_.cluster.embedding_shards));
      }
      if (!rows && assignment.kind() != SHARD_KIND_DENSE_RANGE) {
        return absl::DataLossError(absl::StrCat("shard ", assignment.shard_id(), " is of kind ",
                                                ShardKind_Name(assignment.kind()),
                                                ", which this scheduler does not place"));
      }
      if (!rows && (assignment.begin() < 0 || assignment.end() <= assignment.begin() ||
                    assignment.end() > layout.dense_parameters())) {
        return absl::DataLossError(absl::StrCat("shard ", assignment.shard_id(), " covers [",
                                                assignment.begin(), ", ", assignment.end(),
                                                "), outside this model's ",
                                                layout.dense_parameters(), " parameters"));
      }
      if (names.count(assignment.server_name()) == 0) {
        return absl::DataLossError(absl::StrCat("shard ", assignment.shard_id(), " is held by '",
                                                assignment.server_name(),
                                                "', which is not among the saved nodes"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ClusterRegistry::ImportState(const SchedulerState& state, absl::Time now) {
  absl::MutexLock lock(&mu_);
  PS_RETURN_IF_ERROR(CheckSavedState(state));
  nodes_.clear();
  for (const SchedulerNodeState& saved : state.nodes()) {
    Node node;
    node.name = saved.name();
    node.role = saved.role();
    node.rank = saved.rank();
    node.address = saved.address();
    node.alive = saved.alive();
    node.finished = saved.finished();
    node.drained = saved.drained();
    node.summary = saved.summary();
    node.token_sha256 = saved.token_sha256();
    node.last_heartbeat = now;
    nodes_.push_back(node);
  }
  if (state.has_shard_map()) {
    // Signed anew with this process's key: the servers learn it from their next
    // heartbeat reply, and the content (hence the digest they hold) is unchanged.
    shard_map_ = state.shard_map();
    map_signing_key_->Sign(&*shard_map_);
  }
  if (!state.model_declared_by().empty()) {
    declared_model_ = state.declared_model();
    model_declared_by_ = state.model_declared_by();
    layout_ = *LayoutOfDeclaration(declared_model_);  // CheckSavedState checked it
  }
  last_advance_ = now;
  if (state.has_result())
    result_ = JobResult{state.test_accuracy(),       state.samples_per_sec(), state.steps(),
                        state.result_ctr(),          state.test_auc(),        state.test_logloss(),
                        state.result_without_score()};
  return absl::OkStatus();
}

bool ClusterRegistry::job_finished() const {
  absl::MutexLock lock(&mu_);
  return result_.has_value() || shutdown_requested_;
}

void ClusterRegistry::RequestShutdown() {
  absl::MutexLock lock(&mu_);
  if (!shutdown_requested_) ++state_version_;
  shutdown_requested_ = true;
}

ClusterRegistry::Snapshot ClusterRegistry::TakeSnapshot(bool with_history) const {
  absl::MutexLock lock(&mu_);
  Snapshot snapshot;
  snapshot.cluster = options_.cluster;
  snapshot.mode = options_.mode;
  snapshot.replication = replication_;
  snapshot.nodes = nodes_;
  for (Node& node : snapshot.nodes) node.token_sha256.clear();
  snapshot.shard_map = shard_map_;
  snapshot.shard_records = shard_records_;
  if (with_history) snapshot.history = history_;
  snapshot.result = result_;
  snapshot.ctr = options_.ctr;
  snapshot.shutdown_requested = shutdown_requested_;
  snapshot.last_advance = last_advance_;
  snapshot.started = started_;
  snapshot.finished = finished_;
  return snapshot;
}

bool ClusterRegistry::all_servers_told_to_stop() const {
  absl::MutexLock lock(&mu_);
  // After a shutdown the workers must hear it too: they would otherwise train on. After
  // the result, so must the finished workers other than the one that reported it: they
  // wait for it, in case they must evaluate in a lost rank 0's place.
  return std::all_of(
      nodes_.begin(), nodes_.end(), [this](const Node& n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        const bool waits_for_result = result_.has_value() && n.role == NODE_ROLE_WORKER &&
                                      n.finished && n.name != result_reporter_;
        const bool must_hear =
            n.role == NODE_ROLE_SERVER || (shutdown_requested_ && !n.finished) || waits_for_result;
        return !must_hear || !n.alive || n.told_to_stop;
      });
}

}  // namespace paramserver
