#include "scheduler/shard_placement.h"

#include <map>

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

TEST_CASE("shards cover the parameters and spread evenly over the servers") {
  const std::vector<ServerEndpoint> servers = {{"ps-0", "h:1"}, {"ps-1", "h:2"}, {"ps-2", "h:3"}};
  ShardMap map = PlaceShards(101770, 8, servers, 1);
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

}  // namespace
}  // namespace paramserver
