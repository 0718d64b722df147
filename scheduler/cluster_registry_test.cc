#include "scheduler/cluster_registry.h"

#include <functional>
#include <future>
#include <limits>
#include <map>

#include "catch2/catch.hpp"
#include "common/secrets.h"
#include "scheduler/cluster_status.h"

namespace paramserver {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000);

RegistryOptions Options(TrainingMode mode = TrainingMode::kSync, int servers = 2, int workers = 2,
                        int shards = 4) {
  RegistryOptions options;
  options.cluster.scheduler_address = "127.0.0.1:0";
  options.cluster.servers = servers;
  options.cluster.workers = workers;
  options.cluster.shards = shards;
  options.mode = mode;
  options.layout = *ModelLayout::Create({{"weights", {100}}});
  options.checkpoints = true;
  options.newest_complete_checkpoint = [](const ModelLayout&) { return int64_t{100}; };
  return options;
}

// The credential the node at `address` made for itself (one process per address).
std::string TokenOf(const std::string& address) {
  return "node-token-of-" + address + std::string(32, 'x');
}

absl::StatusOr<RegisterResponse> Join(ClusterRegistry& registry, NodeRole role,
                                      const std::string& address,
                                      std::optional<MapChange>* change = nullptr) {
  std::optional<MapChange> ignored;
  // A retry from the same process sends the same token.
  return registry.Register(role, address, TokenOf(address), kStart,
                           change != nullptr ? change : &ignored);
}

void FormCluster(ClusterRegistry& registry, int servers, int workers) {
  for (int i = 0; i < servers; ++i)
    REQUIRE(Join(registry, NODE_ROLE_SERVER, "s:" + std::to_string(i)).ok());
  for (int i = 0; i < workers; ++i)
    REQUIRE(Join(registry, NODE_ROLE_WORKER, "w:" + std::to_string(i)).ok());
}

// What each server reports about its shards: applied updates and newest checkpoint.
void ReportShards(ClusterRegistry& registry,
                  const std::map<int, std::pair<int64_t, int64_t>>& shards) {
  const ShardMap map = registry.View().shard_map();
  std::map<std::string, HeartbeatRequest> beats;
  for (const ShardAssignment& assignment : map.shards()) {
    auto it = shards.find(assignment.shard_id());
    if (it == shards.end()) continue;
    HeartbeatRequest& beat = beats[assignment.server_name()];
    beat.set_node_name(assignment.server_name());
    beat.set_serving_epoch(map.epoch());
    ShardStatus* status = beat.add_shards();
    status->set_shard_id(assignment.shard_id());
    status->set_applied_updates(it->second.first);
    status->set_checkpoint_step(it->second.second);
  }
  for (const auto& [name, beat] : beats) REQUIRE(registry.Heartbeat(beat, kStart).ok());
}

std::map<std::string, int> ShardsPerServer(const ShardMap& map) {
  std::map<std::string, int> count;
  for (const ShardAssignment& assignment : map.shards()) ++count[assignment.server_name()];
  return count;
}

TEST_CASE("nodes get names and ranks; the shard map appears when the last one registers") {
  ClusterRegistry registry(Options());
  absl::StatusOr<RegisterResponse> ps0 = Join(registry, NODE_ROLE_SERVER, "h:1");
  REQUIRE(ps0.ok());
  CHECK(ps0->node_name() == "ps-0");
  CHECK(Join(registry, NODE_ROLE_WORKER, "h:3")->node_name() == "worker-0");
  CHECK(Join(registry, NODE_ROLE_SERVER, "h:2")->node_name() == "ps-1");
  CHECK_FALSE(registry.View().ready());
  absl::StatusOr<RegisterResponse> w1 = Join(registry, NODE_ROLE_WORKER, "h:4");
  REQUIRE(w1.ok());
  CHECK(w1->rank() == 1);
  ClusterView view = registry.View();
  REQUIRE(view.ready());
  CHECK(view.shard_map().epoch() == 1);
  CHECK(view.shard_map().shards_size() == 4);
  CHECK(view.shard_map().shards(1).server_address() == "h:2");
  CHECK(view.shard_map().active_workers_size() == 2);
  CHECK(view.live_workers() == 2);
}

ModelDeclaration Declared(int64_t hidden) {
  ModelDeclaration model;
  TensorDeclaration* weight = model.add_tensors();
  weight->set_name("fc.weight");
  weight->add_shape(hidden);
  weight->add_shape(8);
  TensorDeclaration* bias = model.add_tensors();
  bias->set_name("fc.bias");
  bias->add_shape(hidden);
  return model;
}

TEST_CASE(
    "torch: the first worker's declaration places the shards; a later one must match, named") {
  RegistryOptions options = Options(TrainingMode::kSync, 2, 2, 3);
  options.layout = ModelLayout();
  options.model_declared_by_workers = true;
  ClusterRegistry registry(options);
  FormCluster(registry, 2, 2);
  CHECK_FALSE(registry.View().ready());  // every node is in, the model is not
  CHECK(registry.DeclareModel("worker-9", Declared(4), kStart).status().code() ==
        absl::StatusCode::kNotFound);
  CHECK(registry.DeclareModel("ps-0", Declared(4), kStart).status().code() ==
        absl::StatusCode::kNotFound);
  ModelDeclaration malformed = Declared(4);
  malformed.mutable_tensors(0)->set_shape(0, 0);
  CHECK(registry.DeclareModel("worker-1", malformed, kStart).status().code() ==
        absl::StatusCode::kInvalidArgument);
  ModelDeclaration tiny;
  tiny.add_tensors()->set_name("w");
  tiny.mutable_tensors(0)->add_shape(2);
  CHECK(registry.DeclareModel("worker-1", tiny, kStart).status().message() ==
        "cluster.shards (3) exceeds the model's 2 dense parameters: give fewer shards or more "
        "tensors");

  absl::StatusOr<DeclareModelResponse> first =
      registry.DeclareModel("worker-1", Declared(4), kStart);
  REQUIRE(first.ok());
  CHECK(first->sets_initial_values());
  const ClusterView view = registry.View();
  REQUIRE(view.ready());
  CHECK(view.shard_map().shards_size() == 3);
  CHECK(view.shard_map().shards(2).end() == 36);
  CHECK(view.shard_map().model().tensors_size() == 2);
  CHECK(view.shard_map().initial_values_from() == "worker-1");

  absl::StatusOr<DeclareModelResponse> same =
      registry.DeclareModel("worker-0", Declared(4), kStart);
  REQUIRE(same.ok());
  CHECK_FALSE(same->sets_initial_values());
  CHECK(registry.DeclareModel("worker-1", Declared(4), kStart)->sets_initial_values());  // a retry
  absl::StatusOr<DeclareModelResponse> other =
      registry.DeclareModel("worker-0", Declared(5), kStart);
  CHECK(other.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(other.status().message() ==
        "tensor 'fc.weight' has shape [5, 8] here but [4, 8] in the job's model (declared by "
        "worker-1)");

  // The declaration survives a takeover from the saved state.
  ClusterRegistry taken_over(options);
  REQUIRE(taken_over.ImportState(registry.ExportState(), kStart).ok());
  CHECK(taken_over.DeclareModel("worker-0", Declared(5), kStart).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(taken_over.View().shard_map().model().tensors_size() == 2);
}

TEST_CASE("a model the spec gives is not declared by workers") {
  ClusterRegistry registry(Options());
  FormCluster(registry, 2, 2);
  CHECK(registry.DeclareModel("worker-0", Declared(4), kStart).status().code() ==
        absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("a retried registration gets the same name; extra or malformed ones are refused") {
  ClusterRegistry registry(Options());
  REQUIRE(Join(registry, NODE_ROLE_SERVER, "h:1").ok());
  CHECK(Join(registry, NODE_ROLE_SERVER, "h:1")->node_name() == "ps-0");
  REQUIRE(Join(registry, NODE_ROLE_SERVER, "h:2").ok());
  CHECK(Join(registry, NODE_ROLE_SERVER, "h:9").status().code() ==
        absl::StatusCode::kResourceExhausted);
  CHECK(Join(registry, NODE_ROLE_UNSPECIFIED, "h:9").status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(Join(registry, NODE_ROLE_WORKER, "nohostport").status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("silent live nodes are listed with how long they have been silent") {
  ClusterRegistry registry(Options());
  REQUIRE(Join(registry, NODE_ROLE_SERVER, "h:1").ok());
  REQUIRE(Join(registry, NODE_ROLE_SERVER, "h:2").ok());
  HeartbeatRequest beat;
  beat.set_node_name("ps-1");
  REQUIRE(registry.Heartbeat(beat, kStart + absl::Seconds(2)).ok());
  std::vector<SilentNode> silent =
      registry.SilentNodes(kStart + absl::Seconds(4), absl::Seconds(3));
  REQUIRE(silent.size() == 1);
  CHECK(silent[0].name == "ps-0");
  CHECK(silent[0].silent_for == absl::Seconds(4));
  beat.set_node_name("ghost");
  CHECK(registry.Heartbeat(beat, kStart).status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("a server waiting for slow workers to register is alive while it polls the view") {
  // The servers register at once; the workers take longer than the failure timeout to
  // start (loading data, initialising CUDA). The servers send no heartbeats until the
  // cluster forms, but they poll for it, and that keeps them alive.
  ClusterRegistry registry(Options());
  REQUIRE(Join(registry, NODE_ROLE_SERVER, "h:1").ok());
  REQUIRE(Join(registry, NODE_ROLE_SERVER, "h:2").ok());
  for (int second = 1; second <= 10; ++second)
    registry.NoteAlive("ps-0", kStart + absl::Seconds(second));
  std::vector<SilentNode> silent =
      registry.SilentNodes(kStart + absl::Seconds(11), absl::Seconds(3));
  REQUIRE(silent.size() == 1);
  CHECK(silent[0].name == "ps-1");      // it stopped polling: it is silent
  registry.NoteAlive("ghost", kStart);  // unknown names change nothing
  REQUIRE(registry.DeclareDead("ps-1").status().code() == absl::StatusCode::kFailedPrecondition);
  registry.NoteAlive("ps-1", kStart + absl::Seconds(12));  // a dead node stays dead
  HeartbeatRequest beat;
  beat.set_node_name("ps-1");
  CHECK(registry.Heartbeat(beat, kStart + absl::Seconds(12)).status().code() ==
        absl::StatusCode::kFailedPrecondition);
}

TEST_CASE(
    "sync: a lost server's shards move to the survivors and every shard rolls back to the common "
    "checkpoint") {
  ClusterRegistry registry(Options(TrainingMode::kSync, 3, 2, 6));
  FormCluster(registry, 3, 2);
  ReportShards(registry, {{0, {130, 100}},
                          {1, {130, 120}},
                          {2, {129, 120}},
                          {3, {130, 120}},
                          {4, {130, 100}},
                          {5, {130, 120}}});
  absl::StatusOr<MapChange> change = registry.DeclareDead("ps-1");
  REQUIRE(change.ok());
  const ShardMap& map = change->map;
  CHECK(map.epoch() == 2);
  CHECK(ShardsPerServer(map) == std::map<std::string, int>{{"ps-0", 3}, {"ps-2", 3}});
  for (const ShardAssignment& assignment : map.shards()) {
    CHECK(assignment.restore() == SHARD_RESTORE_AT_STEP);
    CHECK(assignment.restore_step() == 100);  // the newest step every shard has on disk
  }
  CHECK(map.rewind_epoch() == 2);
  CHECK(map.rewind_step() == 100);
  CHECK(change->servers_first.empty());
  CHECK(change->servers_then.size() == 2);
  // The dead server is fenced: its heartbeats are refused until it registers again.
  HeartbeatRequest beat;
  beat.set_node_name("ps-1");
  CHECK(registry.Heartbeat(beat, kStart).status().code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("async: only the lost server's shards restore, and the loss is counted") {
  ClusterRegistry registry(Options(TrainingMode::kAsync, 2, 2, 4));
  FormCluster(registry, 2, 2);
  ReportShards(registry, {{0, {500, 450}}, {1, {505, 400}}, {2, {498, 450}}, {3, {510, 500}}});
  absl::StatusOr<MapChange> change = registry.DeclareDead("ps-1");  // holds shards 1 and 3
  REQUIRE(change.ok());
  for (const ShardAssignment& assignment : change->map.shards()) {
    CHECK(assignment.server_name() == "ps-0");
    const bool moved = assignment.shard_id() % 2 == 1;
    CHECK(assignment.restore() == (moved ? SHARD_RESTORE_NEWEST : SHARD_RESTORE_NONE));
  }
  CHECK(change->map.rewind_epoch() == 0);
  CHECK(change->summary.find(
            "shard 1 restores its checkpoint at update 400, rolling back about 105 updates") !=
        std::string::npos);
  CHECK(change->summary.find(
            "shard 3 restores its checkpoint at update 500, rolling back about 10 updates") !=
        std::string::npos);
}

TEST_CASE("a lost server cannot be replaced without checkpoints or survivors") {
  RegistryOptions options = Options();
  options.checkpoints = false;
  ClusterRegistry no_checkpoints(options);
  FormCluster(no_checkpoints, 2, 2);
  CHECK(no_checkpoints.DeclareDead("ps-0").status().code() ==
        absl::StatusCode::kFailedPrecondition);
  ClusterRegistry sole(Options(TrainingMode::kSync, 1, 1, 2));
  FormCluster(sole, 1, 1);
  absl::StatusOr<MapChange> none = sole.DeclareDead("ps-0");
  REQUIRE_FALSE(none.ok());
  CHECK(std::string(none.status().message()).find("no server is left") != std::string::npos);
}

TEST_CASE("a lost worker leaves the active set; one that comes back takes its slot") {
  ClusterRegistry registry(Options(TrainingMode::kSync, 2, 3, 4));
  FormCluster(registry, 2, 3);
  absl::StatusOr<MapChange> lost = registry.DeclareDead("worker-1");
  REQUIRE(lost.ok());
  CHECK(lost->map.active_workers(1) == false);
  CHECK(lost->map.active_workers(0) == true);
  CHECK(lost->map.shards(0).restore() == SHARD_RESTORE_NONE);
  CHECK(registry.View().live_workers() == 2);
  std::optional<MapChange> rejoined;
  absl::StatusOr<RegisterResponse> again = Join(registry, NODE_ROLE_WORKER, "w:new", &rejoined);
  REQUIRE(again.ok());
  CHECK(again->node_name() == "worker-1");
  CHECK(again->rank() == 1);
  REQUIRE(rejoined.has_value());
  CHECK(rejoined->map.active_workers(1) == true);
  CHECK(rejoined->map.epoch() == 3);
}

TEST_CASE("a server that comes back gets its fair share, handed off by the most loaded") {
  ClusterRegistry registry(Options(TrainingMode::kSync, 2, 1, 6));
  FormCluster(registry, 2, 1);
  ReportShards(
      registry,
      {{0, {10, 10}}, {1, {10, 10}}, {2, {10, 10}}, {3, {10, 10}}, {4, {10, 10}}, {5, {10, 10}}});
  REQUIRE(registry.DeclareDead("ps-1").ok());
  CHECK(ShardsPerServer(registry.View().shard_map()) == std::map<std::string, int>{{"ps-0", 6}});
  std::optional<MapChange> change;
  absl::StatusOr<RegisterResponse> back = Join(registry, NODE_ROLE_SERVER, "s:restarted", &change);
  REQUIRE(back.ok());
  CHECK(back->node_name() == "ps-1");
  REQUIRE(change.has_value());
  CHECK(ShardsPerServer(change->map) == std::map<std::string, int>{{"ps-0", 3}, {"ps-1", 3}});
  for (const ShardAssignment& assignment : change->map.shards()) {
    CHECK(assignment.restore() ==
          (assignment.server_name() == "ps-1" ? SHARD_RESTORE_HANDOFF : SHARD_RESTORE_NONE));
    if (assignment.server_name() == "ps-1") CHECK(assignment.server_address() == "s:restarted");
  }
  CHECK(change->servers_first == std::vector<std::string>{"ps-0"});  // hands off before ps-1 loads
  CHECK(change->servers_then == std::vector<std::string>{"ps-1"});
}

TEST_CASE("a running cluster admits no extra server; a drained server's slot takes a new one") {
  ClusterRegistry registry(Options(TrainingMode::kSync, 3, 1, 6));
  FormCluster(registry, 3, 1);
  std::optional<MapChange> added;
  CHECK(Join(registry, NODE_ROLE_SERVER, "s:extra", &added).status().code() ==
        absl::StatusCode::kResourceExhausted);
  CHECK_FALSE(added.has_value());
  absl::StatusOr<MapChange> drained = registry.Drain("ps-0");
  REQUIRE(drained.ok());
  CHECK(ShardsPerServer(drained->map) == std::map<std::string, int>{{"ps-1", 3}, {"ps-2", 3}});
  CHECK(drained->servers_first == std::vector<std::string>{"ps-0"});  // it hands off first
  for (const ShardAssignment& assignment : drained->map.shards()) {
    if (assignment.restore() != SHARD_RESTORE_NONE)
      CHECK(assignment.restore() == SHARD_RESTORE_HANDOFF);
  }
  HeartbeatRequest beat;
  beat.set_node_name("ps-0");
  // Until it serves the map that drains it (it hands its shards off as it installs it),
  // it is not told to exit.
  beat.set_serving_epoch(drained->map.epoch() - 1);
  absl::StatusOr<HeartbeatResponse> told = registry.Heartbeat(beat, kStart);
  REQUIRE(told.ok());
  CHECK_FALSE(told->shutdown());
  CHECK(told->epoch() == drained->map.epoch());
  beat.set_serving_epoch(drained->map.epoch());
  told = registry.Heartbeat(beat, kStart);
  REQUIRE(told.ok());
  CHECK(told->shutdown());
  CHECK(registry.SilentNodes(kStart + absl::Hours(1), absl::Seconds(3)).size() == 3);  // not ps-0
  CHECK(registry.Drain("ps-0").status().code() == absl::StatusCode::kNotFound);
  // The drained slot admits one new server, which takes its share back.
  absl::StatusOr<RegisterResponse> replacement = Join(registry, NODE_ROLE_SERVER, "s:new", &added);
  REQUIRE(replacement.ok());
  CHECK(replacement->node_name() == "ps-0");
  REQUIRE(added.has_value());
  CHECK(ShardsPerServer(added->map) ==
        std::map<std::string, int>{{"ps-0", 2}, {"ps-1", 2}, {"ps-2", 2}});
  CHECK(Join(registry, NODE_ROLE_SERVER, "s:another").status().code() ==
        absl::StatusCode::kResourceExhausted);
  REQUIRE(registry.Drain("ps-1").ok());
  REQUIRE(registry.Drain("ps-2").ok());
  CHECK(registry.Drain("ps-0").status().code() ==
        absl::StatusCode::kFailedPrecondition);  // the last one
}

TEST_CASE(
    "credentials: a node's own token, kept only as its digest; maps are signed; a saved state "
    "re-creates no credential") {
  ClusterRegistry registry(Options(TrainingMode::kSync, 2, 2, 6));
  std::optional<MapChange> change;
  absl::StatusOr<RegisterResponse> ps0 = Join(registry, NODE_ROLE_SERVER, "s:0");
  REQUIRE(ps0.ok());
  CHECK(ps0->scheduler_token_sha256() == Sha256(registry.scheduler_token()));
  CHECK(ps0->scheduler_map_key() == registry.map_key());
  CHECK(registry.FindCredential("ps-0")->token_sha256 == Sha256(TokenOf("s:0")));
  // A retry from the same process (the same token) gets the same answer; another
  // process at the address must wait until ps-0 is declared dead.
  CHECK(Join(registry, NODE_ROLE_SERVER, "s:0")->node_name() == "ps-0");
  std::optional<MapChange> ignored;
  const absl::StatusOr<RegisterResponse> impostor = registry.Register(
      NODE_ROLE_SERVER, "s:0", "another-process-token-0123456789abcdef", kStart, &ignored);
  CHECK(impostor.status().code() == absl::StatusCode::kUnavailable);
  // Its digest is no token: presented as one, it is another process.
  const absl::StatusOr<RegisterResponse> digest_as_token =
      registry.Register(NODE_ROLE_SERVER, "s:0", Sha256(TokenOf("s:0")), kStart, &ignored);
  CHECK(digest_as_token.status().code() == absl::StatusCode::kUnavailable);
  CHECK(registry.Register(NODE_ROLE_SERVER, "s:5", "too-short-token", kStart, &ignored)
            .status()
            .code() == absl::StatusCode::kInvalidArgument);
  FormCluster(registry, 0, 0);
  REQUIRE(Join(registry, NODE_ROLE_SERVER, "s:1").ok());
  REQUIRE(Join(registry, NODE_ROLE_WORKER, "w:0").ok());
  REQUIRE(Join(registry, NODE_ROLE_WORKER, "w:1").ok());
  const ShardMap map = registry.View().shard_map();
  REQUIRE(map.credentials_size() == 4);
  CHECK(VerifyShardMapSignature(map, registry.map_key()).ok());
  for (const NodeCredential& credential : map.credentials()) {
    const std::optional<KnownNode> known = registry.FindCredential(credential.node_name());
    REQUIRE(known.has_value());
    CHECK(known->token_sha256 == credential.token_sha256());
    CHECK(known->role == credential.role());
    CHECK(known->rank == credential.rank());
  }
  CHECK(registry.FindCredential("worker-1")->token_sha256 == Sha256(TokenOf("w:1")));
  CHECK(registry.FindCredential(kSchedulerNodeName)->token_sha256 ==
        Sha256(registry.scheduler_token()));
  CHECK_FALSE(registry.FindCredential("worker-7").has_value());
  // A dead worker leaves the map's credentials; its replacement's token replaces it.
  absl::StatusOr<MapChange> dead = registry.DeclareDead("worker-1");
  REQUIRE(dead.ok());
  CHECK(dead->map.credentials_size() == 3);
  CHECK(VerifyShardMapSignature(dead->map, registry.map_key()).ok());
  absl::StatusOr<RegisterResponse> replacement = Join(registry, NODE_ROLE_WORKER, "w:new", &change);
  REQUIRE(replacement.ok());
  CHECK(replacement->node_name() == "worker-1");
  REQUIRE(change.has_value());
  CHECK(change->map.credentials_size() == 4);
  CHECK(registry.FindCredential("worker-1")->token_sha256 == Sha256(TokenOf("w:new")));

  // The saved state holds no credential and nothing that re-creates one: no node's
  // token nor the scheduler's appears in its bytes.
  const SchedulerState state = registry.ExportState();
  const std::string bytes = state.SerializeAsString();
  for (const std::string address : {"s:0", "s:1", "w:0", "w:new"})
    CHECK(bytes.find(TokenOf(address)) == std::string::npos);
  CHECK(bytes.find(registry.scheduler_token()) == std::string::npos);
  // A successor recognises returning nodes (their retried registration, and their
  // calls by digest) but is a scheduler of its own: a new credential and map key, and
  // the map it serves signed with that key, its content unchanged.
  ClusterRegistry successor(Options(TrainingMode::kSync, 2, 2, 6));
  REQUIRE(successor.ImportState(state, kStart).ok());
  CHECK(successor.scheduler_token() != registry.scheduler_token());
  CHECK(successor.map_key() != registry.map_key());
  CHECK(successor.FindCredential("worker-1")->token_sha256 == Sha256(TokenOf("w:new")));
  absl::StatusOr<RegisterResponse> retried =
      successor.Register(NODE_ROLE_WORKER, "w:new", TokenOf("w:new"), kStart, &ignored);
  REQUIRE(retried.ok());
  CHECK(retried->node_name() == "worker-1");
  CHECK(retried->scheduler_map_key() == successor.map_key());
  // What the state file tells a reader (the address, the digest) does not make it
  // worker-1: its registration at worker-1's address is another process's.
  CHECK(successor
            .Register(NODE_ROLE_WORKER, "w:new", Sha256(TokenOf("w:new")) + "0123456789abcdef",
                      kStart, &ignored)
            .status()
            .code() == absl::StatusCode::kUnavailable);
  const ShardMap taken_over = successor.View().shard_map();
  CHECK(VerifyShardMapSignature(taken_over, successor.map_key()).ok());
  CHECK(VerifyShardMapSignature(taken_over, registry.map_key()).code() ==
        absl::StatusCode::kPermissionDenied);
  CHECK(ShardMapDigest(taken_over) == ShardMapDigest(registry.View().shard_map()));
  HeartbeatRequest beat;
  beat.set_node_name("ps-0");
  absl::StatusOr<HeartbeatResponse> answered = successor.Heartbeat(beat, kStart);
  REQUIRE(answered.ok());
  CHECK(answered->scheduler_map_key() == successor.map_key());
  CHECK(answered->scheduler_token_sha256() == Sha256(successor.scheduler_token()));
}

TEST_CASE(
    "replicated: a lost primary's backup is promoted, nothing rolls back, and copies are "
    "restored") {
  RegistryOptions options = Options(TrainingMode::kSync, 3, 2, 6);
  options.cluster.replication = 2;
  options.checkpoints = false;  // replicas need none
  ClusterRegistry registry(options);
  FormCluster(registry, 3, 2);
  const ShardMap before = registry.View().shard_map();
  for (const ShardAssignment& shard : before.shards()) {
    REQUIRE(shard.backups_size() == 1);
    CHECK(shard.backups(0).server_name() != shard.server_name());
    CHECK_FALSE(shard.backups(0).server_address().empty());
  }
  absl::StatusOr<MapChange> change = registry.DeclareDead("ps-1");
  REQUIRE(change.ok());
  INFO(change->summary);
  CHECK(change->map.epoch() == 2);
  CHECK(change->map.rewind_epoch() == 0);  // no rollback
  for (int i = 0; i < 6; ++i) {
    const ShardAssignment& was = before.shards(i);
    const ShardAssignment& now = change->map.shards(i);
    CHECK(now.restore() == SHARD_RESTORE_NONE);
    // The backup of a lost primary is the new primary; every other primary stays.
    CHECK(now.server_name() ==
          (was.server_name() == "ps-1" ? was.backups(0).server_name() : was.server_name()));
    REQUIRE(now.backups_size() == 1);
    CHECK(now.backups(0).server_name() != "ps-1");
    CHECK(now.backups(0).server_name() != now.server_name());
  }
  CHECK(change->summary.find("promoted") != std::string::npos);
  CHECK(change->servers_then == std::vector<std::string>{"ps-0", "ps-2"});
  // The next loss leaves one server: every shard on it, with no backup left to add.
  absl::StatusOr<MapChange> second = registry.DeclareDead("ps-2");
  REQUIRE(second.ok());
  for (const ShardAssignment& shard : second->map.shards()) {
    CHECK(shard.server_name() == "ps-0");
    CHECK(shard.backups_size() == 0);
  }
}

TEST_CASE("replicated: draining needs no checkpoints; a joining server takes backup roles") {
  RegistryOptions options = Options(TrainingMode::kAsync, 3, 2, 4);
  options.cluster.replication = 2;
  options.checkpoints = false;
  ClusterRegistry registry(options);
  FormCluster(registry, 3, 2);
  REQUIRE(registry.DeclareDead("ps-2").ok());
  std::optional<MapChange> joined;
  REQUIRE(Join(registry, NODE_ROLE_SERVER, "s:9", &joined).ok());  // a replacement for ps-2
  REQUIRE(joined.has_value());
  std::map<std::string, int> copies;
  for (const ShardAssignment& shard : joined->map.shards()) {
    ++copies[shard.server_name()];
    for (const ShardReplica& backup : shard.backups()) ++copies[backup.server_name()];
    CHECK(shard.restore() == SHARD_RESTORE_NONE);
  }
  CHECK(copies["ps-2"] == 2);  // 8 copies over 3 servers: at least 2 each
  absl::StatusOr<MapChange> drained = registry.Drain("ps-0");
  REQUIRE(drained.ok());
  INFO(drained->summary);
  for (const ShardAssignment& shard : drained->map.shards()) {
    CHECK(shard.server_name() != "ps-0");
    CHECK(shard.restore() == SHARD_RESTORE_NONE);  // promoted, not handed off
    for (const ShardReplica& backup : shard.backups()) CHECK(backup.server_name() != "ps-0");
  }
  CHECK(drained->servers_first == std::vector<std::string>{"ps-0"});
}

const NodeStatus& NodeNamed(const ClusterStatus& status, const std::string& name) {
  for (const NodeStatus& node : status.nodes()) {
    if (node.name() == name) return node;
  }
  FAIL("no node " << name);
  return status.nodes(0);
}

void WorkerBeat(ClusterRegistry& registry, const std::string& name, int64_t step, absl::Time now) {
  HeartbeatRequest beat;
  beat.set_node_name(name);
  beat.mutable_progress()->set_step(step);
  beat.mutable_progress()->set_samples_per_sec(100);
  REQUIRE(registry.Heartbeat(beat, now).ok());
}

TEST_CASE("a heartbeat's progress figures are checked before the ETA uses them") {
  RegistryOptions options = Options(TrainingMode::kSync, 2, 2, 4);
  ClusterRegistry registry(options);
  FormCluster(registry, 0, 2);
  HeartbeatRequest beat;
  beat.set_node_name("worker-0");
  beat.mutable_progress()->set_step(10);
  beat.mutable_progress()->set_total_steps(-5);
  absl::StatusOr<HeartbeatResponse> negative = registry.Heartbeat(beat, kStart);
  CHECK(negative.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(negative.status().message()).find("total_steps -5") != std::string::npos);
  beat.mutable_progress()->set_total_steps(100);
  beat.mutable_progress()->set_steps_per_sec(std::numeric_limits<double>::quiet_NaN());
  CHECK(registry.Heartbeat(beat, kStart).status().code() == absl::StatusCode::kInvalidArgument);
  beat.mutable_progress()->set_steps_per_sec(-1);
  CHECK(registry.Heartbeat(beat, kStart).status().code() == absl::StatusCode::kInvalidArgument);
  // Refused whole: the registry kept nothing of them.
  CHECK(NodeNamed(DescribeCluster(registry.TakeSnapshot(false), kStart), "worker-0")
            .progress()
            .total_steps() == 0);
  beat.mutable_progress()->set_steps_per_sec(25);
  REQUIRE(registry.Heartbeat(beat, kStart).ok());
  const ClusterStatus status = DescribeCluster(registry.TakeSnapshot(false), kStart);
  CHECK(status.total_steps() == 100);
}

TEST_CASE("the status: health from heartbeat ages, the slowest worker, and a verdict") {
  RegistryOptions options = Options(TrainingMode::kSync, 2, 2, 4);
  options.cluster.heartbeat_interval_ms = 500;
  options.cluster.failure_timeout_ms = 3000;
  options.cluster.replication = 2;
  ClusterRegistry registry(options);
  REQUIRE(Join(registry, NODE_ROLE_SERVER, "s:0").ok());
  CHECK(DescribeCluster(registry.TakeSnapshot(false), kStart).verdict() ==
        "waiting for 1 server and 2 workers");
  FormCluster(registry, 0, 2);
  REQUIRE(Join(registry, NODE_ROLE_SERVER, "s:1").ok());
  ReportShards(registry, {{0, {40, 30}}, {1, {41, -1}}});
  WorkerBeat(registry, "worker-0", 42, kStart + absl::Seconds(1));
  WorkerBeat(registry, "worker-1", 40, kStart + absl::Seconds(1));
  ClusterStatus status =
      DescribeCluster(registry.TakeSnapshot(false), kStart + absl::Milliseconds(1200));
  CHECK(status.verdict() == "training");
  CHECK(status.map_version() == 1);
  CHECK(status.mode() == "sync");
  CHECK(status.replication() == 2);
  CHECK(status.fastest_step() == 42);
  CHECK(status.slowest_step() == 40);
  CHECK(status.slowest_worker() == "worker-1");
  CHECK(status.samples_per_sec() == 200);
  CHECK(NodeNamed(status, "worker-0").health() == NODE_HEALTH_ALIVE);
  CHECK(NodeNamed(status, "worker-0").seconds_since_heartbeat() == Approx(0.2));
  CHECK(NodeNamed(status, "ps-0").health() == NODE_HEALTH_SUSPECT);  // silent 1.2 s > 2 heartbeats
  REQUIRE(status.shards_size() == 4);
  CHECK(status.shards(0).primary() == "ps-0");
  CHECK(status.shards(0).backups(0) == "ps-1");
  CHECK(status.shards(0).applied_updates() == 40);
  CHECK(status.shards(0).checkpoint_step() == 30);
  CHECK(status.shards(1).checkpoint_step() == -1);
  CHECK(status.shards(0).parameters() == 25);

  // No worker advances for longer than the failure timeout: stalled, naming the slowest.
  const ClusterStatus stalled =
      DescribeCluster(registry.TakeSnapshot(false), kStart + absl::Seconds(5));
  CHECK(stalled.verdict().rfind("stalled since ", 0) == 0);
  CHECK(stalled.verdict().find("(no worker advanced for 4 s; slowest worker-1 at step 40)") !=
        std::string::npos);
  REQUIRE(registry.DeclareDead("ps-0").ok());
  CHECK(NodeNamed(DescribeCluster(registry.TakeSnapshot(false), kStart + absl::Seconds(5)), "ps-0")
            .health() == NODE_HEALTH_DEAD);

  registry.RequestShutdown();
  CHECK(DescribeCluster(registry.TakeSnapshot(false), kStart + absl::Seconds(5)).verdict() ==
        "shutting down");
  CHECK(registry.job_finished());
  HeartbeatRequest beat;
  beat.set_node_name("worker-0");
  absl::StatusOr<HeartbeatResponse> told = registry.Heartbeat(beat, kStart + absl::Seconds(6));
  REQUIRE(told.ok());
  CHECK(told->shutdown());
  CHECK(told->job_finished());
  CHECK_FALSE(registry.all_servers_told_to_stop());  // worker-1 and ps-1 have not heard yet
}

TEST_CASE("a registry imported from a saved state carries on the job") {
  ClusterRegistry original(Options(TrainingMode::kSync, 2, 2, 4));
  FormCluster(original, 2, 2);
  REQUIRE(original.DeclareDead("worker-1").ok());
  const int64_t version = original.state_version();
  CHECK(version > 0);
  SchedulerState saved = original.ExportState();
  ClusterRegistry restarted(Options(TrainingMode::kSync, 2, 2, 4));
  REQUIRE(restarted.ImportState(saved, kStart + absl::Seconds(60)).ok());
  ClusterView view = restarted.View();
  CHECK(view.ready());
  CHECK(view.shard_map().epoch() == original.View().shard_map().epoch());
  CHECK(view.live_workers() == 1);
  // Live nodes get a fresh failure timeout; known names heartbeat, a retried
  // registration returns the same name, and the dead worker's slot can be retaken.
  CHECK(restarted.SilentNodes(kStart + absl::Seconds(61), absl::Seconds(3)).empty());
  HeartbeatRequest beat;
  beat.set_node_name("ps-1");
  CHECK(restarted.Heartbeat(beat, kStart + absl::Seconds(61)).ok());
  CHECK(Join(restarted, NODE_ROLE_SERVER, "s:0")->node_name() == "ps-0");
  CHECK(Join(restarted, NODE_ROLE_WORKER, "w:new")->node_name() == "worker-1");
}

TEST_CASE("the result is accepted from worker-0 after every live worker finished") {
  ClusterRegistry registry(Options());
  FormCluster(registry, 2, 2);
  ReportResultRequest result;
  result.set_node_name("worker-0");
  result.set_test_accuracy(0.87);
  CHECK(registry.ReportResult(result).status().code() == absl::StatusCode::kFailedPrecondition);
  ReportFinishedRequest finished;
  finished.set_node_name("worker-0");
  finished.set_steps(100);
  finished.set_samples(3200);
  finished.set_seconds(10);
  REQUIRE(registry.ReportFinished(finished, kStart).ok());
  finished.set_node_name("worker-1");
  finished.set_seconds(16);
  CHECK(registry.ReportFinished(finished, kStart)->workers_finished() == 2);
  ReportResultRequest impostor = result;
  impostor.set_node_name("worker-1");
  CHECK_FALSE(registry.ReportResult(impostor).ok());
  absl::StatusOr<JobResult> job = registry.ReportResult(result);
  REQUIRE(job.ok());
  // Every mutating call is safe to repeat (a retry after a lost response).
  CHECK(registry.ReportFinished(finished, kStart)->workers_finished() == 2);
  ReportResultRequest retried = result;
  retried.set_test_accuracy(0.5);
  CHECK(registry.ReportResult(retried)->test_accuracy == Approx(0.87));
  CHECK(job->steps == 100);
  CHECK(job->samples_per_sec == Approx(6400.0 / 16));
  CHECK(registry.job_finished());
  CHECK_FALSE(registry.all_servers_told_to_stop());
  for (const char* name : {"ps-0", "ps-1"}) {
    HeartbeatRequest beat;
    beat.set_node_name(name);
    CHECK(registry.Heartbeat(beat, kStart)->job_finished());
  }
  // worker-1 waits for the result too (it would evaluate in a lost worker-0's place);
  // worker-0 reported it and need not hear.
  CHECK_FALSE(registry.all_servers_told_to_stop());
  HeartbeatRequest beat;
  beat.set_node_name("worker-1");
  CHECK(registry.Heartbeat(beat, kStart)->job_finished());
  CHECK(registry.all_servers_told_to_stop());
}

TEST_CASE(
    "a saved state this spec cannot hold is refused whole: ranks, names and shards are checked") {
  ClusterRegistry original(Options(TrainingMode::kSync, 2, 2, 4));
  FormCluster(original, 2, 2);
  const SchedulerState good = original.ExportState();
  struct Case {
    const char* what;
    std::function<void(SchedulerState*)> spoil;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"a worker rank beyond the spec's workers",
       [](SchedulerState* s) { s->mutable_nodes(3)->set_rank(2); },
       "has rank 2; this spec has 2 workers"},
      {"a negative rank", [](SchedulerState* s) { s->mutable_nodes(0)->set_rank(-1); },
       "has rank -1"},
      {"a repeated rank", [](SchedulerState* s) { s->mutable_nodes(3)->set_rank(0); },
       "two workers have rank 0"},
      {"a repeated name", [](SchedulerState* s) { s->mutable_nodes(1)->set_name("ps-0"); },
       "'ps-0' is empty or repeats"},
      {"no role", [](SchedulerState* s) { s->mutable_nodes(1)->set_role(NODE_ROLE_UNSPECIFIED); },
       "no server or worker role"},
      {"a shard beyond the model",
       [](SchedulerState* s) {
         s->mutable_shard_map()->mutable_shards(0)->set_end(int64_t{1} << 40);
       },
       "outside this model's"},
      {"embedding rows for a model without tables",
       [](SchedulerState* s) {
         s->mutable_shard_map()->mutable_shards(0)->set_kind(SHARD_KIND_EMBEDDING_ROWS);
       },
       "holds embedding bucket 0 of 0; this model has 0 tables"},
      {"a shard held by a stranger",
       [](SchedulerState* s) {
         s->mutable_shard_map()->mutable_shards(0)->set_server_name("ps-9");
       },
       "held by 'ps-9'"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    SchedulerState spoiled = good;
    c.spoil(&spoiled);
    ClusterRegistry restarted(Options(TrainingMode::kSync, 2, 2, 4));
    const absl::Status imported = restarted.ImportState(spoiled, kStart);
    CHECK(imported.code() == absl::StatusCode::kDataLoss);
    CHECK(std::string(imported.message()).find(c.message) != std::string::npos);
    CHECK(restarted.ExportState().nodes_size() == 0);  // nothing was taken over
  }
  ClusterRegistry restarted(Options(TrainingMode::kSync, 2, 2, 4));
  CHECK(restarted.ImportState(good, kStart).ok());
}

TEST_CASE(
    "the rollback target is read from disk without the registry's lock: heartbeats are answered "
    "meanwhile") {
  RegistryOptions options = Options(TrainingMode::kSync, 2, 2, 4);
  ClusterRegistry* registry_seen = nullptr;
  bool heartbeat_answered_during_read = false;
  options.newest_complete_checkpoint = [&](const ModelLayout&) {
    // Stands for a slow disk: another thread's heartbeat must not wait for it.
    auto answered = std::async(std::launch::async, [&] {
      HeartbeatRequest beat;
      beat.set_node_name("worker-0");
      return registry_seen->Heartbeat(beat, kStart).ok();
    });
    heartbeat_answered_during_read =
        answered.wait_for(std::chrono::seconds(20)) == std::future_status::ready && answered.get();
    return int64_t{100};
  };
  ClusterRegistry registry(std::move(options));
  registry_seen = &registry;
  FormCluster(registry, 2, 2);
  absl::StatusOr<MapChange> change = registry.DeclareDead("ps-1");
  REQUIRE(change.ok());
  CHECK(heartbeat_answered_during_read);
  CHECK(change->summary.find("rolls back to its checkpoint at step 100") != std::string::npos);
}

TEST_CASE(
    "a server's checkpoint trouble is kept from its heartbeat, bounded, and cleared when it "
    "stops") {
  ClusterRegistry registry(Options(TrainingMode::kSync, 2, 2, 4));
  FormCluster(registry, 2, 2);
  HeartbeatRequest beat;
  beat.set_node_name("ps-0");
  beat.set_serving_epoch(registry.View().shard_map().epoch());
  beat.mutable_checkpoint_trouble()->set_failing_since_step(100);
  beat.mutable_checkpoint_trouble()->set_failed_writes(2);
  beat.mutable_checkpoint_trouble()->set_error("No space left on device" + std::string(5000, '!'));
  // A shard id the map does not give ps-0 is not recorded.
  ShardStatus* stranger = beat.add_shards();
  stranger->set_shard_id(1 << 30);
  stranger->set_applied_updates(7);
  REQUIRE(registry.Heartbeat(beat, kStart).ok());
  ClusterStatus status = DescribeCluster(registry.TakeSnapshot(false), kStart);
  const CheckpointTrouble& trouble = status.nodes(0).checkpoint_trouble();
  CHECK(trouble.failing_since_step() == 100);
  CHECK(trouble.error().size() == 512);
  CHECK(trouble.error().rfind("No space left on device", 0) == 0);
  for (const ShardStatusView& shard : status.shards()) CHECK(shard.shard_id() != (1 << 30));
  beat.clear_checkpoint_trouble();
  REQUIRE(registry.Heartbeat(beat, kStart).ok());
  CHECK_FALSE(
      DescribeCluster(registry.TakeSnapshot(false), kStart).nodes(0).has_checkpoint_trouble());
}

TEST_CASE(
    "when worker-0 is lost and not replaced, the lowest-ranked live worker reports the result") {
  ClusterRegistry registry(Options(TrainingMode::kSync, 2, 3, 4));
  FormCluster(registry, 2, 3);
  CHECK(registry.View().finisher_rank() == 0);
  REQUIRE(registry.DeclareDead("worker-0").ok());
  CHECK(registry.View().finisher_rank() == 1);
  for (const char* name : {"worker-1", "worker-2"}) {
    ReportFinishedRequest finished;
    finished.set_node_name(name);
    finished.set_steps(100);
    REQUIRE(registry.ReportFinished(finished, kStart).ok());
  }
  ReportResultRequest result;
  result.set_test_accuracy(0.86);
  result.set_node_name("worker-2");  // not the finisher
  CHECK(registry.ReportResult(result).status().code() == absl::StatusCode::kFailedPrecondition);
  result.set_node_name("worker-0");  // dead
  CHECK(registry.ReportResult(result).status().code() == absl::StatusCode::kFailedPrecondition);
  result.set_node_name("worker-1");
  REQUIRE(registry.ReportResult(result).ok());
  CHECK(registry.View().job_finished());
}

}  // namespace
}  // namespace paramserver
