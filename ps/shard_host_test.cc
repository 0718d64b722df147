// ShardHost over a real service object and real checkpoint files, without a gRPC
// server: a map's shards built from the initial values, the same map again, a
// conflicting and an older one, a forged one, a shard handed off to its new owner's
// checkpoint and restored there with its updates, calls routed with an older map to a
// shard kept as it was, a rejoining server's drop, and a new backup's copy from a primary
// that cuts the copy off, stalls it, cancels it, sends a state that is not the shard's,
// or refuses it as asked under an older map than it serves.
#include "ps/shard_host.h"

#include <atomic>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/rpc/rpc_endpoints.h"
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
               const std::string& checkpoint_dir = "",
               absl::Duration copy_stall = absl::Seconds(10))
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
    parts.copy_stall = copy_stall;
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

// A primary (over gRPC on 127.0.0.1) whose FetchShardState answers each attempt as
// `script` says, then with the whole state: the header and part of the data, then the
// call fails (kCutOff), hangs until its caller cancels it (kStall) or is cancelled as a
// server shutting down cancels its calls (kShutDown); a refusal that names a newer epoch
// served (kMovedOn) or the copy's own (kNotPrimary), as the real service's do; or all
// of it.
class ScriptedPrimary final : public ParameterServer::Service {
 public:
  enum class Attempt { kCutOff, kStall, kShutDown, kMovedOn, kNotPrimary, kWhole };

  ScriptedPrimary(ReplicaState state, std::vector<Attempt> script)
      : state_(std::move(state)), script_(std::move(script)) {
    absl::StatusOr<RunningServer> server = StartRpcServer("127.0.0.1:0", {this});
    REQUIRE(server.ok());
    server_ = *std::move(server);
  }
  ~ScriptedPrimary() override {
    server_.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }

  std::string address() const { return absl::StrCat("127.0.0.1:", server_.port); }
  int attempts() const { return attempts_.load(); }

  grpc::Status FetchShardState(grpc::ServerContext* context, const FetchShardStateRequest* request,
                               grpc::ServerWriter<ShardStatePiece>* writer) override {
    const size_t attempt = static_cast<size_t>(attempts_++);
    const Attempt what = attempt < script_.size() ? script_[attempt] : Attempt::kWhole;
    if (what == Attempt::kMovedOn || what == Attempt::kNotPrimary) {
      const int64_t serving = request->epoch() + (what == Attempt::kMovedOn ? 1 : 0);
      context->AddTrailingMetadata(kServingEpochMetadata, absl::StrCat(serving));
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          absl::StrCat("not the primary of shard 0 at epoch ", request->epoch(),
                                       "; serving ", serving));
    }
    std::vector<ShardStatePiece> pieces;  // pieces of 4 bytes: the data in several
    REQUIRE(WriteReplicaStatePieces(state_, 4, 1 << 20, [&](const ShardStatePiece& piece) {
              pieces.push_back(piece);
              return true;
            }).ok());
    REQUIRE(pieces.size() > 2);
    const size_t sent = what == Attempt::kWhole ? pieces.size() : pieces.size() / 2;
    for (size_t i = 0; i < sent; ++i) writer->Write(pieces[i]);
    if (what == Attempt::kCutOff) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "cut off");
    if (what == Attempt::kShutDown) return grpc::Status(grpc::StatusCode::CANCELLED, "shut down");
    if (what == Attempt::kStall) {
      const absl::Time give_up = absl::Now() + absl::Seconds(20);
      while (!context->IsCancelled() && absl::Now() < give_up)
        absl::SleepFor(absl::Milliseconds(5));
      return grpc::Status(grpc::StatusCode::CANCELLED, "stalled");
    }
    return grpc::Status::OK;
  }

 private:
  const ReplicaState state_;
  const std::vector<Attempt> script_;
  std::atomic<int> attempts_{0};
  RunningServer server_;
};

// Shard 0 ([0, 3)) as its primary holds it in an async job of one worker, trained one
// step; `range` may say otherwise (a state that is not the backup's shard).
ReplicaState PrimaryState(ParameterRange range = {0, 3}) {
  ParameterShardOptions options;
  options.shard_id = 0;
  options.range = range;
  options.mode = TrainingMode::kAsync;
  options.num_workers = 1;
  ParameterShard primary(options, std::vector<float>(range.size(), 1.5f));
  REQUIRE(primary.Push(0, 0, std::vector<float>(range.size(), 0.25f)).ok());
  return primary.ExportReplicaAsStored();
}

// Epoch `epoch` (1 unless given): shard 0 on `primary`, backed up on ps-1; shard 1 on
// ps-1 alone.
ShardMap BackedUpOnPs1(const std::string& primary_address, const MapSigningKey& key,
                       int64_t epoch = 1) {
  ShardMap map;
  map.set_epoch(epoch);
  Assign(&map, 0, "ps-0", {0, 3});
  map.mutable_shards(0)->set_server_address(primary_address);
  ShardReplica* backup = map.mutable_shards(0)->add_backups();
  backup->set_server_name("ps-1");
  backup->set_server_address("127.0.0.1:1");
  Assign(&map, 1, "ps-1", {3, 6});
  key.Sign(&map);
  return map;
}

TEST_CASE(
    "a new backup's copy cut off, stalled, or cancelled by its primary is tried again until the "
    "state is whole") {
  const std::unique_ptr<MapSigningKey> key = SchedulerKey();
  const ReplicaState state = PrimaryState();
  using Attempt = ScriptedPrimary::Attempt;
  ScriptedPrimary primary(state,
                          {Attempt::kCutOff, Attempt::kStall, Attempt::kShutDown, Attempt::kWhole});
  HostedServer backup("ps-1", *key, "", /*copy_stall=*/absl::Milliseconds(300));
  const absl::Time start = absl::Now();
  absl::StatusOr<int64_t> served =
      backup.host().ApplyShardMap(BackedUpOnPs1(primary.address(), *key));
  REQUIRE(served.ok());
  // Each of the three failures was retried (a fifth attempt: the whole one stalled past
  // 0.3 s on a loaded machine).
  CHECK(primary.attempts() >= 4);
  CHECK(absl::Now() - start < absl::Seconds(10));  // the stall was cut at 0.3 s, not 20
  const std::map<int, ServedShard> shards = backup.service().shards();
  REQUIRE(shards.count(0) == 1);
  CHECK_FALSE(shards.at(0).primary);
  CHECK(shards.at(0).primary_name == "ps-0");
  CHECK(backup.Values(0) == state.shard.values);             // the primary's, bit for bit
  CHECK(state.shard.values != std::vector<float>(3, 1.5f));  // trained, not the initial
  CHECK(backup.Values(1) == std::vector<float>{4, 5, 6});
}

TEST_CASE("a new backup refuses a primary's state that is not its shard's, and does not retry") {
  const std::unique_ptr<MapSigningKey> key = SchedulerKey();
  ScriptedPrimary primary(PrimaryState({0, 4}), {});
  HostedServer backup("ps-1", *key);
  absl::StatusOr<int64_t> served =
      backup.host().ApplyShardMap(BackedUpOnPs1(primary.address(), *key));
  INFO(served.status());
  CHECK(absl::IsInvalidArgument(served.status()));
  CHECK(absl::StrContains(served.status().message(), "copying shard 0 from its primary ps-0"));
  CHECK(primary.attempts() == 1);
}

// A worker that joins as the cluster forms: the primary serves epoch 2 already when
// this server, which has heard of epoch 1 only, asks for its copy under 1.
TEST_CASE(
    "a new backup whose primary serves a newer map leaves the copy to that map's install, and "
    "serves the rest") {
  const std::unique_ptr<MapSigningKey> key = SchedulerKey();
  const ReplicaState state = PrimaryState();
  ScriptedPrimary primary(state, {ScriptedPrimary::Attempt::kMovedOn});
  HostedServer backup("ps-1", *key);
  absl::StatusOr<int64_t> served =
      backup.host().ApplyShardMap(BackedUpOnPs1(primary.address(), *key, 1));
  INFO(served.status());
  REQUIRE(served.ok());
  CHECK(*served == 1);
  CHECK(primary.attempts() == 1);                  // refused, not retried
  CHECK(backup.service().shards().count(0) == 0);  // no copy held yet
  CHECK(backup.Values(1) == std::vector<float>{4, 5, 6});
  // The newer map's install copies the shard.
  served = backup.host().ApplyShardMap(BackedUpOnPs1(primary.address(), *key, 2));
  REQUIRE(served.ok());
  CHECK(primary.attempts() == 2);
  const std::map<int, ServedShard> shards = backup.service().shards();
  REQUIRE(shards.count(0) == 1);
  CHECK_FALSE(shards.at(0).primary);
  CHECK(backup.Values(0) == state.shard.values);
}

TEST_CASE("a new backup refused by a primary serving the copy's own epoch fails, not retried") {
  const std::unique_ptr<MapSigningKey> key = SchedulerKey();
  ScriptedPrimary primary(PrimaryState(), {ScriptedPrimary::Attempt::kNotPrimary});
  HostedServer backup("ps-1", *key);
  absl::StatusOr<int64_t> served =
      backup.host().ApplyShardMap(BackedUpOnPs1(primary.address(), *key));
  INFO(served.status());
  CHECK(absl::IsFailedPrecondition(served.status()));
  CHECK(absl::StrContains(served.status().message(), "copying shard 0 from its primary ps-0"));
  CHECK(primary.attempts() == 1);
}

}  // namespace
}  // namespace paramserver
