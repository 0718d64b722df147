// Backup workers in a sync job (training.sync.backup_workers: 1 of 3 workers), real
// processes on 127.0.0.1: one worker is stopped (SIGSTOP) three times for 1.5 s, well
// inside the failure timeout, so it is never declared dead. The other two complete every
// step meanwhile; the stopped one's pushes come late, are dropped and counted by the
// servers, and it goes on at the servers' step. The job finishes with every shard at the
// job's step count and a model that learned.
#include <algorithm>
#include <csignal>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "common/testing/local_cluster.h"
#include "common/testing/temp_dir.h"
#include "tests/cluster_config.h"

namespace paramserver {
namespace {

constexpr int kSteps = 3000;

// Every number that `pattern`'s first group captures in `log`.
std::vector<int64_t> Captured(const std::string& log, const std::string& pattern) {
  std::vector<int64_t> numbers;
  const std::regex re(pattern);
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator();
       ++it) {
    numbers.push_back(std::stoll((*it)[1].str()));
  }
  return numbers;
}

TEST_CASE(
    "backup workers: a stopped worker's steps complete without it; its late pushes are "
    "dropped, counted, and it goes on at the servers' step") {
  TempDir dir;
  TestJob job;
  job.workers = 3;
  job.backup_workers = 1;
  job.shards = 4;
  job.max_steps = kSteps;
  job.epochs = 5;                 // 625 steps each: kSteps caps them
  job.failure_timeout_ms = 6000;  // the 1.5 s stops are never taken for a death
  const std::string config = dir.WriteFile("job.yaml", TestJobYaml(job));
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(config, dir.path(), job.servers, job.workers);
  REQUIRE(cluster.ok());
  REQUIRE(WaitForLoggedNumber((*cluster)->scheduler(), R"(cluster complete: (\d+) servers)",
                              absl::Seconds(60))
              .ok());
  // [scheduler, 2 servers, 3 workers]: the last worker process is the straggler.
  ChildProcess& straggler = (*cluster)->processes()[1 + job.servers + 2];
  for (int round = 0; round < 3; ++round) {
    absl::SleepFor(absl::Seconds(1));
    straggler.Kill(SIGSTOP);
    absl::SleepFor(absl::Milliseconds(1500));
    straggler.Kill(SIGCONT);
  }
  const absl::Status finished = (*cluster)->WaitForAll(absl::Seconds(300));
  const std::string scheduler_log = (*cluster)->scheduler().ReadLog();
  const std::string straggler_log = straggler.ReadLog();
  INFO(scheduler_log);
  INFO(straggler_log);
  INFO(finished.ToString());
  REQUIRE(finished.ok());
  CHECK(scheduler_log.find(" lost") == std::string::npos);  // never declared dead
  // The straggler's pushes after a stop were late, the others having gone on by many
  // steps, and it went on at their step.
  const std::regex late(R"(the push of step (\d+) was late on every shard .* going on at )"
                        R"(step (\d+))");
  long long longest_jump = 0;  // NOLINT: std::stoll's type
  for (auto it = std::sregex_iterator(straggler_log.begin(), straggler_log.end(), late);
       it != std::sregex_iterator(); ++it) {
    longest_jump = std::max(longest_jump, std::stoll((*it)[2].str()) - std::stoll((*it)[1].str()));
  }
  CHECK(longest_jump > 10);
  int64_t late_pushes = 0;
  for (int s = 1; s <= job.servers; ++s) {
    const std::string log = (*cluster)->processes()[s].ReadLog();
    for (int64_t n : Captured(log, R"((\d+) late pushes dropped)")) late_pushes += n;
    // Every primary shard applied exactly the job's steps, whoever pushed them.
    for (int64_t n : Captured(log, R"(: (\d+) updates applied)")) CHECK(n == kSteps);
  }
  CHECK(late_pushes > 0);
  CHECK((*cluster)->FinalValue("test_accuracy") > 0.7);
}

}  // namespace
}  // namespace paramserver
