// ShardHost over a real service object and real checkpoint files, without a gRPC
// server: a map's shards built from the initial values, the same map again, a
// conflicting and an older one, a forged one, a shard handed off to its new owner's
// checkpoint and restored there with its updates, calls routed with an older map to a
// shard kept as it was, and a rejoining server's drop.
#include "ps/shard_host.h"

#include <memory>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "common/security/shard_map_signature.h"
#include "common/testing/temp_dir.h"
#include "common/testing/test_credentials.h"

namespace paramserver {
namespace {

constexpr int64_t kParameters = 6;

HostedModel SixValues() {
  HostedModel model;
  model.initial_parameters = {1, 2, 3, 4, 5, 6};
  model.dense_parameters = kParameters;
  return model;
}

ClusterSpec AsyncSpec() {
  ClusterSpec spec;
  spec.training.mode = TrainingMode::kAsync;
  spec.checkpoint.every_steps = 1000;
  return spec;
}

void Assign(ShardMap* map, int shard_id, const std::string& server, ParameterRange range,
            ShardRestore restore = SHARD_RESTORE_NONE) {
  ShardAssignment* shard = map->add_shards();
  shard->set_shard_id(shard_id);
  shard->set_begin(range.begin);
  shard->set_end(range.end);
  shard->set_server_name(server);
  shard->set_restore(restore);
}

// One server's host over its own service, signed maps checked against the scheduler's
// key; with checkpoints in `checkpoint_dir` when it is not empty.
class HostedServer {
 public:
  HostedServer(const std::string& name, const MapSigningKey& scheduler_key,
               const std::string& checkpoint_dir = "")
      : service_(credentials_.verifier(), absl::Seconds(1), nullptr, nullptr) {
    known_nodes_.SetScheduler("scheduler-token-digest", scheduler_key.public_key());
    if (!checkpoint_dir.empty())
      checkpoints_ = std::make_unique<CheckpointWriter>(checkpoint_dir, 3);
    ClusterSpec spec = AsyncSpec();
    spec.checkpoint.dir = checkpoint_dir;
    ShardHostParts parts;
    parts.service = &service_;
    parts.checkpoints = checkpoints_.get();
    parts.known_nodes = &known_nodes_;
    parts.credentials = std::make_shared<CallCredentials>(TestCredentials::kClusterToken);
    parts.refusals = std::make_shared<GradientRefusalCounts>();
    host_ = std::make_unique<ShardHost>(spec, name, /*num_workers=*/1, SixValues(), parts);
  }

  ShardHost& host() { return *host_; }
  ParameterServerServiceImpl& service() { return service_; }
  // The values shard `id` serves now (async: no wait).
  std::vector<float> Values(int id) {
    const ShardState state = service_.shards().at(id).shard->Snapshot();
    return state.values;
  }

 private:
  TestCredentials credentials_;
  KnownNodeTable known_nodes_;
  ParameterServerServiceImpl service_;
  std::unique_ptr<CheckpointWriter> checkpoints_;
  std::unique_ptr<ShardHost> host_;
};

std::unique_ptr<MapSigningKey> SchedulerKey() {
  absl::StatusOr<std::unique_ptr<MapSigningKey>> key = MapSigningKey::Generate();
  REQUIRE(key.ok());
  return *std::move(key);
}

// Epoch 1: shard 0 on ps-0, shard 1 on ps-1.
ShardMap OneShardEach(const MapSigningKey& key) {
  ShardMap map;
  map.set_epoch(1);
  Assign(&map, 0, "ps-0", {0, 3});
  Assign(&map, 1, "ps-1", {3, 6});
  key.Sign(&map);
  return map;
}

// Epoch 2: shard 0 handed off from ps-0 to ps-1, shard 1 stays there.
ShardMap BothOnPs1(const MapSigningKey& key) {
  ShardMap map;
  map.set_epoch(2);
  Assign(&map, 0, "ps-1", {0, 3}, SHARD_RESTORE_HANDOFF);
  Assign(&map, 1, "ps-1", {3, 6});
  key.Sign(&map);
  return map;
}

ShardMap TwoShardsOn(const std::string& server, int64_t epoch, const MapSigningKey& key) {
  ShardMap map;
  map.set_epoch(epoch);
  Assign(&map, 0, server, {0, 3});
  Assign(&map, 1, server, {3, 6});
  key.Sign(&map);
  return map;
}

TEST_CASE("a map's shards are built from the model's initial values and served at its epoch") {
  const std::unique_ptr<MapSigningKey> key = SchedulerKey();
  HostedServer server("ps-0", *key);
  absl::StatusOr<int64_t> served = server.host().ApplyShardMap(TwoShardsOn("ps-0", 1, *key));
  REQUIRE(served.ok());
  CHECK(*served == 1);
  CHECK(server.service().epoch() == 1);
  const std::map<int, ServedShard> shards = server.service().shards();
  REQUIRE(shards.size() == 2);
  CHECK(shards.at(0).primary);
  CHECK(shards.at(1).primary_name == "ps-0");
  CHECK(server.Values(0) == std::vector<float>{1, 2, 3});
  CHECK(server.Values(1) == std::vector<float>{4, 5, 6});
}

TEST_CASE(
    "the served map again is a no-op; another of its epoch is a conflict, counted; an "
    "older one or a forged one is refused") {
  const std::unique_ptr<MapSigningKey> key = SchedulerKey();
  HostedServer server("ps-0", *key);
  const ShardMap map = TwoShardsOn("ps-0", 2, *key);
  REQUIRE(server.host().ApplyShardMap(map).ok());
  const std::shared_ptr<ParameterShard> first = server.service().shards().at(0).shard;
  REQUIRE(server.host().ApplyShardMap(map).ok());
  CHECK(server.service().shards().at(0).shard == first);  // the same object, untouched

  ShardMap other;
  other.set_epoch(2);
  Assign(&other, 0, "ps-0", {0, 6});
  key->Sign(&other);
  const absl::Status conflict = server.host().ApplyShardMap(other).status();
  CHECK(absl::IsAborted(conflict));
  CHECK(server.host().conflicts().count == 1);
  CHECK(server.host().conflicts().last == std::string(conflict.message()));
  CHECK(server.service().shards().size() == 2);  // the map served stays

  CHECK(absl::IsFailedPrecondition(
      server.host().ApplyShardMap(TwoShardsOn("ps-0", 1, *key)).status()));
  ShardMap forged = TwoShardsOn("ps-0", 3, *key);
  forged.mutable_shards(0)->set_end(2);  // changed after signing
  forged.mutable_shards(1)->set_begin(2);
  CHECK(absl::IsPermissionDenied(server.host().ApplyShardMap(forged).status()));
  CHECK(server.service().epoch() == 2);
}

TEST_CASE(
    "a shard moved away is handed off to a checkpoint, and its new owner restores it "
    "with every update") {
  const std::unique_ptr<MapSigningKey> key = SchedulerKey();
  TempDir checkpoints;
  HostedServer old_owner("ps-0", *key, checkpoints.path());
  HostedServer new_owner("ps-1", *key, checkpoints.path());
  const ShardMap first = OneShardEach(*key);
  REQUIRE(old_owner.host().ApplyShardMap(first).ok());
  REQUIRE(new_owner.host().ApplyShardMap(first).ok());
  // One update on shard 0 at its old owner.
  REQUIRE(old_owner.service().shards().at(0).shard->Push(0, 0, {1.0f, 1.0f, 1.0f}).ok());
  const std::vector<float> updated = old_owner.Values(0);
  REQUIRE(updated != std::vector<float>{1, 2, 3});

  const ShardMap second = BothOnPs1(*key);
  REQUIRE(old_owner.host().ApplyShardMap(second).ok());
  CHECK(old_owner.service().shards().empty());
  REQUIRE(new_owner.host().ApplyShardMap(second).ok());
  CHECK(new_owner.service().shards().size() == 2);
  CHECK(new_owner.Values(0) == updated);  // nothing lost
  CHECK(new_owner.service().shards().at(0).shard->counters().applied_updates == 1);
}

TEST_CASE(
    "a primary kept as it was takes calls routed with the older map; a shard that came from "
    "elsewhere, a change of the live workers or a rewind ends that") {
  const std::unique_ptr<MapSigningKey> key = SchedulerKey();
  TempDir checkpoints;
  HostedServer old_owner("ps-0", *key, checkpoints.path());
  HostedServer server("ps-1", *key, checkpoints.path());
  auto routed_since = [&](int id) { return server.service().shards().at(id).routed_since; };
  const ShardMap first = OneShardEach(*key);
  REQUIRE(old_owner.host().ApplyShardMap(first).ok());
  REQUIRE(server.host().ApplyShardMap(first).ok());
  CHECK(routed_since(1) == 1);

  const ShardMap second = BothOnPs1(*key);
  REQUIRE(old_owner.host().ApplyShardMap(second).ok());
  REQUIRE(server.host().ApplyShardMap(second).ok());
  CHECK(routed_since(1) == 1);  // the same object, primary here all along
  CHECK(routed_since(0) == 2);  // handed over at epoch 2: a call routed to ps-0 is stale

  ShardMap third = second;
  third.set_epoch(3);
  third.mutable_shards(0)->set_restore(SHARD_RESTORE_NONE);
  third.add_active_workers(false);  // the job's one worker was declared dead
  key->Sign(&third);
  REQUIRE(server.host().ApplyShardMap(third).ok());
  CHECK(routed_since(0) == 3);
  CHECK(routed_since(1) == 3);

  ShardMap fourth = third;
  fourth.set_epoch(4);
  key->Sign(&fourth);
  REQUIRE(server.host().ApplyShardMap(fourth).ok());
  CHECK(routed_since(1) == 3);

  ShardMap rewound = fourth;
  rewound.set_epoch(5);
  rewound.set_rewind_epoch(5);
  key->Sign(&rewound);
  REQUIRE(server.host().ApplyShardMap(rewound).ok());
  CHECK(routed_since(0) == 5);
  CHECK(routed_since(1) == 5);

  // A rewind in a map this server skipped (it caught up from a heartbeat) ends it too.
  ShardMap after_skipped = rewound;
  after_skipped.set_epoch(7);
  after_skipped.set_rewind_epoch(6);
  key->Sign(&after_skipped);
  REQUIRE(server.host().ApplyShardMap(after_skipped).ok());
  CHECK(routed_since(0) == 7);
  CHECK(routed_since(1) == 7);
}

TEST_CASE("a dropped server serves nothing, and once joined takes no fresh shard") {
  const std::unique_ptr<MapSigningKey> key = SchedulerKey();
  HostedServer server("ps-0", *key);
  REQUIRE(server.host().ApplyShardMap(TwoShardsOn("ps-0", 1, *key)).ok());
  server.host().MarkJoined();
  server.host().DropAll();
  CHECK(server.service().shards().empty());
  CHECK(server.service().epoch() == 0);
  // Fresh shards for a server that was a member: refused (without checkpoints it cannot
  // restore any).
  const absl::Status refused = server.host().ApplyShardMap(TwoShardsOn("ps-0", 2, *key)).status();
  CHECK(absl::IsFailedPrecondition(refused));
  CHECK(absl::StrContains(refused.message(), "with no state to restore"));
  CHECK(server.service().shards().empty());
}

TEST_CASE("a server not yet joined takes fresh shards after a drop") {
  const std::unique_ptr<MapSigningKey> key = SchedulerKey();
  HostedServer server("ps-0", *key);
  REQUIRE(server.host().ApplyShardMap(TwoShardsOn("ps-0", 1, *key)).ok());
  server.host().DropAll();  // before MarkJoined: not a rejoin
  REQUIRE(server.host().ApplyShardMap(TwoShardsOn("ps-0", 2, *key)).ok());
  CHECK(server.service().shards().size() == 2);
  CHECK(server.Values(0) == std::vector<float>{1, 2, 3});
}

}  // namespace
}  // namespace paramserver
