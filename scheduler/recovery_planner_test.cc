// The recovery planners on their own: the maps they plan for a server that joins, dies
// or is drained, and the changes they refuse. No registry, no gRPC.
#include "scheduler/recovery_planner.h"

#include <algorithm>
#include <map>
#include <set>

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

// A model of `parameters` weights in one tensor.
ModelLayout Flat(int64_t parameters) { return *ModelLayout::Create({{"weights", {parameters}}}); }

const std::vector<ServerEndpoint> kThree = {{"ps-0", "h:0"}, {"ps-1", "h:1"}, {"ps-2", "h:2"}};

std::vector<ServerEndpoint> Without(const std::string& name) {
  std::vector<ServerEndpoint> left;
  for (const ServerEndpoint& server : kThree)
    if (server.name != name) left.push_back(server);
  return left;
}

ShardMap Placed(int replication) {
  ShardMap map = PlaceShards(Flat(600), 6, 0, kThree, 1);
  AssignBackups(&map, kThree, replication);
  map.set_epoch(map.epoch() + 1);  // the next map, as the registry hands it over
  return map;
}

std::map<std::string, int> Primaries(const ShardMap& map) {
  std::map<std::string, int> count;
  for (const ShardAssignment& shard : map.shards()) ++count[shard.server_name()];
  return count;
}

RecoveryContext Context(TrainingMode mode, int replication, bool checkpoints, int64_t rollback,
                        const std::map<int, ShardRecord>* records = nullptr) {
  RecoveryContext context;
  context.mode = mode;
  context.replication = replication;
  context.checkpoints = checkpoints;
  context.rollback_step = rollback;
  context.shards = records;
  return context;
}

TEST_CASE("a lost primary with a backup is promoted: nothing rolls back") {
  absl::StatusOr<PlannedMapChange> planned =
      PlanServerLoss(Placed(2), "ps-1", Without("ps-1"),
                     Context(TrainingMode::kSync, 2, /*checkpoints=*/false, -1));
  REQUIRE(planned.ok());
  CHECK(Primaries(planned->map).count("ps-1") == 0);
  for (const ShardAssignment& shard : planned->map.shards()) {
    CHECK(shard.restore() == SHARD_RESTORE_NONE);
    CHECK(shard.backups_size() == 1);  // re-replicated on what is left
    CHECK(shard.backups(0).server_name() != shard.server_name());
  }
  CHECK(planned->map.rewind_step() == 0);
  CHECK(planned->losing_servers.empty());
  CHECK(planned->summary.rfind("ps-1 lost; ", 0) == 0);
}

TEST_CASE(
    "a backup still copying its shard is never promoted: another is, or the shard rolls back") {
  ShardMap map = Placed(3);  // each shard: a primary and two backups
  const ShardAssignment& first = map.shards(0);
  const std::string primary = first.server_name();
  const std::string copying_backup = first.backups(0).server_name();
  const std::string ready_backup = first.backups(1).server_name();
  std::vector<ServerEndpoint> live = Without(primary);
  std::set<std::pair<std::string, int>> copying = {{copying_backup, 0}};
  RecoveryContext context = Context(TrainingMode::kSync, 3, /*checkpoints=*/true, 50);
  context.copying = &copying;
  absl::StatusOr<PlannedMapChange> planned = PlanServerLoss(map, primary, live, context);
  REQUIRE(planned.ok());
  CHECK(planned->map.shards(0).server_name() == ready_backup);  // not the first backup
  CHECK(planned->map.rewind_step() == 0);                       // nothing rolls back
  // Both backups copying: no copy holds the shard; sync rolls back to the checkpoint.
  copying.insert({ready_backup, 0});
  planned = PlanServerLoss(map, primary, live, context);
  REQUIRE(planned.ok());
  CHECK(planned->map.rewind_step() == 50);
  CHECK(planned->summary.find("shard 0: no copy left") != std::string::npos);
  // Whichever server restores it holds it once: never as its own backup.
  for (const ShardAssignment& shard : planned->map.shards()) {
    for (const ShardReplica& backup : shard.backups())
      CHECK(backup.server_name() != shard.server_name());
  }
}

TEST_CASE("sync: an unreplicated loss rolls every shard back to the common checkpoint") {
  const std::map<int, ShardRecord> records = {{0, {120, 100}}, {1, {130, 100}}};
  absl::StatusOr<PlannedMapChange> planned =
      PlanServerLoss(Placed(1), "ps-2", Without("ps-2"),
                     Context(TrainingMode::kSync, 1, true, /*rollback=*/100, &records));
  REQUIRE(planned.ok());
  for (const ShardAssignment& shard : planned->map.shards()) {
    CHECK(shard.restore() == SHARD_RESTORE_AT_STEP);
    CHECK(shard.restore_step() == 100);
    CHECK(shard.server_name() != "ps-2");
  }
  CHECK(planned->map.rewind_step() == 100);
  CHECK(planned->map.rewind_epoch() == planned->map.epoch());
  CHECK(planned->summary.find("rolls back to its checkpoint at step 100 (about 30 steps") !=
        std::string::npos);
}

TEST_CASE("async: only the lost shards restore their newest checkpoint") {
  const std::map<int, ShardRecord> records = {{2, {50, 40}}, {5, {55, 40}}};
  absl::StatusOr<PlannedMapChange> planned = PlanServerLoss(
      Placed(1), "ps-2", Without("ps-2"), Context(TrainingMode::kAsync, 1, true, -1, &records));
  REQUIRE(planned.ok());
  for (const ShardAssignment& shard : planned->map.shards()) {
    const bool lost = shard.shard_id() == 2 || shard.shard_id() == 5;  // ps-2's: i % 3 == 2
    CHECK(shard.restore() == (lost ? SHARD_RESTORE_NEWEST : SHARD_RESTORE_NONE));
  }
  CHECK(planned->map.rewind_step() == 0);
  CHECK(planned->summary.find("shard 5 restores its checkpoint at update 40, rolling back about "
                              "15 updates") != std::string::npos);
}

TEST_CASE(
    "hybrid (async tables): a lost table restores its newest, a lost dense shard rolls "
    "the dense part back") {
  // Shards 0-1 dense, 2-5 embedding buckets, dealt on: ps-1 holds 1 (dense) and 4, ps-2
  // holds 2 and 5 (tables only).
  const ModelLayout layout = *ModelLayout::Create({{"fc1.weight", {10, 4}}}, {{"C1", 8}});
  ShardMap map = PlaceShards(layout, 2, 4, kThree, 1);
  map.set_epoch(map.epoch() + 1);
  // Dense shards count steps (100 checkpointed, at 130); tables count pushes.
  const std::map<int, ShardRecord> records = {{0, {130, 100}}, {1, {130, 100}}, {2, {900, 800}},
                                              {3, {900, 800}}, {4, {900, 850}}, {5, {910, 880}}};
  RecoveryContext context = Context(TrainingMode::kSync, 1, true, /*rollback=*/100, &records);
  context.async_tables = true;
  // Tables alone: they restore their newest; the dense part and the workers go on.
  absl::StatusOr<PlannedMapChange> tables = PlanServerLoss(map, "ps-2", Without("ps-2"), context);
  REQUIRE(tables.ok());
  for (const ShardAssignment& shard : tables->map.shards()) {
    const bool lost = shard.shard_id() == 2 || shard.shard_id() == 5;
    CHECK(shard.restore() == (lost ? SHARD_RESTORE_NEWEST : SHARD_RESTORE_NONE));
  }
  CHECK(tables->map.rewind_epoch() == 0);
  CHECK(tables->summary.find("shard 5 restores its checkpoint at update 880, rolling back about "
                             "30 updates") != std::string::npos);
  CHECK(tables->summary.find("rolls back to its checkpoint at step") == std::string::npos);
  // A dense shard too: every dense shard rolls back and the workers rewind; the lost table
  // restores its newest, the others keep their rows.
  absl::StatusOr<PlannedMapChange> dense = PlanServerLoss(map, "ps-1", Without("ps-1"), context);
  REQUIRE(dense.ok());
  for (const ShardAssignment& shard : dense->map.shards()) {
    INFO("shard " << shard.shard_id());
    if (shard.kind() != SHARD_KIND_EMBEDDING_ROWS) {
      CHECK(shard.restore() == SHARD_RESTORE_AT_STEP);
      CHECK(shard.restore_step() == 100);
    } else {
      CHECK(shard.restore() == (shard.shard_id() == 4 ? SHARD_RESTORE_NEWEST : SHARD_RESTORE_NONE));
    }
  }
  CHECK(dense->map.rewind_step() == 100);
  CHECK(dense->map.rewind_epoch() == dense->map.epoch());
  // The steps to replay are the dense shards' (130 - 100), not the tables' push counts.
  CHECK(dense->summary.find("every dense shard rolls back to its checkpoint at step 100 (about "
                            "30 steps to replay)") != std::string::npos);
  CHECK(dense->summary.find("shard 4 restores its checkpoint at update 850") != std::string::npos);
  // Without async tables the same loss rolls every shard back.
  context.async_tables = false;
  absl::StatusOr<PlannedMapChange> sync = PlanServerLoss(map, "ps-2", Without("ps-2"), context);
  REQUIRE(sync.ok());
  for (const ShardAssignment& shard : sync->map.shards())
    CHECK(shard.restore() == SHARD_RESTORE_AT_STEP);
  // Every server died and one rejoins: dense shards at the rollback step, tables newest.
  context.async_tables = true;
  const std::vector<ServerEndpoint> alone = {kThree[1]};
  ShardMap left = PlaceShards(layout, 2, 4, alone, 1);
  left.set_epoch(left.epoch() + 1);
  PlannedMapChange rejoined = PlanServerJoin(left, kThree[1], alone, context);
  for (const ShardAssignment& shard : rejoined.map.shards()) {
    CHECK(shard.restore() == (shard.kind() == SHARD_KIND_EMBEDDING_ROWS ? SHARD_RESTORE_NEWEST
                                                                        : SHARD_RESTORE_AT_STEP));
  }
  CHECK(rejoined.map.rewind_step() == 100);
  CHECK(rejoined.summary.find("every dense shard rolls back to its checkpoint at step 100") !=
        std::string::npos);
}

TEST_CASE("losses that cannot be recovered are refused, naming why") {
  const absl::Status none_left =
      PlanServerLoss(Placed(1), "ps-0", {}, Context(TrainingMode::kSync, 1, true, 10)).status();
  CHECK(none_left.code() == absl::StatusCode::kFailedPrecondition);  // one may join, restore
  CHECK(none_left.message().find("no server is left") != absl::string_view::npos);
  const absl::Status none_left_nothing_saved =
      PlanServerLoss(Placed(1), "ps-0", {}, Context(TrainingMode::kSync, 1, false, 10)).status();
  CHECK(none_left_nothing_saved.code() == absl::StatusCode::kDataLoss);
  CHECK(none_left_nothing_saved.message().find("checkpoint.dir is not set") !=
        absl::string_view::npos);
  const absl::Status no_checkpoints =
      PlanServerLoss(Placed(1), "ps-0", Without("ps-0"), Context(TrainingMode::kSync, 1, false, 10))
          .status();
  CHECK(no_checkpoints.code() == absl::StatusCode::kDataLoss);
  CHECK(no_checkpoints.message().find("checkpoint.dir is not set") != absl::string_view::npos);
  const absl::Status no_target =
      PlanServerLoss(Placed(1), "ps-0", Without("ps-0"), Context(TrainingMode::kSync, 1, true, -1))
          .status();
  CHECK(no_target.code() == absl::StatusCode::kFailedPrecondition);  // a joining one re-reads
  CHECK(no_target.message() == "no complete checkpoint to roll back to; ps-0 cannot be replaced");
}

TEST_CASE("a drained server hands its unreplicated shards off and installs the map first") {
  absl::StatusOr<PlannedMapChange> planned =
      PlanDrain(Placed(1), "ps-0", Without("ps-0"), Context(TrainingMode::kSync, 1, true, -1));
  REQUIRE(planned.ok());
  CHECK(planned->losing_servers == std::vector<std::string>{"ps-0"});
  for (const ShardAssignment& shard : planned->map.shards()) {
    const bool moved = shard.shard_id() % 3 == 0;
    CHECK(shard.restore() == (moved ? SHARD_RESTORE_HANDOFF : SHARD_RESTORE_NONE));
    CHECK(shard.server_name() != "ps-0");
  }
  CHECK(PlanDrain(Placed(1), "ps-0", Without("ps-0"), Context(TrainingMode::kSync, 1, false, -1))
            .status()
            .message()
            .find("set checkpoint.dir or cluster.replication >= 2") != absl::string_view::npos);
  CHECK(PlanDrain(Placed(1), "ps-0", {}, Context(TrainingMode::kSync, 1, true, -1))
            .status()
            .message() == "ps-0 is the last live server");
}

TEST_CASE("a joining server takes its fair share: handoffs unreplicated, backups replicated") {
  // ps-2 came back to an empty slot: ps-0 and ps-1 hold all six shards.
  ShardMap two = PlaceShards(Flat(600), 6, 0, {kThree[0], kThree[1]}, 1);
  PlannedMapChange joined =
      PlanServerJoin(two, kThree[2], kThree, Context(TrainingMode::kSync, 1, false, -1));
  CHECK(Primaries(joined.map) == std::map<std::string, int>{{"ps-0", 2}, {"ps-1", 2}, {"ps-2", 2}});
  int handoffs = 0;
  for (const ShardAssignment& shard : joined.map.shards()) {
    if (shard.server_name() == "ps-2") {
      CHECK(shard.restore() == SHARD_RESTORE_HANDOFF);
      ++handoffs;
    }
  }
  CHECK(handoffs == 2);
  CHECK(joined.losing_servers.size() == 2);  // both gave one up

  ShardMap replicated = PlaceShards(Flat(600), 6, 0, {kThree[0], kThree[1]}, 1);
  AssignBackups(&replicated, {kThree[0], kThree[1]}, 2);
  PlannedMapChange backed =
      PlanServerJoin(replicated, kThree[2], kThree, Context(TrainingMode::kSync, 2, false, -1));
  CHECK(Primaries(backed.map) == Primaries(replicated));  // primaries stay
  CHECK(backed.losing_servers.empty());
  int backups_on_joined = 0;
  for (const ShardAssignment& shard : backed.map.shards()) {
    for (const ShardReplica& backup : shard.backups())
      backups_on_joined += backup.server_name() == "ps-2";
  }
  CHECK(backups_on_joined > 0);
  CHECK(backed.summary.find("ps-2 (re)joined at h:2; it backs up shards [") == 0);
}

TEST_CASE(
    "a joined backup takes its fair share of primaries by swaps, only of the copies it has "
    "caught up on") {
  // Two servers hold 6 dense shards and 4 embedding buckets; ps-2 joins as a backup.
  const ModelLayout with_tables =
      *ModelLayout::Create({{"fc1.weight", {60, 10}}}, {{"C1", 8}, {"C2", 8}});
  ShardMap two = PlaceShards(with_tables, 6, 4, {kThree[0], kThree[1]}, 1);
  REQUIRE(two.shards_size() == 10);
  AssignBackups(&two, {kThree[0], kThree[1]}, 2);
  const PlannedMapChange backed =
      PlanServerJoin(two, kThree[2], kThree, Context(TrainingMode::kSync, 2, false, -1));
  std::set<int> backed_up;  // ps-2's backup roles
  for (const ShardAssignment& shard : backed.map.shards()) {
    for (const ShardReplica& backup : shard.backups())
      if (backup.server_name() == "ps-2") backed_up.insert(shard.shard_id());
  }
  REQUIRE(backed_up.size() >= 2);
  // Nothing is ready yet (its copies are under way): nothing moves.
  CHECK_FALSE(PlanPrimaryBalance(backed.map, kThree, {}).has_value());
  CHECK_FALSE(PlanPrimaryBalance(backed.map, kThree, {{"ps-2", {}}}).has_value());
  // Every copy done: it takes primaries, per kind, until no server has two more.
  const std::optional<PlannedMapChange> balanced =
      PlanPrimaryBalance(backed.map, kThree, {{"ps-2", backed_up}});
  REQUIRE(balanced.has_value());
  for (const bool embedding : {false, true}) {
    std::map<std::string, int> primaries{{"ps-0", 0}, {"ps-1", 0}, {"ps-2", 0}};
    for (const ShardAssignment& shard : balanced->map.shards())
      if ((shard.kind() == SHARD_KIND_EMBEDDING_ROWS) == embedding)
        ++primaries[shard.server_name()];
    INFO((embedding ? "embedding" : "dense") << " ps-0 " << primaries["ps-0"] << " ps-1 "
                                             << primaries["ps-1"] << " ps-2 " << primaries["ps-2"]);
    const auto [low, high] =
        std::minmax_element(primaries.begin(), primaries.end(),
                            [](const auto& a, const auto& b) { return a.second < b.second; });
    CHECK(high->second - low->second <= 1);
    CHECK(primaries["ps-2"] >= 1);
  }
  // A swap: the new primary was a ready backup, the old primary is now its backup, and
  // every shard keeps its copies on distinct servers. The old primaries install the map
  // first (they hand their shards over), and only they.
  std::set<std::string> handing_over;
  for (int i = 0; i < balanced->map.shards_size(); ++i) {
    const ShardAssignment& before = backed.map.shards(i);
    const ShardAssignment& after = balanced->map.shards(i);
    REQUIRE(after.backups_size() == before.backups_size());
    if (after.server_name() == before.server_name()) continue;
    CHECK(after.server_name() == "ps-2");
    CHECK(backed_up.count(after.shard_id()) == 1);
    CHECK(after.backups(0).server_name() == before.server_name());
    handing_over.insert(before.server_name());
  }
  CHECK(std::set<std::string>(balanced->losing_servers.begin(), balanced->losing_servers.end()) ==
        handing_over);
  CHECK(balanced->losing_servers.size() == handing_over.size());
  CHECK(balanced->summary.find("primaries rebalanced: shards [") == 0);
  // Balanced already: nothing more to move.
  CHECK_FALSE(PlanPrimaryBalance(balanced->map, kThree,
                                 {{"ps-0", {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
                                  {"ps-1", {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
                                  {"ps-2", {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}}})
                  .has_value());
}

TEST_CASE("a server that rejoins after the last one died: sync rolls every shard back") {
  // ps-1 was the last server alive and died: every shard was left on its slot. It
  // registers again, alone, and its shards come from disk.
  const std::vector<ServerEndpoint> alone = {kThree[1]};
  for (int replication : {1, 2}) {
    ShardMap left = PlaceShards(Flat(600), 6, 0, alone, 1);
    left.set_epoch(left.epoch() + 1);
    INFO("replication " << replication);
    PlannedMapChange sync = PlanServerJoin(
        left, kThree[1], alone, Context(TrainingMode::kSync, replication, true, /*rollback=*/300));
    for (const ShardAssignment& shard : sync.map.shards()) {
      CHECK(shard.restore() == SHARD_RESTORE_AT_STEP);
      CHECK(shard.restore_step() == 300);
    }
    CHECK(sync.map.rewind_epoch() == left.epoch());  // workers that began before it rewind
    CHECK(sync.map.rewind_step() == 300);
    CHECK(sync.summary.find("shards [0, 1, 2, 3, 4, 5] had no live copy: every shard rolls back "
                            "to its checkpoint at step 300 and the workers rewind") !=
          std::string::npos);
    // Async, or sync without a complete checkpoint: each shard its newest checkpoint.
    for (const RecoveryContext& context :
         {Context(TrainingMode::kAsync, replication, true, 300),
          Context(TrainingMode::kSync, replication, true, /*rollback=*/-1)}) {
      PlannedMapChange newest = PlanServerJoin(left, kThree[1], alone, context);
      for (const ShardAssignment& shard : newest.map.shards())
        CHECK(shard.restore() == SHARD_RESTORE_NEWEST);
      CHECK(newest.map.rewind_epoch() == 0);
    }
  }
  // A server that takes another dead slot (here ps-0's, empty) takes the shards too.
  for (int replication : {1, 2}) {
    ShardMap left = PlaceShards(Flat(600), 6, 0, alone, 1);
    left.set_epoch(left.epoch() + 1);
    INFO("replication " << replication);
    PlannedMapChange other = PlanServerJoin(left, kThree[0], {kThree[0]},
                                            Context(TrainingMode::kSync, replication, true, 300));
    CHECK(Primaries(other.map) == std::map<std::string, int>{{"ps-0", 6}});
    for (const ShardAssignment& shard : other.map.shards())
      CHECK(shard.restore() == SHARD_RESTORE_AT_STEP);
    CHECK(other.map.rewind_step() == 300);
    CHECK(other.losing_servers.empty());  // nothing is handed off by a dead server
  }
  // A join with nothing left on the joined slot rolls nothing back.
  ShardMap two = PlaceShards(Flat(600), 6, 0, {kThree[0], kThree[1]}, 1);
  PlannedMapChange joined =
      PlanServerJoin(two, kThree[2], kThree, Context(TrainingMode::kSync, 1, true, 300));
  CHECK(joined.map.rewind_epoch() == 0);
  for (const ShardAssignment& shard : joined.map.shards())
    CHECK(shard.restore() != SHARD_RESTORE_AT_STEP);
}

}  // namespace
}  // namespace paramserver
