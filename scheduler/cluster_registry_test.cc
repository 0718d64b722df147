// The registry: forming the cluster, declared models, registrations and silent nodes.
#include "scheduler/cluster_registry.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <vector>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "common/security/secrets.h"
#include "google/protobuf/unknown_field_set.h"
#include "scheduler/cluster_status.h"
#include "scheduler/registry_testing.h"

namespace paramserver {
namespace {

TEST_CASE("nodes get names and ranks; the shard map appears when the last one registers") {
  ClusterRegistry registry(Options());
  absl::StatusOr<RegisterResponse> ps0 = Join(registry, NODE_ROLE_SERVER, "h:1");
  REQUIRE(ps0.ok());
  CHECK(ps0->node_name() == "ps-0");
  CHECK(Join(registry, NODE_ROLE_WORKER, "h:3")->node_name() == "worker-0");
  CHECK(Join(registry, NODE_ROLE_SERVER, "h:2")->node_name() == "ps-1");
  CHECK_FALSE(registry.View().ready());
  absl::StatusOr<RegisterResponse> w1 = Join(registry, NODE_ROLE_WORKER, "h:4");
  REQUIRE(w1.ok());
  CHECK(w1->rank() == 1);
  ClusterView view = registry.View();
  REQUIRE(view.ready());
  CHECK(view.shard_map().epoch() == 1);
  CHECK(view.shard_map().shards_size() == 4);
  CHECK(view.shard_map().shards(1).server_address() == "h:2");
  CHECK(view.shard_map().active_workers_size() == 2);
  CHECK(view.live_workers() == 2);
}

TEST_CASE("the map listener hears every published epoch, and the present one when set") {
  ClusterRegistry registry(Options(TrainingMode::kSync, 2, 1, 4));
  std::vector<int64_t> heard;
  registry.SetMapListener([&heard](int64_t epoch) { heard.push_back(epoch); });
  CHECK(heard == std::vector<int64_t>{0});  // no map yet
  FormCluster(registry, 2, 1);
  REQUIRE(heard == std::vector<int64_t>{0, 1});
  ReportBackupsCopied(registry);
  absl::StatusOr<MapChange> lost = registry.DeclareDead("ps-1");
  REQUIRE(lost.ok());
  REQUIRE(heard.size() >= 3);
  CHECK(heard.back() == lost->map.epoch());
  CHECK(heard.back() == registry.View().shard_map().epoch());
  CHECK(std::is_sorted(heard.begin(), heard.end()));
  // A second listener replaces the first, and hears the present epoch at once.
  std::vector<int64_t> second;
  registry.SetMapListener([&second](int64_t epoch) { second.push_back(epoch); });
  CHECK(second == std::vector<int64_t>{lost->map.epoch()});
  const size_t first_heard = heard.size();
  registry.SetMapListener(nullptr);
  REQUIRE(Join(registry, NODE_ROLE_SERVER, "s:1").ok());  // ps-1 back: a new map
  REQUIRE(registry.View().shard_map().epoch() > lost->map.epoch());
  CHECK(heard.size() == first_heard);
  CHECK(second.size() == 1);
}

TEST_CASE(
    "GetClusterView's map is serialized once per map, and the answer built from it parses as the "
    "whole view") {
  ClusterRegistry registry(Options(TrainingMode::kSync, 2, 2, 4));
  std::shared_ptr<const std::string> bytes;
  (void)registry.ViewWithoutMap(&bytes);
  CHECK(bytes == nullptr);  // no map yet
  FormCluster(registry, 2, 2);
  ReportBackupsCopied(registry);
  ClusterView answer = registry.ViewWithoutMap(&bytes);
  REQUIRE(bytes != nullptr);
  CHECK_FALSE(answer.has_shard_map());
  std::shared_ptr<const std::string> again;
  (void)registry.ViewWithoutMap(&again);
  CHECK(again == bytes);  // the same bytes, not a copy
  // As the service sends it: the bytes as the shard_map field. A node parses the whole view.
  ClusterView::GetReflection()->MutableUnknownFields(&answer)->AddLengthDelimited(
      ClusterView::kShardMapFieldNumber, *bytes);
  ClusterView parsed;
  REQUIRE(parsed.ParseFromString(answer.SerializeAsString()));
  const ClusterView whole = registry.View();
  CHECK(parsed.shard_map().SerializeAsString() == whole.shard_map().SerializeAsString());
  CHECK(parsed.shard_map().epoch() == 1);
  CHECK(parsed.shard_map().shards_size() == 4);
  CHECK(parsed.live_workers() == whole.live_workers());
  CHECK(parsed.ready());
  // A new map: new bytes, of the new map.
  REQUIRE(registry.DeclareDead("ps-1").ok());
  (void)registry.ViewWithoutMap(&again);
  REQUIRE(again != nullptr);
  CHECK(again != bytes);
  ShardMap newer;
  REQUIRE(newer.ParseFromString(*again));
  CHECK(newer.epoch() == 2);
  CHECK(newer.SerializeAsString() == registry.View().shard_map().SerializeAsString());
}

TEST_CASE("a scheduler's own pause counts against no node's heartbeats") {
  ClusterRegistry registry(Options(TrainingMode::kSync, 1, 1, 2));
  FormCluster(registry, 1, 1);  // both registered at kStart
  const absl::Duration timeout = absl::Seconds(3);
  HeartbeatRequest beat;
  beat.set_node_name("ps-0");
  REQUIRE(registry.Heartbeat(beat, kStart + absl::Milliseconds(2500)).ok());
  // The scheduler stops at 2.5 s and runs again at 4.5 s: unexcused, both look silent
  // (ps-0 for 2 s, worker-0 for 4.5 s), worker-0 past the timeout.
  const absl::Time resumed = kStart + absl::Milliseconds(4500);
  CHECK(registry.SilentNodes(resumed, timeout).size() == 1);
  registry.ExcludeSchedulerPause(absl::Seconds(2), resumed);
  // Its silence before the pause still counts (2.5 s), the pause does not.
  CHECK(registry.SilentNodes(resumed, timeout).empty());
  const std::vector<SilentNode> later =
      registry.SilentNodes(resumed + absl::Milliseconds(600), timeout);
  REQUIRE(later.size() == 1);
  CHECK(later[0].name == "worker-0");
  CHECK(later[0].silent_for == absl::Milliseconds(3100));
  // ps-0's last heartbeat moved to the resumption at most, never past it.
  CHECK(registry.SilentNodes(resumed + absl::Milliseconds(3100), timeout).size() == 2);
}

ModelDeclaration Declared(int64_t hidden) {
  ModelDeclaration model;
  TensorDeclaration* weight = model.add_tensors();
  weight->set_name("fc.weight");
  weight->add_shape(hidden);
  weight->add_shape(8);
  TensorDeclaration* bias = model.add_tensors();
  bias->set_name("fc.bias");
  bias->add_shape(hidden);
  return model;
}

TEST_CASE(
    "torch resuming: the checkpoint's model is the job's; the shards restore, none declared") {
  RegistryOptions options = Options(TrainingMode::kSync, 1, 2, 2);
  options.layout = ModelLayout();
  options.model_declared_by_workers = true;
  options.resumed_model = Declared(4);
  options.resume_step = 30;
  std::vector<ModelDeclaration> recorded;
  options.on_model_declared = [&](const ModelDeclaration& model) { recorded.push_back(model); };
  ClusterRegistry registry(options);
  FormCluster(registry, 1, 2);
  absl::StatusOr<DeclareModelResponse> other =
      registry.DeclareModel("worker-0", Declared(5), kStart);
  CHECK(other.status().message() ==
        "tensor 'fc.weight' has shape [5, 8] here but [4, 8] in the job's model (declared by "
        "the job whose checkpoints this one resumes)");
  CHECK_FALSE(registry.View().ready());
  CHECK(recorded.empty());
  absl::StatusOr<DeclareModelResponse> first =
      registry.DeclareModel("worker-0", Declared(4), kStart);
  REQUIRE(first.ok());
  CHECK_FALSE(first->sets_initial_values());  // the values are the checkpoint's
  const ClusterView view = registry.View();
  REQUIRE(view.ready());
  CHECK(view.shard_map().initial_values_from().empty());
  for (const ShardAssignment& shard : view.shard_map().shards()) {
    CHECK(shard.restore() == SHARD_RESTORE_AT_STEP);
    CHECK(shard.restore_step() == 30);
  }
  REQUIRE(registry.DeclareModel("worker-1", Declared(4), kStart).ok());
  REQUIRE(recorded.size() == 1);  // once, the first declaration
  CHECK(recorded[0].tensors_size() == 2);
  // A scheduler taking over records it again (the one before may have died first).
  ClusterRegistry taken_over(options);
  REQUIRE(taken_over.ImportState(registry.ExportState(), kStart).ok());
  REQUIRE(recorded.size() == 2);
  CHECK(recorded[1].tensors(0).name() == "fc.weight");
}

TEST_CASE(
    "torch: the first worker's declaration places the shards; a later one must match, named") {
  RegistryOptions options = Options(TrainingMode::kSync, 2, 2, 3);
  options.layout = ModelLayout();
  options.model_declared_by_workers = true;
  ClusterRegistry registry(options);
  FormCluster(registry, 2, 2);
  CHECK_FALSE(registry.View().ready());  // every node is in, the model is not
  CHECK(registry.DeclareModel("worker-9", Declared(4), kStart).status().code() ==
        absl::StatusCode::kNotFound);
  CHECK(registry.DeclareModel("ps-0", Declared(4), kStart).status().code() ==
        absl::StatusCode::kNotFound);
  ModelDeclaration malformed = Declared(4);
  malformed.mutable_tensors(0)->set_shape(0, 0);
  CHECK(registry.DeclareModel("worker-1", malformed, kStart).status().code() ==
        absl::StatusCode::kInvalidArgument);
  ModelDeclaration tiny;
  tiny.add_tensors()->set_name("w");
  tiny.mutable_tensors(0)->add_shape(2);
  CHECK(registry.DeclareModel("worker-1", tiny, kStart).status().message() ==
        "cluster.shards (3) exceeds the model's 2 dense parameters: give fewer shards or more "
        "tensors");

  absl::StatusOr<DeclareModelResponse> first =
      registry.DeclareModel("worker-1", Declared(4), kStart);
  REQUIRE(first.ok());
  CHECK(first->sets_initial_values());
  const ClusterView view = registry.View();
  REQUIRE(view.ready());
  CHECK(view.shard_map().shards_size() == 3);
  CHECK(view.shard_map().shards(2).end() == 36);
  CHECK(view.shard_map().model().tensors_size() == 2);
  CHECK(view.shard_map().initial_values_from() == "worker-1");

  absl::StatusOr<DeclareModelResponse> same =
      registry.DeclareModel("worker-0", Declared(4), kStart);
  REQUIRE(same.ok());
  CHECK_FALSE(same->sets_initial_values());
  CHECK(registry.DeclareModel("worker-1", Declared(4), kStart)->sets_initial_values());  // a retry
  absl::StatusOr<DeclareModelResponse> other =
      registry.DeclareModel("worker-0", Declared(5), kStart);
  CHECK(other.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(other.status().message() ==
        "tensor 'fc.weight' has shape [5, 8] here but [4, 8] in the job's model (declared by "
        "worker-1)");

  // The declaration survives a takeover from the saved state.
  ClusterRegistry taken_over(options);
  REQUIRE(taken_over.ImportState(registry.ExportState(), kStart).ok());
  CHECK(taken_over.DeclareModel("worker-0", Declared(5), kStart).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  CHECK(taken_over.View().shard_map().model().tensors_size() == 2);
}

TEST_CASE("torch: a declaration whose tensors the spec's parameter groups miss is refused") {
  RegistryOptions options = Options(TrainingMode::kSync, 2, 2, 3);
  options.layout = ModelLayout();
  options.model_declared_by_workers = true;
  DenseOptimizerGroup no_decay;
  no_decay.params = {"*.bias", "*norm*"};
  no_decay.options.weight_decay = 0;
  options.optimizer.groups = {no_decay};
  ClusterRegistry registry(options);
  FormCluster(registry, 2, 2);
  const absl::Status refused = registry.DeclareModel("worker-1", Declared(4), kStart).status();
  CHECK(refused.code() == absl::StatusCode::kInvalidArgument);
  CHECK(refused.message() ==
        "training.optimizer.groups: group 0's pattern '*norm*' matches no tensor of the model "
        "(its tensors: fc.weight, fc.bias)");
  CHECK_FALSE(registry.View().ready());  // nothing placed: the script's register() raises
}

TEST_CASE("a model the spec gives is not declared by workers") {
  ClusterRegistry registry(Options());
  FormCluster(registry, 2, 2);
  CHECK(registry.DeclareModel("worker-0", Declared(4), kStart).status().code() ==
        absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("a retried registration gets the same name; extra or malformed ones are refused") {
  ClusterRegistry registry(Options());
  REQUIRE(Join(registry, NODE_ROLE_SERVER, "h:1").ok());
  CHECK(Join(registry, NODE_ROLE_SERVER, "h:1")->node_name() == "ps-0");
  REQUIRE(Join(registry, NODE_ROLE_SERVER, "h:2").ok());
  CHECK(Join(registry, NODE_ROLE_SERVER, "h:9").status().code() ==
        absl::StatusCode::kResourceExhausted);
  CHECK(Join(registry, NODE_ROLE_UNSPECIFIED, "h:9").status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(Join(registry, NODE_ROLE_WORKER, "nohostport").status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("silent live nodes are listed with how long they have been silent") {
  ClusterRegistry registry(Options());
  REQUIRE(Join(registry, NODE_ROLE_SERVER, "h:1").ok());
  REQUIRE(Join(registry, NODE_ROLE_SERVER, "h:2").ok());
  HeartbeatRequest beat;
  beat.set_node_name("ps-1");
  REQUIRE(registry.Heartbeat(beat, kStart + absl::Seconds(2)).ok());
  std::vector<SilentNode> silent =
      registry.SilentNodes(kStart + absl::Seconds(4), absl::Seconds(3));
  REQUIRE(silent.size() == 1);
  CHECK(silent[0].name == "ps-0");
  CHECK(silent[0].silent_for == absl::Seconds(4));
  beat.set_node_name("ghost");
  CHECK(registry.Heartbeat(beat, kStart).status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("a server waiting for slow workers to register is alive while it polls the view") {
  // The servers register at once; the workers take longer than the failure timeout to
  // start (loading data, initialising CUDA). The servers send no heartbeats until the
  // cluster forms, but they poll for it, and that keeps them alive.
  ClusterRegistry registry(Options());
  REQUIRE(Join(registry, NODE_ROLE_SERVER, "h:1").ok());
  REQUIRE(Join(registry, NODE_ROLE_SERVER, "h:2").ok());
  for (int second = 1; second <= 10; ++second)
    registry.NoteAlive("ps-0", kStart + absl::Seconds(second));
  std::vector<SilentNode> silent =
      registry.SilentNodes(kStart + absl::Seconds(11), absl::Seconds(3));
  REQUIRE(silent.size() == 1);
  CHECK(silent[0].name == "ps-1");      // it stopped polling: it is silent
  registry.NoteAlive("ghost", kStart);  // unknown names change nothing
  REQUIRE(registry.DeclareDead("ps-1").status().code() == absl::StatusCode::kFailedPrecondition);
  registry.NoteAlive("ps-1", kStart + absl::Seconds(12));  // a dead node stays dead
  HeartbeatRequest beat;
  beat.set_node_name("ps-1");
  CHECK(registry.Heartbeat(beat, kStart + absl::Seconds(12)).status().code() ==
        absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace paramserver

namespace paramserver {
namespace {

TEST_CASE("a workers range: the job starts at min, workers join up to max, the map counts them") {
  RegistryOptions options = Options(TrainingMode::kSync, 2, 2);
  options.cluster.max_workers = 4;
  options.batch_size = 32;
  ClusterRegistry registry(options);
  FormCluster(registry, 2, 2);
  REQUIRE(registry.View().ready());
  CHECK(registry.View().shard_map().active_workers_size() == 4);  // every rank the range allows
  CHECK(registry.View().shard_map().active_workers(1));
  CHECK_FALSE(registry.View().shard_map().active_workers(2));
  std::optional<MapChange> change;
  absl::StatusOr<RegisterResponse> third = Join(registry, NODE_ROLE_WORKER, "w:2", &change);
  REQUIRE(third.ok());
  CHECK(third->node_name() == "worker-2");
  REQUIRE(change.has_value());
  CHECK(change->map.active_workers(2));
  CHECK(change->summary ==
        "worker-2 joined at w:2; 3 worker(s) train now (cluster.workers 2..4): each step's mean "
        "is over 3 x 32 = 96 examples (the effective batch)");
  REQUIRE(Join(registry, NODE_ROLE_WORKER, "w:3").ok());
  absl::StatusOr<RegisterResponse> fifth = Join(registry, NODE_ROLE_WORKER, "w:4");
  CHECK(fifth.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(absl::StrContains(fifth.status().message(), "its 4 workers (its range's max)"));
  // One lost: its rank leaves the map, and the line says what the steps average over.
  absl::StatusOr<MapChange> lost = registry.DeclareDead("worker-3");
  REQUIRE(lost.ok());
  CHECK_FALSE(lost->map.active_workers(3));
  CHECK(absl::StrContains(lost->summary, "3 worker(s) train now"));
  // The saved state takes ranks up to max back.
  ClusterRegistry restored(options);
  CHECK(restored.ImportState(registry.ExportState(), kStart).ok());
}

}  // namespace
}  // namespace paramserver
