// Jobs that cannot finish end, saying why, rather than hang. A job that loses every
// worker: the scheduler says it waits for one, for how long, and gives up at
// cluster.no_worker_timeout_ms (exit 3, every node told to stop); a worker that joins in
// time ends the wait and the job finishes. A job that loses a server holding the only
// state of its shards (no backup, no checkpoint.dir) ends at once. Real processes on
// 127.0.0.1.
#include <csignal>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/testing/local_cluster.h"
#include "common/testing/temp_dir.h"
#include "tests/cluster_config.h"

namespace paramserver {
namespace {

constexpr int kFailureTimeoutMs = 1000;

// One server and one worker; the worker's loss leaves the job with none.
TestJob OneWorkerJob(const TempDir& dir, int no_worker_timeout_ms, int max_steps) {
  TestJob job;
  job.servers = 1;
  job.workers = 1;
  job.shards = 2;
  job.max_steps = max_steps;
  job.epochs = 100;  // max_steps decides
  job.failure_timeout_ms = kFailureTimeoutMs;
  job.no_worker_timeout_ms = no_worker_timeout_ms;
  job.checkpoint_dir = dir.File("checkpoints");
  job.checkpoint_every_steps = 50;  // the files say how far training went
  return job;
}

std::unique_ptr<LocalCluster> StartTraining(const TestJob& job, const TempDir& dir) {
  const std::string config = dir.WriteFile("job.yaml", TestJobYaml(job));
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(config, dir.path(), job.servers, job.workers);
  REQUIRE(cluster.ok());
  REQUIRE(WaitForCheckpoint(job.checkpoint_dir, 100).ok());
  return *std::move(cluster);
}

TEST_CASE("a job left with no worker says it waits, then ends at its no-worker timeout") {
  TempDir dir;
  constexpr int kNoWorkerTimeoutMs = 8000;
  std::unique_ptr<LocalCluster> cluster =
      StartTraining(OneWorkerJob(dir, kNoWorkerTimeoutMs, 1000000), dir);
  cluster->processes()[2].Kill(SIGKILL);  // [scheduler, server, worker]
  const absl::Time killed_at = absl::Now();
  // A deadline, not a speed test: declared dead after the failure timeout, then the wait.
  const absl::Time deadline = killed_at + absl::Milliseconds(kFailureTimeoutMs) +
                              absl::Milliseconds(kNoWorkerTimeoutMs) + absl::Seconds(30);
  absl::StatusOr<int> scheduler_exit = cluster->scheduler().WaitForExit(deadline);
  const std::string log = cluster->scheduler().ReadLog();
  INFO(log);
  REQUIRE(scheduler_exit.ok());
  CHECK(*scheduler_exit == 3);  // kExitJobEndedUnfinished: systemd does not restart it
  CHECK(absl::Now() - killed_at >= absl::Milliseconds(kNoWorkerTimeoutMs));
  CHECK(log.find("no worker is alive: the job waits for one to join (0 s so far; it gives up "
                 "at 8 s, cluster.no_worker_timeout_ms)") != std::string::npos);
  CHECK(log.find("(5 s so far; it gives up at 8 s") != std::string::npos);
  CHECK(log.find("no worker joined within 8 s (cluster.no_worker_timeout_ms) after the last one "
                 "was lost: the job cannot finish; telling every node to stop") !=
        std::string::npos);
  CHECK(log.find("job ended unfinished; every node has been told to stop") != std::string::npos);
  // The server was told to stop, and did.
  absl::StatusOr<int> server_exit = cluster->processes()[1].WaitForExit(deadline);
  INFO(cluster->processes()[1].ReadLog());
  REQUIRE(server_exit.ok());
  CHECK(*server_exit == 0);
}

TEST_CASE("a worker that joins while the job waits for one ends the wait, and the job finishes") {
  TempDir dir;
  // Long enough that the kill comes mid-run on a fast machine too (it comes at step 100).
  std::unique_ptr<LocalCluster> cluster = StartTraining(OneWorkerJob(dir, 60000, 3000), dir);
  cluster->processes()[2].Kill(SIGKILL);
  REQUIRE(WaitForLoggedNumber(cluster->scheduler(), R"(the job waits for one to join \((\d+) s)",
                              absl::Seconds(30))
              .ok());
  REQUIRE(cluster->StartWorker(dir.File("worker-replacement.log")).ok());
  const absl::Status finished = cluster->WaitForAll(absl::Seconds(120));
  const std::string log = cluster->scheduler().ReadLog();
  INFO(finished.ToString() << "\n" << log);
  REQUIRE(finished.ok());
  CHECK(log.find("no worker joined within") == std::string::npos);
  CHECK(log.find("job finished; every node has been told to stop") != std::string::npos);
  CHECK(cluster->FinalValue("steps") == 3000);
}

TEST_CASE(
    "a server lost with its shards' only state (no backup, no checkpoint.dir) ends the job, "
    "saying why") {
  TempDir dir;
  TestJob job;
  job.servers = 2;
  job.workers = 1;
  job.shards = 4;
  job.replication = 1;
  job.max_steps = 1000000;
  job.epochs = 100;  // max_steps decides: the job trains until the kill
  job.failure_timeout_ms = kFailureTimeoutMs;
  absl::StatusOr<std::unique_ptr<LocalCluster>> started =
      LocalCluster::Start(dir.WriteFile("job.yaml", TestJobYaml(job)), dir.path(), 2, 1);
  REQUIRE(started.ok());
  LocalCluster& cluster = **started;
  // [scheduler, server, server, worker]: training has begun.
  REQUIRE(
      WaitForLoggedNumber(cluster.processes()[3], R"(training steps (\d+)\.\.)", absl::Seconds(60))
          .ok());
  cluster.processes()[2].Kill(SIGKILL);
  // A deadline, not a speed test: declared dead after the failure timeout, then at once.
  const absl::Time deadline =
      absl::Now() + absl::Milliseconds(kFailureTimeoutMs) + absl::Seconds(30);
  absl::StatusOr<int> scheduler_exit = cluster.scheduler().WaitForExit(deadline);
  const std::string log = cluster.scheduler().ReadLog();
  INFO(log);
  REQUIRE(scheduler_exit.ok());
  CHECK(*scheduler_exit == 3);  // kExitJobEndedUnfinished: systemd does not restart it
  CHECK(log.find("had no other copy and cannot be restored: checkpoint.dir is not set "
                 "(cluster.replication >= 2 or checkpoint.dir would have kept them); the job "
                 "cannot go on; telling every node to stop") != std::string::npos);
  CHECK(log.find("job ended unfinished; every node has been told to stop") != std::string::npos);
  // The surviving server and the worker were told to stop, and did.
  for (int i : {1, 3}) {
    ChildProcess& process = cluster.processes()[i];
    absl::StatusOr<int> exit = process.WaitForExit(deadline + absl::Seconds(30));
    INFO(process.ReadLog());
    REQUIRE(exit.ok());
    CHECK(*exit == 0);  // told to stop, they did: no error of theirs
    CHECK(process.ReadLog().find("the scheduler shut the job down (psctl shutdown, or a loss it "
                                 "cannot recover from: its log says which)") != std::string::npos);
  }
}

}  // namespace
}  // namespace paramserver
