#include "scheduler/shard_placement.h"

#include "common/shard_layout.h"

namespace paramserver {

ShardMap PlaceShards(int64_t total_parameters, int shards, const std::vector<ServerEndpoint>& servers,
                     int64_t epoch) {
  ShardMap map;
  map.set_epoch(epoch);
  const std::vector<ParameterRange> ranges = SplitIntoShards(total_parameters, shards);
  for (int i = 0; i < shards; ++i) {
    const ServerEndpoint& server = servers[i % servers.size()];
    ShardAssignment* assignment = map.add_shards();
    assignment->set_shard_id(i);
    assignment->set_begin(ranges[i].begin);
    assignment->set_end(ranges[i].end);
    assignment->set_server_name(server.name);
    assignment->set_server_address(server.address);
  }
  return map;
}

}  // namespace paramserver
