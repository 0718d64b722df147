// The registry: recovering from lost servers and workers, rejoins, drains and rebalancing.
#include <algorithm>
#include <functional>
#include <future>
#include <limits>
#include <map>

#include "catch2/catch.hpp"
#include "common/security/secrets.h"
#include "scheduler/cluster_registry.h"
#include "scheduler/cluster_status.h"
#include "scheduler/registry_testing.h"

namespace paramserver {
namespace {

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
        absl::StatusCode::kDataLoss);  // its shards' only state is gone: the job ends
  ClusterRegistry sole(Options(TrainingMode::kSync, 1, 1, 2));
  FormCluster(sole, 1, 1);
  absl::StatusOr<MapChange> none = sole.DeclareDead("ps-0");
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().code() == absl::StatusCode::kFailedPrecondition);  // one may join, restore
  CHECK(std::string(none.status().message()).find("no server is left") != std::string::npos);
}

// A server registering at a new address takes every shard from disk, at the newest
// complete checkpoint, and the workers rewind.
void CheckNewcomerRollsEveryShardBack(ClusterRegistry& registry) {
  std::optional<MapChange> change;
  absl::StatusOr<RegisterResponse> back = Join(registry, NODE_ROLE_SERVER, "s:back", &change);
  REQUIRE(back.ok());
  REQUIRE(back->node_name() == "ps-0");  // the first dead slot
  REQUIRE(change.has_value());
  for (const ShardAssignment& assignment : change->map.shards()) {
    CHECK(assignment.server_name() == "ps-0");
    CHECK(assignment.restore() == SHARD_RESTORE_AT_STEP);
    CHECK(assignment.restore_step() == 100);  // the newest complete checkpoint (Options)
  }
  CHECK(change->map.rewind_epoch() == change->map.epoch());
  CHECK(change->map.rewind_step() == 100);
}

TEST_CASE("sync: a server joining after the last one died rolls every shard back") {
  // Either order of deaths: the newcomer's slot (ps-0) holds the shards only when ps-0
  // died last.
  for (const auto& [first, last] :
       std::vector<std::pair<std::string, std::string>>{{"ps-1", "ps-0"}, {"ps-0", "ps-1"}}) {
    INFO(first << " died, then " << last);
    ClusterRegistry registry(Options(TrainingMode::kSync, 2, 1, 4));
    FormCluster(registry, 2, 1);
    ReportShards(registry, {{0, {130, 100}}, {1, {130, 100}}, {2, {130, 100}}, {3, {130, 100}}});
    REQUIRE(registry.DeclareDead(first).ok());       // the other takes every shard
    REQUIRE_FALSE(registry.DeclareDead(last).ok());  // no server is left
    CheckNewcomerRollsEveryShardBack(registry);
  }
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

// Checks that the first server's registration is answered with the scheduler's credential
// and keeps only the digest of its own token, which no other process can reuse.
void CheckRegistrationKeepsItsOwnToken(ClusterRegistry& registry) {
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
}

// Completes the cluster and checks that its map is signed and carries every node's
// credential as the registry knows it.
void CheckMapCarriesEveryCredential(ClusterRegistry& registry) {
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
}

// Checks that worker-1's death takes its credential out of the map, and that its
// replacement's token takes its place.
void CheckReplacementTokenReplacesTheDead(ClusterRegistry& registry) {
  std::optional<MapChange> change;
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
}

// Checks that a successor importing `registry`'s saved `state` knows the returning nodes
// but has a credential and map key of its own, and signs the same map with its key.
void CheckSuccessorHasItsOwnCredential(const ClusterRegistry& registry,
                                       const SchedulerState& state) {
  std::optional<MapChange> ignored;
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
    "credentials: a node's own token, kept only as its digest; maps are signed; a saved state "
    "re-creates no credential") {
  ClusterRegistry registry(Options(TrainingMode::kSync, 2, 2, 6));
  CheckRegistrationKeepsItsOwnToken(registry);
  CheckMapCarriesEveryCredential(registry);
  CheckReplacementTokenReplacesTheDead(registry);

  // The saved state holds no credential and nothing that re-creates one: no node's
  // token nor the scheduler's appears in its bytes.
  const SchedulerState state = registry.ExportState();
  const std::string bytes = state.SerializeAsString();
  for (const std::string address : {"s:0", "s:1", "w:0", "w:new"})
    CHECK(bytes.find(TokenOf(address)) == std::string::npos);
  CHECK(bytes.find(registry.scheduler_token()) == std::string::npos);
  CheckSuccessorHasItsOwnCredential(registry, state);
}

TEST_CASE(
    "replicated: a lost primary's backup is promoted, nothing rolls back, and copies are "
    "restored") {
  RegistryOptions options = Options(TrainingMode::kSync, 3, 2, 6);
  options.cluster.replication = 2;
  options.checkpoints = false;  // replicas need none
  ClusterRegistry registry(options);
  FormCluster(registry, 3, 2);
  ReportBackupsCopied(registry);
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
  // The next loss leaves one server: every shard on it, with no backup left to add
  // (once the new backups have copied their shards).
  ReportBackupsCopied(registry);
  absl::StatusOr<MapChange> second = registry.DeclareDead("ps-2");
  REQUIRE(second.ok());
  for (const ShardAssignment& shard : second->map.shards()) {
    CHECK(shard.server_name() == "ps-0");
    CHECK(shard.backups_size() == 0);
  }
}

TEST_CASE("a backup is promoted only once its server has reported the copy done") {
  for (const bool reported : {false, true}) {
    RegistryOptions options = Options(TrainingMode::kSync, 3, 2, 6);
    options.cluster.replication = 2;
    ClusterRegistry registry(options);
    FormCluster(registry, 3, 2);
    ReportBackupsCopied(registry);
    // ps-2's shards: their backups are promoted, and new backups start copying.
    absl::StatusOr<MapChange> first = registry.DeclareDead("ps-2");
    REQUIRE(first.ok());
    CHECK(first->map.rewind_epoch() == 0);
    if (reported) ReportBackupsCopied(registry);
    // ps-0 lost next: a shard whose only backup is still copying has no copy that holds
    // it, and every shard rolls back; once the copies are reported, backups are promoted.
    absl::StatusOr<MapChange> second = registry.DeclareDead("ps-0");
    REQUIRE(second.ok());
    INFO(second->summary);
    CHECK((second->map.rewind_step() == 100) == !reported);
    CHECK((second->summary.find("no copy left") != std::string::npos) == !reported);
    for (const ShardAssignment& shard : second->map.shards()) {
      for (const ShardReplica& backup : shard.backups())
        CHECK(backup.server_name() != shard.server_name());
    }
  }
}

TEST_CASE(
    "a backup whose shard got a new primary holds it again only once it has reported its copy "
    "from the new one") {
  for (const bool reported : {false, true}) {
    RegistryOptions options = Options(TrainingMode::kSync, 4, 2, 4);
    options.cluster.replication = 3;
    ClusterRegistry registry(options);
    FormCluster(registry, 4, 2);
    ReportBackupsCopied(registry);
    const ShardMap before = registry.View().shard_map();
    const ShardAssignment& moved = before.shards(0);
    REQUIRE(moved.backups_size() == 2);
    // Shard 0's primary lost: its first backup is promoted; its second stays a backup
    // and follows the new primary's log once it has copied the shard from it (the new
    // primary's acknowledgements do not wait for it before).
    absl::StatusOr<MapChange> first = registry.DeclareDead(moved.server_name());
    REQUIRE(first.ok());
    const ShardAssignment& promoted = first->map.shards(0);
    REQUIRE(promoted.server_name() == moved.backups(0).server_name());
    const std::string kept_backup = moved.backups(1).server_name();
    CHECK(std::any_of(promoted.backups().begin(), promoted.backups().end(),
                      [&](const ShardReplica& b) { return b.server_name() == kept_backup; }));
    if (reported) ReportBackupsCopied(registry);
    // The new primary lost before that: no backup of shard 0 holds it, and every shard
    // rolls back; once reported, the kept backup is promoted.
    absl::StatusOr<MapChange> second = registry.DeclareDead(promoted.server_name());
    REQUIRE(second.ok());
    INFO(second->summary);
    CHECK((second->map.rewind_step() == 100) == !reported);
    if (reported) CHECK(second->map.shards(0).server_name() == kept_backup);
  }
}

TEST_CASE(
    "two servers lost together: the one found dead second is passed over as the first one's "
    "successor, and nothing rolls back") {
  for (const bool found_at_given : {false, true}) {
    RegistryOptions options = Options(TrainingMode::kSync, 4, 2, 4);
    options.cluster.replication = 3;
    options.cluster.failure_timeout_ms = 3000;
    ClusterRegistry registry(options);
    FormCluster(registry, 4, 2);
    ReportBackupsCopied(registry);
    const ShardMap before = registry.View().shard_map();
    const ShardAssignment& shard = before.shards(0);
    REQUIRE(shard.backups_size() == 2);
    const std::string primary = shard.server_name();
    const std::string with_it = shard.backups(0).server_name();  // killed with the primary
    const std::string survivor = shard.backups(1).server_name();
    // The two went silent together; the others beat on. The primary is found dead first.
    const absl::Time found = kStart + absl::Seconds(2);
    ReportBackupsCopied(registry, found, {primary, with_it});
    std::optional<absl::Time> found_at;
    if (found_at_given) found_at = found;
    absl::StatusOr<MapChange> first = registry.DeclareDead(primary, found_at);
    REQUIRE(first.ok());
    INFO(first->summary);
    // Given when the loss was found, the silent backup is not made the primary: the one
    // heard from is, and it goes on holding the shard as it did.
    CHECK((first->map.shards(0).server_name() == survivor) == found_at_given);
    CHECK((first->summary.find(with_it + ", not heard from lately, passed over") !=
           std::string::npos) == found_at_given);
    // The second found dead a moment later: without the first plan's care, the shard's
    // remaining backup was still to copy it from a server that is gone, so no copy held
    // it and every shard rolled back to its checkpoint.
    absl::StatusOr<MapChange> second = registry.DeclareDead(with_it, found_at);
    REQUIRE(second.ok());
    INFO(second->summary);
    CHECK((second->map.rewind_step() == 100) == !found_at_given);
    CHECK((second->summary.find("no copy left") != std::string::npos) == !found_at_given);
    if (found_at_given) {
      CHECK(second->map.shards(0).server_name() == survivor);
      CHECK(second->map.rewind_epoch() == 0);
      for (const ShardAssignment& assignment : second->map.shards()) {
        CHECK(assignment.restore() == SHARD_RESTORE_NONE);
        CHECK(assignment.server_name() != primary);
        CHECK(assignment.server_name() != with_it);
        for (const ShardReplica& backup : assignment.backups()) {
          CHECK(backup.server_name() != primary);
          CHECK(backup.server_name() != with_it);
        }
      }
    }
  }
}

TEST_CASE("two servers lost together without checkpoint.dir: the job goes on, not ended") {
  RegistryOptions options = Options(TrainingMode::kAsync, 4, 2, 4);
  options.cluster.replication = 3;
  options.cluster.failure_timeout_ms = 3000;
  options.checkpoints = false;
  ClusterRegistry registry(options);
  FormCluster(registry, 4, 2);
  ReportBackupsCopied(registry);
  const ShardAssignment shard = registry.View().shard_map().shards(0);
  const absl::Time found = kStart + absl::Seconds(2);
  ReportBackupsCopied(registry, found, {shard.server_name(), shard.backups(0).server_name()});
  REQUIRE(registry.DeclareDead(shard.server_name(), found).ok());
  absl::StatusOr<MapChange> second = registry.DeclareDead(shard.backups(0).server_name(), found);
  INFO(second.status().ToString());
  REQUIRE(second.ok());  // without the care above: DATA_LOSS, and the job would end
  CHECK(second->map.shards(0).server_name() == shard.backups(1).server_name());
}

TEST_CASE("replicated: draining needs no checkpoints; a joining server takes backup roles") {
  RegistryOptions options = Options(TrainingMode::kAsync, 3, 2, 4);
  options.cluster.replication = 2;
  options.checkpoints = false;
  ClusterRegistry registry(options);
  FormCluster(registry, 3, 2);
  ReportBackupsCopied(registry);
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
  CHECK(copies["ps-2"] == 2);     // 8 copies over 3 servers: at least 2 each
  ReportBackupsCopied(registry);  // the joined server's copies are done
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

}  // namespace
}  // namespace paramserver
