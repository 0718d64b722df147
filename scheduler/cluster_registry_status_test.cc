// The registry: heartbeats' figures, the status, a saved state taken over, and the result.
#include <functional>
#include <future>
#include <limits>
#include <map>

#include "catch2/catch.hpp"
#include "common/security/secrets.h"
#include "scheduler/cluster_registry.h"
#include "scheduler/cluster_status.h"
#include "scheduler/registry_testing.h"

namespace paramserver {
namespace {

const NodeStatus& NodeNamed(const ClusterStatus& status, const std::string& name) {
  for (const NodeStatus& node : status.nodes()) {
    if (node.name() == name) return node;
  }
  FAIL("no node " << name);
  return status.nodes(0);
}

void WorkerBeat(ClusterRegistry& registry, const std::string& name, int64_t step, absl::Time now) {
  HeartbeatRequest beat;
  beat.set_node_name(name);
  beat.mutable_progress()->set_step(step);
  beat.mutable_progress()->set_samples_per_sec(100);
  REQUIRE(registry.Heartbeat(beat, now).ok());
}

TEST_CASE("a heartbeat's progress figures are checked before the ETA uses them") {
  RegistryOptions options = Options(TrainingMode::kSync, 2, 2, 4);
  ClusterRegistry registry(options);
  FormCluster(registry, 0, 2);
  HeartbeatRequest beat;
  beat.set_node_name("worker-0");
  beat.mutable_progress()->set_step(10);
  beat.mutable_progress()->set_total_steps(-5);
  absl::StatusOr<HeartbeatResponse> negative = registry.Heartbeat(beat, kStart);
  CHECK(negative.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(negative.status().message()).find("total_steps -5") != std::string::npos);
  beat.mutable_progress()->set_total_steps(100);
  beat.mutable_progress()->set_steps_per_sec(std::numeric_limits<double>::quiet_NaN());
  CHECK(registry.Heartbeat(beat, kStart).status().code() == absl::StatusCode::kInvalidArgument);
  beat.mutable_progress()->set_steps_per_sec(-1);
  CHECK(registry.Heartbeat(beat, kStart).status().code() == absl::StatusCode::kInvalidArgument);
  // Refused whole: the registry kept nothing of them.
  CHECK(NodeNamed(DescribeCluster(registry.TakeSnapshot(false), kStart), "worker-0")
            .progress()
            .total_steps() == 0);
  beat.mutable_progress()->set_steps_per_sec(25);
  REQUIRE(registry.Heartbeat(beat, kStart).ok());
  const ClusterStatus status = DescribeCluster(registry.TakeSnapshot(false), kStart);
  CHECK(status.total_steps() == 100);
}

TEST_CASE("the status: health from heartbeat ages, the slowest worker, and a verdict") {
  RegistryOptions options = Options(TrainingMode::kSync, 2, 2, 4);
  options.cluster.heartbeat_interval_ms = 500;
  options.cluster.failure_timeout_ms = 3000;
  options.cluster.replication = 2;
  ClusterRegistry registry(options);
  REQUIRE(Join(registry, NODE_ROLE_SERVER, "s:0").ok());
  CHECK(DescribeCluster(registry.TakeSnapshot(false), kStart).verdict() ==
        "waiting for 1 server and 2 workers");
  FormCluster(registry, 0, 2);
  REQUIRE(Join(registry, NODE_ROLE_SERVER, "s:1").ok());
  ReportShards(registry, {{0, {40, 30}}, {1, {41, -1}}});
  WorkerBeat(registry, "worker-0", 42, kStart + absl::Seconds(1));
  WorkerBeat(registry, "worker-1", 40, kStart + absl::Seconds(1));
  ClusterStatus status =
      DescribeCluster(registry.TakeSnapshot(false), kStart + absl::Milliseconds(1200));
  CHECK(status.verdict() == "training");
  CHECK(status.map_version() == 1);
  CHECK(status.mode() == "sync");
  CHECK(status.replication() == 2);
  CHECK(status.fastest_step() == 42);
  CHECK(status.slowest_step() == 40);
  CHECK(status.slowest_worker() == "worker-1");
  CHECK(status.samples_per_sec() == 200);
  CHECK(NodeNamed(status, "worker-0").health() == NODE_HEALTH_ALIVE);
  CHECK(NodeNamed(status, "worker-0").seconds_since_heartbeat() == Approx(0.2));
  CHECK(NodeNamed(status, "ps-0").health() == NODE_HEALTH_SUSPECT);  // silent 1.2 s > 2 heartbeats
  REQUIRE(status.shards_size() == 4);
  CHECK(status.shards(0).primary() == "ps-0");
  CHECK(status.shards(0).backups(0) == "ps-1");
  CHECK(status.shards(0).applied_updates() == 40);
  CHECK(status.shards(0).checkpoint_step() == 30);
  CHECK(status.shards(1).checkpoint_step() == -1);
  CHECK(status.shards(0).parameters() == 25);

  // No worker advances for longer than the failure timeout: stalled, naming the slowest.
  const ClusterStatus stalled =
      DescribeCluster(registry.TakeSnapshot(false), kStart + absl::Seconds(5));
  CHECK(stalled.verdict().rfind("stalled since ", 0) == 0);
  CHECK(stalled.verdict().find("(no worker advanced for 4 s; slowest worker-1 at step 40)") !=
        std::string::npos);
  REQUIRE(registry.DeclareDead("ps-0").ok());
  CHECK(NodeNamed(DescribeCluster(registry.TakeSnapshot(false), kStart + absl::Seconds(5)), "ps-0")
            .health() == NODE_HEALTH_DEAD);

  registry.RequestShutdown();
  CHECK(DescribeCluster(registry.TakeSnapshot(false), kStart + absl::Seconds(5)).verdict() ==
        "shutting down");
  CHECK(registry.job_finished());
  HeartbeatRequest beat;
  beat.set_node_name("worker-0");
  absl::StatusOr<HeartbeatResponse> told = registry.Heartbeat(beat, kStart + absl::Seconds(6));
  REQUIRE(told.ok());
  CHECK(told->shutdown());
  CHECK(told->job_finished());
  CHECK_FALSE(registry.all_servers_told_to_stop());  // worker-1 and ps-1 have not heard yet
}

TEST_CASE("a registry imported from a saved state carries on the job") {
  ClusterRegistry original(Options(TrainingMode::kSync, 2, 2, 4));
  FormCluster(original, 2, 2);
  REQUIRE(original.DeclareDead("worker-1").ok());
  const int64_t version = original.state_version();
  CHECK(version > 0);
  SchedulerState saved = original.ExportState();
  ClusterRegistry restarted(Options(TrainingMode::kSync, 2, 2, 4));
  REQUIRE(restarted.ImportState(saved, kStart + absl::Seconds(60)).ok());
  ClusterView view = restarted.View();
  CHECK(view.ready());
  CHECK(view.shard_map().epoch() == original.View().shard_map().epoch());
  CHECK(view.live_workers() == 1);
  // Live nodes get a fresh failure timeout; known names heartbeat, a retried
  // registration returns the same name, and the dead worker's slot can be retaken.
  CHECK(restarted.SilentNodes(kStart + absl::Seconds(61), absl::Seconds(3)).empty());
  HeartbeatRequest beat;
  beat.set_node_name("ps-1");
  CHECK(restarted.Heartbeat(beat, kStart + absl::Seconds(61)).ok());
  CHECK(Join(restarted, NODE_ROLE_SERVER, "s:0")->node_name() == "ps-0");
  CHECK(Join(restarted, NODE_ROLE_WORKER, "w:new")->node_name() == "worker-1");
}

TEST_CASE(
    "a job ended by an operator or unfinished stays ended in the saved state, with its reason") {
  for (const bool unfinished : {false, true}) {
    ClusterRegistry original(Options(TrainingMode::kSync, 2, 2, 4));
    FormCluster(original, 2, 2);
    CHECK(original.ExportState().shutdown_requested() == false);
    const int64_t before = original.state_version();
    if (unfinished) {
      original.EndJobUnfinished(absl::DataLossError("lost ps-1: shards [1, 3] had no other copy"));
      original.EndJobUnfinished(absl::DeadlineExceededError("a second ending"));  // ignored
    } else {
      original.RequestShutdown();
    }
    CHECK(original.state_version() > before);  // saved again
    CHECK(original.job_finished());
    const SchedulerState saved = original.ExportState();
    CHECK(saved.shutdown_requested());
    ClusterRegistry restarted(Options(TrainingMode::kSync, 2, 2, 4));
    REQUIRE(restarted.ImportState(saved, kStart + absl::Seconds(60)).ok());
    CHECK(restarted.job_finished());
    const absl::Status ended = restarted.ended_unfinished();
    if (unfinished) {
      CHECK(ended.code() == absl::StatusCode::kDataLoss);
      CHECK(ended.message() == "lost ps-1: shards [1, 3] had no other copy");
    } else {
      CHECK(ended.ok());
    }
    // Every node is told to stop by the successor, as by its predecessor.
    HeartbeatRequest beat;
    beat.set_node_name("ps-0");
    absl::StatusOr<HeartbeatResponse> told = restarted.Heartbeat(beat, kStart + absl::Seconds(61));
    REQUIRE(told.ok());
    CHECK(told->shutdown());
  }
  // A code no status has (a damaged file) still ends the job.
  ClusterRegistry original(Options(TrainingMode::kSync, 2, 2, 4));
  FormCluster(original, 2, 2);
  SchedulerState spoiled = original.ExportState();
  spoiled.set_ended_unfinished_code(999);
  spoiled.set_ended_unfinished_message("why");
  ClusterRegistry restarted(Options(TrainingMode::kSync, 2, 2, 4));
  REQUIRE(restarted.ImportState(spoiled, kStart).ok());
  CHECK(restarted.job_finished());
  CHECK(restarted.ended_unfinished().code() == absl::StatusCode::kUnknown);
}

TEST_CASE("the result is accepted from worker-0 after every live worker finished") {
  ClusterRegistry registry(Options());
  FormCluster(registry, 2, 2);
  ReportResultRequest result;
  result.set_node_name("worker-0");
  result.set_test_accuracy(0.87);
  CHECK(registry.ReportResult(result).status().code() == absl::StatusCode::kFailedPrecondition);
  ReportFinishedRequest finished;
  finished.set_node_name("worker-0");
  finished.set_steps(100);
  finished.set_samples(3200);
  finished.set_seconds(10);
  REQUIRE(registry.ReportFinished(finished, kStart).ok());
  finished.set_node_name("worker-1");
  finished.set_seconds(16);
  CHECK(registry.ReportFinished(finished, kStart)->workers_finished() == 2);
  ReportResultRequest impostor = result;
  impostor.set_node_name("worker-1");
  CHECK_FALSE(registry.ReportResult(impostor).ok());
  absl::StatusOr<JobResult> job = registry.ReportResult(result);
  REQUIRE(job.ok());
  // Every mutating call is safe to repeat (a retry after a lost response).
  CHECK(registry.ReportFinished(finished, kStart)->workers_finished() == 2);
  ReportResultRequest retried = result;
  retried.set_test_accuracy(0.5);
  CHECK(registry.ReportResult(retried)->test_accuracy == Approx(0.87));
  CHECK(job->steps == 100);
  CHECK(job->samples_per_sec == Approx(6400.0 / 16));
  CHECK(registry.job_finished());
  CHECK_FALSE(registry.all_servers_told_to_stop());
  for (const char* name : {"ps-0", "ps-1"}) {
    HeartbeatRequest beat;
    beat.set_node_name(name);
    CHECK(registry.Heartbeat(beat, kStart)->job_finished());
  }
  // worker-1 waits for the result too (it would evaluate in a lost worker-0's place);
  // worker-0 reported it and need not hear.
  CHECK_FALSE(registry.all_servers_told_to_stop());
  HeartbeatRequest beat;
  beat.set_node_name("worker-1");
  CHECK(registry.Heartbeat(beat, kStart)->job_finished());
  CHECK(registry.all_servers_told_to_stop());
}

TEST_CASE(
    "a finished worker answered a view that says the job finished has heard it; a server has "
    "not") {
  ClusterRegistry registry(Options());
  FormCluster(registry, 2, 2);
  for (const char* name : {"worker-0", "worker-1"}) {
    ReportFinishedRequest finished;
    finished.set_node_name(name);
    finished.set_steps(100);
    REQUIRE(registry.ReportFinished(finished, kStart).ok());
  }
  registry.NoteToldJobFinished("worker-1");  // before the result: there was nothing to hear
  ReportResultRequest result;
  result.set_node_name("worker-0");
  result.set_test_accuracy(0.87);
  REQUIRE(registry.ReportResult(result).ok());
  auto beat_of = [&](const char* name) {
    HeartbeatRequest beat;
    beat.set_node_name(name);
    CHECK(registry.Heartbeat(beat, kStart)->job_finished());
  };
  beat_of("ps-1");
  registry.NoteToldJobFinished("no-such-node");
  // A server stops only on a heartbeat answer: a view it was answered does not count.
  registry.NoteToldJobFinished("ps-0");
  registry.NoteToldJobFinished("worker-1");
  CHECK_FALSE(registry.all_servers_told_to_stop());  // ps-0 has not heard yet
  beat_of("ps-0");
  CHECK(registry.all_servers_told_to_stop());
}

TEST_CASE(
    "a saved state this spec cannot hold is refused whole: ranks, names and shards are checked") {
  ClusterRegistry original(Options(TrainingMode::kSync, 2, 2, 4));
  FormCluster(original, 2, 2);
  const SchedulerState good = original.ExportState();
  struct Case {
    const char* what;
    std::function<void(SchedulerState*)> spoil;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"a worker rank beyond the spec's workers",
       [](SchedulerState* s) { s->mutable_nodes(3)->set_rank(2); },
       "has rank 2; this spec has 2 workers"},
      {"a negative rank", [](SchedulerState* s) { s->mutable_nodes(0)->set_rank(-1); },
       "has rank -1"},
      {"a repeated rank", [](SchedulerState* s) { s->mutable_nodes(3)->set_rank(0); },
       "two workers have rank 0"},
      {"a repeated name", [](SchedulerState* s) { s->mutable_nodes(1)->set_name("ps-0"); },
       "'ps-0' is empty or repeats"},
      {"no role", [](SchedulerState* s) { s->mutable_nodes(1)->set_role(NODE_ROLE_UNSPECIFIED); },
       "no server or worker role"},
      {"a shard beyond the model",
       [](SchedulerState* s) {
         s->mutable_shard_map()->mutable_shards(0)->set_end(int64_t{1} << 40);
       },
       "outside this model's"},
      {"embedding rows for a model without tables",
       [](SchedulerState* s) {
         s->mutable_shard_map()->mutable_shards(0)->set_kind(SHARD_KIND_EMBEDDING_ROWS);
       },
       "holds embedding bucket 0 of 0; this model has 0 tables"},
      {"a shard held by a stranger",
       [](SchedulerState* s) {
         s->mutable_shard_map()->mutable_shards(0)->set_server_name("ps-9");
       },
       "held by 'ps-9'"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    SchedulerState spoiled = good;
    c.spoil(&spoiled);
    ClusterRegistry restarted(Options(TrainingMode::kSync, 2, 2, 4));
    const absl::Status imported = restarted.ImportState(spoiled, kStart);
    CHECK(imported.code() == absl::StatusCode::kDataLoss);
    CHECK(std::string(imported.message()).find(c.message) != std::string::npos);
    CHECK(restarted.ExportState().nodes_size() == 0);  // nothing was taken over
  }
  ClusterRegistry restarted(Options(TrainingMode::kSync, 2, 2, 4));
  CHECK(restarted.ImportState(good, kStart).ok());
}

TEST_CASE(
    "the rollback target is read from disk without the registry's lock: heartbeats are answered "
    "meanwhile") {
  RegistryOptions options = Options(TrainingMode::kSync, 2, 2, 4);
  ClusterRegistry* registry_seen = nullptr;
  bool heartbeat_answered_during_read = false;
  options.newest_complete_checkpoint = [&](const ModelLayout&) {
    // Stands for a slow disk: another thread's heartbeat must not wait for it.
    auto answered = std::async(std::launch::async, [&] {
      HeartbeatRequest beat;
      beat.set_node_name("worker-0");
      return registry_seen->Heartbeat(beat, kStart).ok();
    });
    heartbeat_answered_during_read =
        answered.wait_for(std::chrono::seconds(20)) == std::future_status::ready && answered.get();
    return int64_t{100};
  };
  ClusterRegistry registry(std::move(options));
  registry_seen = &registry;
  FormCluster(registry, 2, 2);
  absl::StatusOr<MapChange> change = registry.DeclareDead("ps-1");
  REQUIRE(change.ok());
  CHECK(heartbeat_answered_during_read);
  CHECK(change->summary.find("rolls back to its checkpoint at step 100") != std::string::npos);
}

TEST_CASE(
    "a server's checkpoint trouble is kept from its heartbeat, bounded, and cleared when it "
    "stops") {
  ClusterRegistry registry(Options(TrainingMode::kSync, 2, 2, 4));
  FormCluster(registry, 2, 2);
  HeartbeatRequest beat;
  beat.set_node_name("ps-0");
  beat.set_serving_epoch(registry.View().shard_map().epoch());
  beat.mutable_checkpoint_trouble()->set_failing_since_step(100);
  beat.mutable_checkpoint_trouble()->set_failed_writes(2);
  beat.mutable_checkpoint_trouble()->set_error("No space left on device" + std::string(5000, '!'));
  // A shard id the map does not give ps-0 is not recorded.
  ShardStatus* stranger = beat.add_shards();
  stranger->set_shard_id(1 << 30);
  stranger->set_applied_updates(7);
  REQUIRE(registry.Heartbeat(beat, kStart).ok());
  ClusterStatus status = DescribeCluster(registry.TakeSnapshot(false), kStart);
  const CheckpointTrouble& trouble = status.nodes(0).checkpoint_trouble();
  CHECK(trouble.failing_since_step() == 100);
  CHECK(trouble.error().size() == 512);
  CHECK(trouble.error().rfind("No space left on device", 0) == 0);
  for (const ShardStatusView& shard : status.shards()) CHECK(shard.shard_id() != (1 << 30));
  beat.clear_checkpoint_trouble();
  REQUIRE(registry.Heartbeat(beat, kStart).ok());
  CHECK_FALSE(
      DescribeCluster(registry.TakeSnapshot(false), kStart).nodes(0).has_checkpoint_trouble());
}

TEST_CASE(
    "when worker-0 is lost and not replaced, the lowest-ranked live worker reports the result") {
  ClusterRegistry registry(Options(TrainingMode::kSync, 2, 3, 4));
  FormCluster(registry, 2, 3);
  CHECK(registry.View().finisher_rank() == 0);
  REQUIRE(registry.DeclareDead("worker-0").ok());
  CHECK(registry.View().finisher_rank() == 1);
  for (const char* name : {"worker-1", "worker-2"}) {
    ReportFinishedRequest finished;
    finished.set_node_name(name);
    finished.set_steps(100);
    REQUIRE(registry.ReportFinished(finished, kStart).ok());
  }
  ReportResultRequest result;
  result.set_test_accuracy(0.86);
  result.set_node_name("worker-2");  // not the finisher
  CHECK(registry.ReportResult(result).status().code() == absl::StatusCode::kFailedPrecondition);
  result.set_node_name("worker-0");  // dead
  CHECK(registry.ReportResult(result).status().code() == absl::StatusCode::kFailedPrecondition);
  result.set_node_name("worker-1");
  REQUIRE(registry.ReportResult(result).ok());
  CHECK(registry.View().job_finished());
}

}  // namespace
}  // namespace paramserver
