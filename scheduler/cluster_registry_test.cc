#include "scheduler/cluster_registry.h"

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

ClusterSection TwoByTwo() {
  ClusterSection cluster;
  cluster.scheduler_address = "127.0.0.1:0";
  cluster.servers = 2;
  cluster.workers = 2;
  cluster.shards = 4;
  return cluster;
}

const absl::Time kStart = absl::FromUnixSeconds(1000);

TEST_CASE("nodes get names and ranks; the shard map appears when the last one registers") {
  ClusterRegistry registry(TwoByTwo(), 100);
  absl::StatusOr<RegisterResponse> ps0 = registry.Register(NODE_ROLE_SERVER, "h:1", kStart);
  REQUIRE(ps0.ok());
  CHECK(ps0->node_name() == "ps-0");
  CHECK(registry.Register(NODE_ROLE_WORKER, "h:3", kStart)->node_name() == "worker-0");
  CHECK(registry.Register(NODE_ROLE_SERVER, "h:2", kStart)->node_name() == "ps-1");
  CHECK_FALSE(registry.View().ready());
  CHECK(registry.View().registered_servers() == 2);
  absl::StatusOr<RegisterResponse> w1 = registry.Register(NODE_ROLE_WORKER, "h:4", kStart);
  REQUIRE(w1.ok());
  CHECK(w1->rank() == 1);
  ClusterView view = registry.View();
  REQUIRE(view.ready());
  CHECK(view.shard_map().epoch() == 1);
  CHECK(view.shard_map().shards_size() == 4);
  CHECK(view.shard_map().shards(1).server_address() == "h:2");
}

TEST_CASE("a retried registration gets the same name; extra or malformed ones are refused") {
  ClusterRegistry registry(TwoByTwo(), 100);
  REQUIRE(registry.Register(NODE_ROLE_SERVER, "h:1", kStart).ok());
  CHECK(registry.Register(NODE_ROLE_SERVER, "h:1", kStart)->node_name() == "ps-0");
  REQUIRE(registry.Register(NODE_ROLE_SERVER, "h:2", kStart).ok());
  CHECK(registry.Register(NODE_ROLE_SERVER, "h:9", kStart).status().code() ==
        absl::StatusCode::kResourceExhausted);
  CHECK(registry.Register(NODE_ROLE_UNSPECIFIED, "h:9", kStart).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(registry.Register(NODE_ROLE_WORKER, "nohostport", kStart).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("silent nodes are reported once per silence") {
  ClusterRegistry registry(TwoByTwo(), 100);
  REQUIRE(registry.Register(NODE_ROLE_SERVER, "h:1", kStart).ok());
  REQUIRE(registry.Register(NODE_ROLE_SERVER, "h:2", kStart).ok());
  HeartbeatRequest beat;
  beat.set_node_name("ps-1");
  REQUIRE(registry.Heartbeat(beat, kStart + absl::Seconds(2)).ok());
  std::vector<SilentNode> silent = registry.TakeNewlySilentNodes(kStart + absl::Seconds(4), absl::Seconds(3));
  REQUIRE(silent.size() == 1);
  CHECK(silent[0].name == "ps-0");
  CHECK(silent[0].silent_for == absl::Seconds(4));
  CHECK(registry.TakeNewlySilentNodes(kStart + absl::Seconds(5), absl::Seconds(3)).empty());
  CHECK(registry.TakeNewlySilentNodes(kStart + absl::Seconds(6), absl::Seconds(3)).size() == 1);  // ps-1
  beat.set_node_name("ghost");
  CHECK(registry.Heartbeat(beat, kStart).status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("the result is accepted from worker-0 after every worker finished") {
  ClusterRegistry registry(TwoByTwo(), 100);
  for (const char* address : {"h:1", "h:2"}) REQUIRE(registry.Register(NODE_ROLE_SERVER, address, kStart).ok());
  for (const char* address : {"h:3", "h:4"}) REQUIRE(registry.Register(NODE_ROLE_WORKER, address, kStart).ok());
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
  CHECK(job->steps == 100);
  CHECK(job->samples_per_sec == Approx(6400.0 / 16));
  CHECK(registry.job_finished());
  CHECK_FALSE(registry.all_servers_told_to_stop());
  for (const char* name : {"ps-0", "ps-1"}) {
    HeartbeatRequest beat;
    beat.set_node_name(name);
    CHECK(registry.Heartbeat(beat, kStart)->job_finished());
  }
  CHECK(registry.all_servers_told_to_stop());
}

}  // namespace
}  // namespace paramserver
