// data.sharding: dynamic through ps_worker, real processes on 127.0.0.1: a worker killed
// -9 in the middle of a lease and another joining in its place, and every example of
// every epoch is trained exactly once (the workers' test-only log of the examples each
// acknowledged batch held: worker/data_leaser.h, NoteTrainedBatch); and with the scheduler
// killed -9 and restarted from its state file mid-run.
#include <signal.h>
#include <stdlib.h>

#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/testing/local_cluster.h"
#include "common/testing/temp_dir.h"
#include "tests/cluster_config.h"

namespace paramserver {
namespace {

constexpr int kExamples = 60000;  // Fashion-MNIST's training set: 1875 batches of 32
constexpr int kEpochs = 2;
constexpr int kChunkBatches = 20;
constexpr int kVictimBatches = 30;  // the victim stops 10 batches into its second lease

TestJob DynamicJob() {
  TestJob job;
  job.mode = "async";
  job.servers = 2;
  job.workers = 2;
  job.shards = 4;
  job.max_steps = 0;
  job.epochs = kEpochs;
  job.data_sharding = "dynamic";
  job.chunk_batches = kChunkBatches;
  job.failure_timeout_ms = 2000;
  return job;
}

// The process state letter of `pid` ('T': stopped), from /proc.
char ProcessState(pid_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  return close == std::string::npos || close + 2 >= text.size() ? '?' : text[close + 2];
}

// epoch -> example -> how many acknowledged batches held it.
std::map<int, std::map<int64_t, int>> ReadTrainedLog(const std::string& path) {
  std::map<int, std::map<int64_t, int>> trained;
  std::ifstream log(path);
  std::string line;
  while (std::getline(log, line)) {
    std::istringstream fields(line);
    int epoch = -1;
    fields >> epoch;
    int64_t example = 0;
    while (fields >> example) ++trained[epoch][example];
  }
  return trained;
}

void CheckEachExampleOnce(const std::string& trained_log);

TEST_CASE("dynamic data: a worker killed mid-lease, another joining, every example once") {
  TempDir dir;
  const TestJob job = DynamicJob();
  const std::string config = dir.WriteFile("job.yaml", TestJobYaml(job));
  const std::string trained_log = dir.File("trained.log");
  // Children inherit the environment: the victim alone stops itself after its 30th batch.
  REQUIRE(setenv("PS_TEST_TRAINED_IDS_LOG", trained_log.c_str(), 1) == 0);
  absl::StatusOr<std::unique_ptr<LocalCluster>> started =
      LocalCluster::Start(config, dir.path(), job.servers, /*workers=*/0);
  REQUIRE(started.ok());
  LocalCluster& cluster = **started;
  REQUIRE(setenv("PS_TEST_STOP_AFTER_BATCHES", absl::StrCat(kVictimBatches).c_str(), 1) == 0);
  REQUIRE(cluster.StartWorker(dir.File("victim.log")).ok());
  REQUIRE(unsetenv("PS_TEST_STOP_AFTER_BATCHES") == 0);
  REQUIRE(cluster.StartWorker(dir.File("worker.log")).ok());
  ChildProcess& victim = cluster.processes()[cluster.processes().size() - 2];
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (ProcessState(victim.pid()) != 'T' && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(20));
  INFO(victim.ReadLog());
  REQUIRE(ProcessState(victim.pid()) == 'T');
  victim.Kill(SIGKILL);
  // Another worker joins in its place once the scheduler has counted it out.
  REQUIRE(
      WaitForLoggedNumber(cluster.scheduler(), R"(epoch (\d+): worker-\d lost)", absl::Seconds(60))
          .ok());
  REQUIRE(cluster.StartWorker(dir.File("joined.log")).ok());
  const absl::Status finished = cluster.WaitForAll(absl::Seconds(240));
  const std::string scheduler_log = cluster.scheduler().ReadLog();
  INFO(scheduler_log);
  REQUIRE(finished.ok());
  REQUIRE(unsetenv("PS_TEST_TRAINED_IDS_LOG") == 0);
  // The victim's second lease was settled from the servers' reports: 10 of its 20
  // batches trained, the rest handed on.
  CHECK(scheduler_log.find(absl::StrCat("10 of its ", kChunkBatches,
                                        " batches are trained; the rest goes to the next "
                                        "worker to ask")) != std::string::npos);
  CHECK(cluster.FinalValue("test_accuracy") > 0.75);

  CheckEachExampleOnce(trained_log);
}

// Every example of every epoch exactly once, from the log: none skipped, none twice (the
// examples are 0 .. kExamples - 1, so kExamples distinct ones are all of them).
void CheckEachExampleOnce(const std::string& trained_log) {
  const std::map<int, std::map<int64_t, int>> trained = ReadTrainedLog(trained_log);
  REQUIRE(trained.size() == kEpochs);
  for (const auto& [epoch, counts] : trained) {
    INFO("epoch " << epoch);
    CHECK(counts.size() == kExamples);
    int64_t twice = 0;
    int64_t out_of_range = 0;
    for (const auto& [example, count] : counts) {
      twice += count != 1;
      out_of_range += example < 0 || example >= kExamples;
    }
    CHECK(twice == 0);
    CHECK(out_of_range == 0);
  }
}

TEST_CASE("dynamic data: the scheduler killed -9 and restarted mid-run, every example once") {
  TempDir dir;
  const std::string config = dir.WriteFile("job.yaml", TestJobYaml(DynamicJob()));
  const std::string trained_log = dir.File("trained.log");
  REQUIRE(setenv("PS_TEST_TRAINED_IDS_LOG", trained_log.c_str(), 1) == 0);
  absl::StatusOr<std::unique_ptr<LocalCluster>> started = LocalCluster::Start(
      config, dir.path(), 2, 2, {}, {"--state_file", dir.File("scheduler.state")});
  REQUIRE(started.ok());
  LocalCluster& cluster = **started;
  // Mid-way through the first epoch (1875 batches).
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (ReadTrainedLog(trained_log)[0].size() < 400 * 32 && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(20));
  cluster.scheduler().Kill(SIGKILL);
  absl::SleepFor(absl::Milliseconds(500));  // the workers ask for leases meanwhile, and retry
  REQUIRE(cluster.RestartScheduler(dir.File("scheduler-restarted.log")).ok());
  const absl::Status finished = cluster.WaitForAll(absl::Seconds(240));
  const std::string scheduler_log = cluster.scheduler().ReadLog();
  INFO(scheduler_log);
  REQUIRE(finished.ok());
  REQUIRE(unsetenv("PS_TEST_TRAINED_IDS_LOG") == 0);
  CHECK(scheduler_log.find("took over the running job") != std::string::npos);
  CheckEachExampleOnce(trained_log);
}

}  // namespace
}  // namespace paramserver
