// Where each shard lives: an even spread of shards over servers.
#ifndef PARAMSERVER_SCHEDULER_SHARD_PLACEMENT_H_
#define PARAMSERVER_SCHEDULER_SHARD_PLACEMENT_H_

#include <string>
#include <vector>

#include "proto/scheduler.pb.h"

namespace paramserver {

struct ServerEndpoint {
  std::string name;
  std::string address;
};

// Cuts [0, total_parameters) into `shards` near-equal ranges and deals them to
// `servers` round-robin (shard i -> servers[i % S]), so shard counts per server differ
// by at most one. REQUIRES: servers non-empty, 1 <= shards <= total_parameters.
ShardMap PlaceShards(int64_t total_parameters, int shards, const std::vector<ServerEndpoint>& servers,
                     int64_t epoch);

}  // namespace paramserver

#endif  // PARAMSERVER_SCHEDULER_SHARD_PLACEMENT_H_
