#include "scheduler/shard_placement.h"

#include <map>
#include <set>

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

// A model of `parameters` weights in one tensor.
ModelLayout Flat(int64_t parameters) { return *ModelLayout::Create({{"weights", {parameters}}}); }

TEST_CASE("shards cover the parameters and spread evenly over the servers") {
  const std::vector<ServerEndpoint> servers = {{"ps-0", "h:1"}, {"ps-1", "h:2"}, {"ps-2", "h:3"}};
  ShardMap map = PlaceShards(Flat(101770), 8, 0, servers, 1);
  CHECK(map.epoch() == 1);
  REQUIRE(map.shards_size() == 8);
  std::map<std::string, int> per_server;
  int64_t next = 0;
  for (const ShardAssignment& shard : map.shards()) {
    CHECK(shard.begin() == next);
    next = shard.end();
    ++per_server[shard.server_name()];
    CHECK(shard.server_address() == servers[shard.shard_id() % 3].address);
  }
  CHECK(next == 101770);
  CHECK(per_server == std::map<std::string, int>{{"ps-0", 3}, {"ps-1", 3}, {"ps-2", 2}});
}

const std::vector<ServerEndpoint> kThree = {{"ps-0", "h:1"}, {"ps-1", "h:2"}, {"ps-2", "h:3"}};

TEST_CASE("a model with tables gets its embedding shards after the dense ones, dealt on") {
  const ModelLayout layout =
      *ModelLayout::Create({{"fc1.weight", {10, 4}}}, {{"C1", 8}, {"C2", 8}});
  ShardMap map = PlaceShards(layout, 2, 4, kThree, 1);
  REQUIRE(map.shards_size() == 6);
  for (int b = 0; b < 4; ++b) {
    const ShardAssignment& rows = map.shards(2 + b);
    CHECK(rows.shard_id() == 2 + b);
    CHECK(rows.kind() == SHARD_KIND_EMBEDDING_ROWS);
    CHECK(rows.embedding_bucket() == b);
    CHECK(rows.embedding_buckets() == 4);
    CHECK(rows.begin() == 0);
    CHECK(rows.end() == 0);
    CHECK(rows.server_name() == kThree[(2 + b) % 3].name);
  }
  CHECK(map.shards(1).end() == 40);
  // Without tables, embedding_shards places nothing.
  CHECK(PlaceShards(Flat(100), 2, 4, kThree, 1).shards_size() == 2);
}

// Every shard's copies are on distinct servers and number `copies`.
void ExpectDistinctCopies(const ShardMap& map, int copies) {
  for (const ShardAssignment& shard : map.shards()) {
    std::set<std::string> holders = {shard.server_name()};
    for (const ShardReplica& backup : shard.backups()) holders.insert(backup.server_name());
    INFO("shard " << shard.shard_id());
    CHECK(static_cast<int>(holders.size()) == 1 + shard.backups_size());
    CHECK(static_cast<int>(holders.size()) == copies);
  }
}

std::map<std::string, int> Copies(const ShardMap& map) {
  std::map<std::string, int> copies;
  for (const ShardAssignment& shard : map.shards()) {
    ++copies[shard.server_name()];
    for (const ShardReplica& backup : shard.backups()) ++copies[backup.server_name()];
  }
  return copies;
}

TEST_CASE(
    "backups sit on other servers than their primary, evenly spread, and never exceed the "
    "servers") {
  ShardMap map = PlaceShards(Flat(1000), 6, 0, kThree, 1);
  AssignBackups(&map, kThree, 2);
  ExpectDistinctCopies(map, 2);
  CHECK(Copies(map) == std::map<std::string, int>{{"ps-0", 4}, {"ps-1", 4}, {"ps-2", 4}});
  CHECK(map.shards(0).backups(0).server_name() == "ps-1");
  CHECK(map.shards(0).backups(0).server_address() == "h:2");
  AssignBackups(&map, kThree, 5);  // capped at 3 copies
  ExpectDistinctCopies(map, 3);
  AssignBackups(&map, kThree, 1);
  ExpectDistinctCopies(map, 1);
}

TEST_CASE(
    "removing a primary promotes its backup and re-replicates on a server that lacks the shard") {
  ShardMap map = PlaceShards(Flat(1000), 6, 0, kThree, 1);
  AssignBackups(&map, kThree, 2);
  const std::vector<ServerEndpoint> live = {kThree[1], kThree[2]};
  const ServerRemoval removal = RemoveServer(&map, "ps-0", live, 2);
  // ps-0 was primary of shards 0 and 3 (backups on ps-1) and backed up 2 and 5.
  CHECK(removal.promoted == std::vector<int>{0, 3});
  CHECK(removal.orphaned.empty());
  CHECK(removal.new_backups == std::vector<int>{0, 2, 3, 5});
  CHECK(map.shards(0).server_name() == "ps-1");
  CHECK(map.shards(0).server_address() == "h:2");
  ExpectDistinctCopies(map, 2);
  for (const auto& [server, count] : Copies(map)) CHECK(server != "ps-0");
  CHECK(removal.summary.find("shard 0: backup ps-1 promoted") != std::string::npos);
}

TEST_CASE(
    "a failing server is promoted only where no other backup holds the shard, and takes no new "
    "role while others can") {
  const std::vector<ServerEndpoint> four = {kThree[0], kThree[1], kThree[2], {"ps-3", "h:4"}};
  ShardMap map = PlaceShards(Flat(1000), 4, 0, four, 1);
  AssignBackups(&map, four, 3);  // shard 0: ps-0, backups ps-1 and ps-2
  const std::vector<ServerEndpoint> live = {four[1], four[2], four[3]};
  const ServerRemoval removal = RemoveServer(&map, "ps-0", live, 3, {}, {"ps-1"});
  CHECK(removal.promoted == std::vector<int>{0});
  CHECK(map.shards(0).server_name() == "ps-2");
  CHECK(removal.summary.find("shard 0: backup ps-2 promoted (ps-1, not heard from lately, "
                             "passed over)") != std::string::npos);
  // Shard 0 kept ps-1 as a backup and gained ps-3; shard 2 (ps-2, backup ps-3 left) can
  // gain a third copy only on ps-1, and does.
  ExpectDistinctCopies(map, 3);
  CHECK(map.shards(0).backups(1).server_name() == "ps-3");
  CHECK(map.shards(2).backups(1).server_name() == "ps-1");

  // New backups go to servers heard from lately, though the failing one holds fewer.
  ShardMap crowded = PlaceShards(Flat(1000), 4, 0, {kThree[0]}, 1);
  CHECK(TopUpBackups(&crowded, kThree, 2, {"ps-1"}) == std::vector<int>{0, 1, 2, 3});
  for (const ShardAssignment& shard : crowded.shards())
    CHECK(shard.backups(0).server_name() == "ps-2");
  CHECK(TopUpBackups(&crowded, kThree, 3, {"ps-1"}) == std::vector<int>{0, 1, 2, 3});
  for (const ShardAssignment& shard : crowded.shards())
    CHECK(shard.backups(1).server_name() == "ps-1");

  // The only backup that holds the shard is on the failing server: it is promoted.
  ShardMap only = PlaceShards(Flat(1000), 3, 0, kThree, 1);
  AssignBackups(&only, kThree, 2);  // shard 0: ps-0, backup ps-1
  const ServerRemoval fallback =
      RemoveServer(&only, "ps-0", {kThree[1], kThree[2]}, 2, {}, {"ps-1"});
  CHECK(fallback.promoted == std::vector<int>{0});
  CHECK(only.shards(0).server_name() == "ps-1");
  CHECK(fallback.summary.find("passed over") == std::string::npos);

  // Without backups, an orphaned shard goes to a server heard from lately (ps-0 would
  // win the tie with ps-1 otherwise); with only failing servers left, to one of them.
  ShardMap bare = PlaceShards(Flat(1000), 3, 0, kThree, 1);
  const ServerRemoval moved = RemoveServer(&bare, "ps-2", {kThree[0], kThree[1]}, 1, {}, {"ps-0"});
  CHECK(moved.orphaned == std::vector<int>{2});
  CHECK(bare.shards(2).server_name() == "ps-1");
  ShardMap last = PlaceShards(Flat(1000), 2, 0, {kThree[0], kThree[1]}, 1);
  const ServerRemoval onto_failing = RemoveServer(&last, "ps-1", {kThree[0]}, 1, {}, {"ps-0"});
  CHECK(onto_failing.orphaned == std::vector<int>{1});
  CHECK(last.shards(1).server_name() == "ps-0");
}

TEST_CASE(
    "without backups, a removed server's shards are orphaned onto the server with the fewest "
    "primaries") {
  ShardMap map = PlaceShards(Flat(1000), 6, 0, kThree, 1);
  AssignBackups(&map, kThree, 1);
  const ServerRemoval removal = RemoveServer(&map, "ps-2", {kThree[0], kThree[1]}, 1);
  CHECK(removal.promoted.empty());
  CHECK(removal.orphaned == std::vector<int>{2, 5});
  CHECK(map.shards(2).server_name() == "ps-0");
  CHECK(map.shards(5).server_name() == "ps-1");
  ExpectDistinctCopies(map, 1);
}

TEST_CASE("with one server left, shards keep their primary and have no backup to add") {
  ShardMap map = PlaceShards(Flat(1000), 4, 0, {kThree[0], kThree[1]}, 1);
  AssignBackups(&map, {kThree[0], kThree[1]}, 2);
  const ServerRemoval removal = RemoveServer(&map, "ps-1", {kThree[0]}, 2);
  CHECK(removal.orphaned.empty());
  CHECK(removal.new_backups.empty());
  for (const ShardAssignment& shard : map.shards()) CHECK(shard.server_name() == "ps-0");
  ExpectDistinctCopies(map, 1);
  // A server joining again brings the shards back to two copies.
  CHECK(TopUpBackups(&map, {kThree[0], kThree[1]}, 2) == std::vector<int>{0, 1, 2, 3});
  ExpectDistinctCopies(map, 2);
}

TEST_CASE("a joining server takes backup roles from the busiest servers up to its fair share") {
  ShardMap map = PlaceShards(Flat(1000), 6, 0, {kThree[0], kThree[1]}, 1);
  AssignBackups(&map, {kThree[0], kThree[1]}, 2);
  const std::vector<int> moved = GiveBackupsTo(&map, "ps-2", kThree);
  CHECK(moved.size() == 4);  // 12 copies over 3 servers: 4 each
  CHECK(Copies(map) == std::map<std::string, int>{{"ps-0", 4}, {"ps-1", 4}, {"ps-2", 4}});
  ExpectDistinctCopies(map, 2);
}

}  // namespace
}  // namespace paramserver
