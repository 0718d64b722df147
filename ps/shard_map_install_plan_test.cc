// PlanShardMapInstall on its own: which shards a server keeps, builds, restores, copies,
// hands off and closes when a map arrives, and the maps it refuses. No gRPC, no files.
#include "ps/shard_map_install_plan.h"

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

constexpr int64_t kModelSize = 100;

ShardAssignment* Assign(ShardMap* map, int shard_id, const std::string& primary,
                        std::vector<std::string> backups = {},
                        ShardRestore restore = SHARD_RESTORE_NONE, ParameterRange range = {}) {
  if (range.size() == 0) range = {shard_id * 10, shard_id * 10 + 10};
  ShardAssignment* assignment = map->add_shards();
  assignment->set_shard_id(shard_id);
  assignment->set_begin(range.begin);
  assignment->set_end(range.end);
  assignment->set_server_name(primary);
  assignment->set_restore(restore);
  for (const std::string& backup : backups) assignment->add_backups()->set_server_name(backup);
  return assignment;
}

ShardInstallContext Me(bool checkpoints = true) {
  ShardInstallContext context;
  context.node_name = "ps-0";
  context.total_parameters = kModelSize;
  context.checkpoints_enabled = checkpoints;
  return context;
}

HeldShard Primary(int shard_id, bool with_replicator = false) {
  return {{shard_id * 10, shard_id * 10 + 10}, true, "ps-0", with_replicator};
}

HeldShard BackupOf(int shard_id, const std::string& primary) {
  return {{shard_id * 10, shard_id * 10 + 10}, false, primary, false};
}

std::vector<int> PrimaryIds(const ShardInstallPlan& plan) {
  std::vector<int> ids;
  for (const auto& primary : plan.primaries) ids.push_back(primary.assignment->shard_id());
  return ids;
}

std::vector<int> CopyIds(const ShardInstallPlan& plan) {
  std::vector<int> ids;
  for (const ShardAssignment* assignment : plan.backups_to_copy)
    ids.push_back(assignment->shard_id());
  return ids;
}

TEST_CASE("the first map: every shard of this server is built from the initial values") {
  ShardMap map;
  map.set_epoch(1);
  Assign(&map, 0, "ps-0", {"ps-1"});
  Assign(&map, 1, "ps-1", {"ps-0"});
  Assign(&map, 2, "ps-1");
  absl::StatusOr<ShardInstallPlan> plan = PlanShardMapInstall({}, map, Me());
  REQUIRE(plan.ok());
  CHECK(plan->epoch == 1);
  CHECK(PrimaryIds(*plan) == std::vector<int>{0});
  CHECK(plan->primaries[0].source == ShardSource::kInitialValues);
  CHECK_FALSE(plan->primaries[0].keep_replicator);
  CHECK(CopyIds(*plan) == std::vector<int>{1});  // a backup starts with its primary's state
  CHECK(plan->kept_backups.empty());
  CHECK(plan->held.empty());
  CHECK(plan->retired_replicators.empty());
}

TEST_CASE("the same assignment again keeps every shard and replicator as they are") {
  ShardMap map;
  map.set_epoch(2);
  Assign(&map, 0, "ps-0", {"ps-1"});
  Assign(&map, 1, "ps-1", {"ps-0"});
  const std::map<int, HeldShard> held = {{0, Primary(0, true)}, {1, BackupOf(1, "ps-1")}};
  absl::StatusOr<ShardInstallPlan> plan = PlanShardMapInstall(held, map, Me());
  REQUIRE(plan.ok());
  CHECK(plan->primaries[0].source == ShardSource::kKeepHeld);
  CHECK(plan->primaries[0].keep_replicator);
  CHECK(plan->kept_backups == std::vector<int>{1});
  CHECK(plan->backups_to_copy.empty());
  CHECK(plan->held.at(0) == HeldShardFate::kKeep);
  CHECK(plan->held.at(1) == HeldShardFate::kKeep);
  CHECK(plan->retired_replicators.empty());
}

TEST_CASE("a backup whose primary died is promoted as the same object, with a new replicator") {
  ShardMap map;
  map.set_epoch(3);
  Assign(&map, 1, "ps-0", {"ps-2"});
  const std::map<int, HeldShard> held = {{1, BackupOf(1, "ps-1")}};
  absl::StatusOr<ShardInstallPlan> plan = PlanShardMapInstall(held, map, Me());
  REQUIRE(plan.ok());
  CHECK(plan->primaries[0].source == ShardSource::kKeepHeld);
  CHECK_FALSE(plan->primaries[0].keep_replicator);  // it had none as a backup
  CHECK(plan->held.at(1) == HeldShardFate::kKeep);
}

TEST_CASE("a primary that loses its backups retires its replicator") {
  ShardMap map;
  map.set_epoch(3);
  Assign(&map, 0, "ps-0");
  absl::StatusOr<ShardInstallPlan> plan = PlanShardMapInstall({{0, Primary(0, true)}}, map, Me());
  REQUIRE(plan.ok());
  CHECK(plan->primaries[0].source == ShardSource::kKeepHeld);
  CHECK_FALSE(plan->primaries[0].keep_replicator);
  CHECK(plan->retired_replicators == std::vector<int>{0});
}

TEST_CASE("a primary moved to another server is handed off, or closed without checkpoints") {
  ShardMap map;
  map.set_epoch(4);
  Assign(&map, 0, "ps-1", {}, SHARD_RESTORE_HANDOFF);
  const std::map<int, HeldShard> held = {{0, Primary(0, true)}};
  absl::StatusOr<ShardInstallPlan> plan = PlanShardMapInstall(held, map, Me());
  REQUIRE(plan.ok());
  CHECK(plan->primaries.empty());
  CHECK(plan->held.at(0) == HeldShardFate::kHandOff);
  CHECK(plan->retired_replicators == std::vector<int>{0});
  plan = PlanShardMapInstall(held, map, Me(/*checkpoints=*/false));
  REQUIRE(plan.ok());
  CHECK(plan->held.at(0) == HeldShardFate::kClose);
}

TEST_CASE(
    "a primary handed to its backup, this server its backup now, is handed over and kept; "
    "restored, re-cut or without backups before, it is copied") {
  ShardMap map;
  map.set_epoch(6);
  Assign(&map, 0, "ps-1", {"ps-0"});                                // switched to its backup
  Assign(&map, 1, "ps-1", {"ps-0"}, SHARD_RESTORE_AT_STEP);         // rolled back
  Assign(&map, 2, "ps-1", {"ps-0"}, SHARD_RESTORE_NONE, {20, 25});  // re-cut
  Assign(&map, 3, "ps-1", {"ps-0"});                                // had no backup here
  const std::map<int, HeldShard> held = {
      {0, Primary(0, true)}, {1, Primary(1, true)}, {2, Primary(2, true)}, {3, Primary(3)}};
  absl::StatusOr<ShardInstallPlan> plan = PlanShardMapInstall(held, map, Me());
  REQUIRE(plan.ok());
  REQUIRE(plan->handovers.size() == 1);
  CHECK(plan->handovers[0]->shard_id() == 0);
  CHECK(plan->held.at(0) == HeldShardFate::kKeep);
  CHECK(CopyIds(*plan) == std::vector<int>{1, 2, 3});
  for (int id : {1, 2, 3}) CHECK(plan->held.at(id) == HeldShardFate::kClose);
  CHECK(plan->retired_replicators == std::vector<int>{0, 1, 2});
}

TEST_CASE("a backup is copied afresh when its primary, range or state changes") {
  ShardMap map;
  map.set_epoch(5);
  Assign(&map, 1, "ps-2", {"ps-0"});                                // a new primary
  Assign(&map, 2, "ps-1", {"ps-0"}, SHARD_RESTORE_AT_STEP);         // rolled back
  Assign(&map, 3, "ps-1", {"ps-0"}, SHARD_RESTORE_NONE, {30, 35});  // re-cut
  const std::map<int, HeldShard> held = {
      {1, BackupOf(1, "ps-1")}, {2, BackupOf(2, "ps-1")}, {3, BackupOf(3, "ps-1")}};
  absl::StatusOr<ShardInstallPlan> plan = PlanShardMapInstall(held, map, Me());
  REQUIRE(plan.ok());
  CHECK(CopyIds(*plan) == std::vector<int>{1, 2, 3});
  CHECK(plan->kept_backups.empty());
  for (int id : {1, 2, 3}) CHECK(plan->held.at(id) == HeldShardFate::kClose);  // replaced
}

TEST_CASE("a primary whose range changed is built afresh; restores say from where") {
  ShardMap map;
  map.set_epoch(6);
  Assign(&map, 0, "ps-0", {}, SHARD_RESTORE_NONE, {0, 5});
  Assign(&map, 1, "ps-0", {}, SHARD_RESTORE_AT_STEP);
  Assign(&map, 2, "ps-0", {}, SHARD_RESTORE_NEWEST);
  Assign(&map, 3, "ps-0", {}, SHARD_RESTORE_HANDOFF);
  const std::map<int, HeldShard> held = {{0, Primary(0)}, {1, Primary(1)}};
  absl::StatusOr<ShardInstallPlan> plan = PlanShardMapInstall(held, map, Me());
  REQUIRE(plan.ok());
  CHECK(plan->primaries[0].source == ShardSource::kInitialValues);
  CHECK(plan->primaries[1].source == ShardSource::kRestoreAtStep);
  CHECK(plan->primaries[2].source == ShardSource::kRestoreNewest);
  CHECK(plan->primaries[3].source == ShardSource::kRestoreHandoff);
  CHECK(plan->held.at(0) == HeldShardFate::kClose);  // replaced by the re-cut shard
  CHECK(plan->held.at(1) == HeldShardFate::kClose);  // replaced by the restored one
}

TEST_CASE("an embedding shard held is kept when the map gives the same bucket, else replaced") {
  ShardInstallContext context = Me();
  context.embedding_tables = 3;
  ShardMap map;
  map.set_epoch(5);
  ShardAssignment* rows = Assign(&map, 8, "ps-0", {}, SHARD_RESTORE_NONE, {0, 0});
  rows->set_kind(SHARD_KIND_EMBEDDING_ROWS);
  rows->set_begin(0);
  rows->set_end(0);
  rows->set_embedding_bucket(2);
  rows->set_embedding_buckets(4);
  HeldShard held;
  held.range = {0, 0};
  held.embedding_bucket = 2;
  held.embedding_buckets = 4;
  absl::StatusOr<ShardInstallPlan> plan = PlanShardMapInstall({{8, held}}, map, context);
  REQUIRE(plan.ok());
  REQUIRE(plan->primaries.size() == 1);
  CHECK(plan->primaries[0].source == ShardSource::kKeepHeld);
  held.embedding_buckets = 5;  // another cut of the key space: not the same shard
  plan = PlanShardMapInstall({{8, held}}, map, context);
  REQUIRE(plan.ok());
  CHECK(plan->primaries[0].source == ShardSource::kInitialValues);
  CHECK(plan->held.at(8) == HeldShardFate::kClose);
}

TEST_CASE("maps this server cannot serve are refused, naming the shard") {
  ShardMap map;
  map.set_epoch(7);
  SECTION("a range outside the model") {
    Assign(&map, 9, "ps-0", {}, SHARD_RESTORE_NONE, {90, 110});
    absl::StatusOr<ShardInstallPlan> plan = PlanShardMapInstall({}, map, Me());
    CHECK(plan.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(plan.status().message().find("shard 9 = [90, 110)") != absl::string_view::npos);
  }
  SECTION("embedding rows for a model without tables, or a bucket that is none") {
    ShardAssignment* rows = Assign(&map, 3, "ps-0", {}, SHARD_RESTORE_NONE, {0, 0});
    rows->set_kind(SHARD_KIND_EMBEDDING_ROWS);
    rows->set_begin(0);
    rows->set_end(0);
    rows->set_embedding_bucket(1);
    rows->set_embedding_buckets(4);
    absl::StatusOr<ShardInstallPlan> plan = PlanShardMapInstall({}, map, Me());
    CHECK(plan.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(plan.status().message() ==
          "shard 3 holds embedding rows, but this server's model has no embedding tables: do the "
          "scheduler and this server use the same config?");
    ShardInstallContext with_tables = Me();
    with_tables.embedding_tables = 2;
    REQUIRE(PlanShardMapInstall({}, map, with_tables).ok());
    rows->set_embedding_bucket(4);
    CHECK(PlanShardMapInstall({}, map, with_tables).status().message() ==
          "the scheduler assigned embedding shard 3 bucket 4 of 4 with range [0, 0): not a "
          "bucket of the tables");
  }
  SECTION("a restore without checkpoint.dir") {
    Assign(&map, 4, "ps-0", {}, SHARD_RESTORE_AT_STEP);
    absl::StatusOr<ShardInstallPlan> plan = PlanShardMapInstall({}, map, Me(false));
    CHECK(plan.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(plan.status().message().find("checkpoint.dir is not set") != absl::string_view::npos);
  }
  SECTION("a fresh shard for a server that rejoined after being declared dead") {
    Assign(&map, 0, "ps-0", {}, SHARD_RESTORE_NEWEST);
    Assign(&map, 5, "ps-0");
    ShardInstallContext context = Me();
    context.rejoining = true;
    absl::StatusOr<ShardInstallPlan> plan = PlanShardMapInstall({}, map, context);
    CHECK(plan.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(plan.status().message() == "epoch 7 gives us shard 5 with no state to restore");
  }
}

}  // namespace
}  // namespace paramserver
