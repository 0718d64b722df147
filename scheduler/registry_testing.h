// Helpers of the registry's tests (testonly): a small cluster's options, its nodes'
// registrations and their shard reports.
#ifndef PARAMSERVER_SCHEDULER_REGISTRY_TESTING_H_
#define PARAMSERVER_SCHEDULER_REGISTRY_TESTING_H_

#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "catch2/catch.hpp"
#include "scheduler/cluster_registry.h"

namespace paramserver {

inline const absl::Time kStart = absl::FromUnixSeconds(1000);

inline RegistryOptions Options(TrainingMode mode = TrainingMode::kSync, int servers = 2,
                               int workers = 2, int shards = 4) {
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
inline std::string TokenOf(const std::string& address) {
  return "node-token-of-" + address + std::string(32, 'x');
}

inline absl::StatusOr<RegisterResponse> Join(ClusterRegistry& registry, NodeRole role,
                                             const std::string& address,
                                             std::optional<MapChange>* change = nullptr) {
  std::optional<MapChange> ignored;
  // A retry from the same process sends the same token.
  return registry.Register(role, address, TokenOf(address), kStart,
                           change != nullptr ? change : &ignored);
}

inline void FormCluster(ClusterRegistry& registry, int servers, int workers) {
  for (int i = 0; i < servers; ++i)
    REQUIRE(Join(registry, NODE_ROLE_SERVER, "s:" + std::to_string(i)).ok());
  for (int i = 0; i < workers; ++i)
    REQUIRE(Join(registry, NODE_ROLE_WORKER, "w:" + std::to_string(i)).ok());
}

// What each server reports about its shards: applied updates and newest checkpoint.
inline void ReportShards(ClusterRegistry& registry,
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

// Every live server's heartbeat at the present map's epoch, listing each shard it backs
// up as copied (as servers do once their copies are done): backups the registry may
// promote. Sent at `at`, by every server but those `silent`.
inline void ReportBackupsCopied(ClusterRegistry& registry, absl::Time at = kStart,
                                const std::set<std::string>& silent = {}) {
  const ShardMap map = registry.View().shard_map();
  std::map<std::string, HeartbeatRequest> beats;
  for (const ShardAssignment& assignment : map.shards()) {
    for (const ShardReplica& backup : assignment.backups()) {
      HeartbeatRequest& beat = beats[backup.server_name()];
      beat.set_node_name(backup.server_name());
      beat.set_serving_epoch(map.epoch());
      ShardStatus* status = beat.add_shards();
      status->set_shard_id(assignment.shard_id());
      status->set_backup(true);
    }
  }
  for (const auto& [name, beat] : beats) {
    if (silent.count(name) == 0) REQUIRE(registry.Heartbeat(beat, at).ok());
  }
}

inline std::map<std::string, int> ShardsPerServer(const ShardMap& map) {
  std::map<std::string, int> count;
  for (const ShardAssignment& assignment : map.shards()) ++count[assignment.server_name()];
  return count;
}

}  // namespace paramserver

#endif  // PARAMSERVER_SCHEDULER_REGISTRY_TESTING_H_
