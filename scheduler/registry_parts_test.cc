// The registry's three parts on their own: the roster's slots, the job's progress and
// result, and the shards' records.
#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "scheduler/job_progress.h"
#include "scheduler/node_roster.h"
#include "scheduler/shard_records.h"

namespace paramserver {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000000);
const std::string kToken(64, 'a'), kOtherToken(64, 'b');

ClusterSection TwoByTwo() {
  ClusterSection cluster;
  cluster.servers = 2;
  cluster.workers = 2;
  cluster.failure_timeout_ms = 3000;
  return cluster;
}

TEST_CASE("the roster gives slots in registration order, repeats answer alike") {
  NodeRoster roster(TwoByTwo());
  NodeRoster::Admission first = roster.Admit(NODE_ROLE_WORKER, "h:1", kToken, kStart).value();
  CHECK(first.node->name == "worker-0");
  CHECK_FALSE(first.repeat);
  CHECK(roster.Admit(NODE_ROLE_SERVER, "h:2", kToken, kStart).value().node->name == "ps-0");
  CHECK(roster.Admit(NODE_ROLE_WORKER, "h:3", kToken, kStart).value().node->name == "worker-1");
  NodeRoster::Admission again = roster.Admit(NODE_ROLE_WORKER, "h:1", kToken, kStart).value();
  CHECK(again.repeat);
  CHECK(again.node->name == "worker-0");
  absl::StatusOr<NodeRoster::Admission> impostor =
      roster.Admit(NODE_ROLE_WORKER, "h:1", kOtherToken, kStart);
  CHECK(impostor.status().code() == absl::StatusCode::kUnavailable);
  absl::StatusOr<NodeRoster::Admission> third =
      roster.Admit(NODE_ROLE_WORKER, "h:9", kToken, kStart);
  CHECK(third.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(roster.CountRole(NODE_ROLE_WORKER) == 2);
  CHECK(roster.FinisherRank() == 0);
}

TEST_CASE("the roster refills a dead node's slot, preferring the one last at that address") {
  NodeRoster roster(TwoByTwo());
  for (const char* address : {"h:1", "h:2"})
    REQUIRE(roster.Admit(NODE_ROLE_WORKER, address, kToken, kStart).ok());
  roster.Find("worker-0")->alive = false;
  roster.Find("worker-1")->alive = false;
  CHECK(roster.FinisherRank() == -1);
  CHECK(roster.ActiveWorkers() == std::vector<bool>{false, false});
  NodeRoster::Admission back = roster.Admit(NODE_ROLE_WORKER, "h:2", kOtherToken, kStart).value();
  CHECK(back.rejoined);
  CHECK(back.node->name == "worker-1");
  CHECK(back.node->token_sha256 == kOtherToken);
  CHECK(roster.ActiveWorkers() == std::vector<bool>{false, true});
  CHECK(roster.LiveWorkers() == 1);
}

TEST_CASE("the roster names the nodes silent past the timeout, the job's stopped ones excepted") {
  NodeRoster roster(TwoByTwo());
  REQUIRE(roster.Admit(NODE_ROLE_SERVER, "h:1", kToken, kStart).ok());
  REQUIRE(roster.Admit(NODE_ROLE_WORKER, "h:2", kToken, kStart + absl::Seconds(2)).ok());
  const auto silent = roster.Silent(kStart + absl::Seconds(4), absl::Seconds(3), false);
  REQUIRE(silent.size() == 1);
  CHECK(silent[0].first == "ps-0");
  CHECK(silent[0].second == absl::Seconds(4));
  roster.Find("ps-0")->told_to_stop = true;
  CHECK(roster.Silent(kStart + absl::Seconds(4), absl::Seconds(3), /*job_over=*/true).empty());
}

TEST_CASE("the roster's saved nodes are checked before they are taken") {
  NodeRoster roster(TwoByTwo());
  SchedulerState state;
  SchedulerNodeState* node = state.add_nodes();
  node->set_name("ps-0");
  node->set_role(NODE_ROLE_SERVER);
  node->set_rank(2);  // the spec has 2 servers: ranks 0 and 1
  std::set<std::string> names;
  CHECK(roster.CheckSaved(state, &names).code() == absl::StatusCode::kDataLoss);
  node->set_rank(1);
  names.clear();
  REQUIRE(roster.CheckSaved(state, &names).ok());
  roster.Import(state, kStart);
  CHECK(roster.Find("ps-0")->last_heartbeat == kStart);
  SchedulerState exported;
  roster.Export(&exported);
  CHECK(exported.nodes(0).rank() == 1);
}

TEST_CASE("job progress refuses a heartbeat's figures out of range, naming them") {
  HeartbeatRequest request;
  request.set_node_name("worker-0");
  CHECK(JobProgress::CheckHeartbeatFigures(request).ok());
  request.mutable_progress()->set_steps_per_sec(-1);
  CHECK(absl::StrContains(JobProgress::CheckHeartbeatFigures(request).message(),
                          "heartbeat from 'worker-0': progress total_steps"));
  request.mutable_progress()->set_steps_per_sec(1);
  request.mutable_progress()->set_test_auc(1.5);
  CHECK(absl::StrContains(JobProgress::CheckHeartbeatFigures(request).message(), "test_auc 1.5"));
  request.mutable_progress()->set_test_auc(0.5);
  request.set_refused_gradients(-3);
  CHECK(absl::StrContains(JobProgress::CheckHeartbeatFigures(request).message(),
                          "refused_gradients -3"));
}

TEST_CASE("job progress keeps each worker's curve, thinned past its bound") {
  JobProgress progress(/*ctr=*/true);
  NodeProgress point;
  point.set_test_auc(0.75);
  int64_t previous = 0;
  for (int64_t step = 1; step <= static_cast<int64_t>(2 * JobProgress::kMaxHistoryPoints + 1);
       ++step) {
    point.set_step(step);
    progress.RecordWorkerProgress("worker-0", previous, point, kStart + absl::Seconds(step));
    previous = step;
  }
  // No step past the last: not a point, and not an advance.
  progress.RecordWorkerProgress("worker-0", previous, point, kStart + absl::Hours(1));
  const std::vector<ProgressPoint>& curve = progress.history().at("worker-0");
  CHECK(curve.size() <= JobProgress::kMaxHistoryPoints);
  CHECK(curve.front().step() == 1);               // thinning keeps the start
  CHECK(curve.front().test_accuracy() == 0.75f);  // a ctr model's score is its AUC
  CHECK(progress.last_advance() == kStart + absl::Seconds(previous));
}

TEST_CASE("job progress sums the workers' throughput into the result, once") {
  JobProgress progress(false);
  std::vector<RegistryNode> nodes(3);
  nodes[0].role = NODE_ROLE_WORKER;
  nodes[0].summary.set_samples(600);
  nodes[0].summary.set_seconds(2);
  nodes[0].summary.set_steps(10);
  nodes[1].role = NODE_ROLE_WORKER;
  nodes[1].summary.set_samples(400);
  nodes[1].summary.set_seconds(4);
  nodes[1].summary.set_steps(12);
  nodes[2].role = NODE_ROLE_SERVER;
  nodes[2].summary.set_samples(999999);  // not a worker's: not counted
  ReportResultRequest request;
  request.set_test_accuracy(1.25);
  CHECK(progress.SetResult(request, "worker-0", nodes, kStart).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK_FALSE(progress.over());
  request.set_test_accuracy(0.875);
  JobResult result = progress.SetResult(request, "worker-0", nodes, kStart).value();
  CHECK(result.samples_per_sec == (600.0 + 400.0) / 4);  // over the longest worker's time
  CHECK(result.steps == 12);
  CHECK(progress.over());
  request.set_test_accuracy(0.5);  // a later report: the first result stands
  CHECK(progress.SetResult(request, "worker-1", nodes, kStart).value().test_accuracy == 0.875);
  CHECK(progress.result_reporter() == "worker-0");
  CHECK(progress.RequestShutdown());
  CHECK_FALSE(progress.RequestShutdown());  // already requested
}

TEST_CASE(
    "a slot keeps what its earlier processes trained; the slot's own process coming back is "
    "counted once") {
  NodeRoster roster(TwoByTwo());
  const std::string first_token(64, 'c'), second_token(64, 'd'), third_token(64, 'e');
  REQUIRE(roster.Admit(NODE_ROLE_WORKER, "h:1", first_token, kStart).ok());
  REQUIRE(roster.Admit(NODE_ROLE_WORKER, "h:2", kToken, kStart).ok());
  RegistryNode* slot = roster.Find("worker-0");
  slot->progress.set_samples(100);  // its last heartbeat before it was killed
  slot->progress.set_training_seconds(2);
  slot->alive = false;
  // A new process (a restart: it has no previous token) takes the slot over.
  NodeRoster::Admission restarted =
      roster.Admit(NODE_ROLE_WORKER, "h:1", second_token, kStart).value();
  CHECK(restarted.rejoined);
  CHECK_FALSE(restarted.same_process);
  CHECK(restarted.node->earlier_samples == 100);
  CHECK(restarted.node->earlier_processes == 1);
  CHECK(restarted.node->progress.samples() == 0);  // the new process counts its own
  restarted.node->progress.set_samples(30);
  restarted.node->progress.set_training_seconds(1);
  restarted.node->alive = false;  // stopped past the failure timeout, then woken
  // It registers again with its last token (the roster sees digests): the same process,
  // whose figures go on.
  NodeRoster::Admission back =
      roster.Admit(NODE_ROLE_WORKER, "h:1", third_token, kStart, second_token).value();
  CHECK(back.same_process);
  CHECK(back.node->earlier_samples == 100);
  CHECK(back.node->progress.samples() == 30);
  back.node->summary.set_samples(70);  // it finished: its summary covers its whole life
  back.node->summary.set_seconds(3);
  back.node->finished = true;
  const SlotTraining trained = TrainedBy(*back.node);
  CHECK(trained.samples == 170);
  CHECK(trained.seconds == 5);
  CHECK(trained.processes == 2);
  // A previous token that is not the slot's own is a new process.
  back.node->alive = false;
  NodeRoster::Admission impostor =
      roster.Admit(NODE_ROLE_WORKER, "h:1", kOtherToken, kStart, first_token).value();
  CHECK_FALSE(impostor.same_process);
  CHECK(impostor.node->earlier_samples == 170);
  // The result counts every process: this slot's 170 samples over 5 s, the other's 40.
  roster.Find("worker-1")->summary.set_samples(40);
  roster.Find("worker-1")->summary.set_seconds(4);
  JobProgress progress(false);
  ReportResultRequest request;
  request.set_test_accuracy(0.5);
  const JobResult result = progress.SetResult(request, "worker-1", roster.nodes(), kStart).value();
  CHECK(result.samples == 210);
  CHECK(result.worker_processes == 3);
  CHECK(result.samples_per_sec == 210.0 / 5);
}

ShardMap TwoShards() {
  ShardMap map;
  for (int id = 0; id < 2; ++id) {
    ShardAssignment* shard = map.add_shards();
    shard->set_shard_id(id);
    shard->set_server_name(id == 0 ? "ps-0" : "ps-1");
  }
  return map;
}

HeartbeatRequest Report(int shard, int64_t applied, int64_t checkpoint, bool backup = false) {
  HeartbeatRequest request;
  ShardStatus* status = request.add_shards();
  status->set_shard_id(shard);
  status->set_applied_updates(applied);
  status->set_checkpoint_step(checkpoint);
  status->set_backup(backup);
  return request;
}

TEST_CASE("shard records keep only what a shard's primary reports") {
  const ShardMap map = TwoShards();
  ShardRecords records;
  records.Record("ps-0", Report(1, 50, 40), map, kStart);        // not its shard
  records.Record("ps-1", Report(1, 60, 40, true), map, kStart);  // a backup's report
  records.Record("ps-0", Report(7, 50, 40), map, kStart);        // no such shard
  CHECK(records.records().empty());
  records.Record("ps-0", Report(0, 50, 40), map, kStart);
  REQUIRE(records.records().size() == 1);
  CHECK(records.records().at(0).applied_updates == 50);
}

TEST_CASE("shard records: the checkpoints to keep, and a step ahead at the update rate") {
  const ShardMap map = TwoShards();
  ShardRecords records;
  records.Record("ps-0", Report(0, 100, 80), map, kStart);
  CHECK(records.RetainFrom(map) == -1);  // shard 1 has not reported
  records.Record("ps-1", Report(1, 100, -1), map, kStart);
  CHECK(records.RetainFrom(map) == -1);  // shard 1 has no checkpoint yet
  records.Record("ps-1", Report(1, 200, 60), map, kStart + absl::Seconds(10));
  CHECK(records.RetainFrom(map) == 60);
  // 100 updates in 10 s since the first report: 10 a second; 5 s ahead, plus 10.
  CHECK(records.StepAfter(kStart + absl::Seconds(10), absl::Seconds(5)) == 200 + 50 + 10);
}

TEST_CASE("shard records of a hybrid job: a step ahead from the dense shards, not the tables") {
  ShardMap map = TwoShards();
  map.mutable_shards(1)->set_kind(SHARD_KIND_EMBEDDING_ROWS);  // an async table: pushes
  ShardRecords records(/*async_tables=*/true);
  records.Record("ps-1", Report(1, 5000, 4000), map, kStart);  // first, but not a step count
  records.Record("ps-0", Report(0, 100, 80), map, kStart);
  records.Record("ps-0", Report(0, 200, 180), map, kStart + absl::Seconds(10));
  records.Record("ps-1", Report(1, 9000, 8000), map, kStart + absl::Seconds(10));
  CHECK(records.records().at(1).applied_updates == 9000);  // recorded all the same
  CHECK(records.StepAfter(kStart + absl::Seconds(10), absl::Seconds(5)) == 200 + 50 + 10);
}

}  // namespace
}  // namespace paramserver
