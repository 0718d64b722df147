// psctl against a real local cluster on 127.0.0.1: the read commands in both forms, a
// stopped server seen as suspect and then dead, the admin token on the calls that change
// the job, a drain, and a clean shutdown of the whole job.
#include <signal.h>

#include <functional>
#include <regex>
#include <thread>

#include "catch2/catch.hpp"
#include "common/testing/local_cluster.h"
#include "common/testing/temp_dir.h"
#include "tests/cluster_config.h"
#include "tests/psctl_runner.h"

namespace paramserver {
namespace {

// The line of the node table that starts with `node`.
std::string NodeLine(const std::string& table, const std::string& node) {
  const size_t at = table.find("\n" + node + " ");
  if (at == std::string::npos) return "";
  return table.substr(at + 1, table.find('\n', at + 1) - at - 1);
}

// Polls `psctl status` until `shows` holds for its output (60 s at most).
Result WaitForStatus(const TempDir& dir, const std::string& scheduler, const std::string& what,
                     const std::function<bool(const std::string&)>& shows) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  Result status;
  while (absl::Now() < deadline) {
    status = Psctl(dir, scheduler, {"status"});
    if (status.code == 0 && shows(status.output)) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  FAIL("psctl status never showed " << what << "; last output:\n" << status.output);
  return status;
}

Result WaitForStatus(const TempDir& dir, const std::string& scheduler, const std::string& text) {
  return WaitForStatus(dir, scheduler, "'" + text + "'", [&](const std::string& output) {
    return output.find(text) != std::string::npos;
  });
}

bool AllAlive(const std::string& output) {
  for (const char* node : {"ps-0", "ps-1", "worker-0", "worker-1"}) {
    if (NodeLine(output, node).find(" alive ") == std::string::npos) return false;
  }
  return output.rfind("training\n", 0) == 0;
}

// Checks the read commands against a training job whose `status` was just read: the
// nodes, the shards, the progress, the same as JSON, and a scheduler named by DNS.
void CheckReadCommands(const TempDir& dir, const std::string& scheduler, const Result& status) {
  CHECK(status.output.find("mode sync, replication 2") != std::string::npos);
  CHECK(status.output.find("slowest worker-") != std::string::npos);
  Result shards = Psctl(dir, scheduler, {"shards"});
  REQUIRE(shards.code == 0);
  CHECK(shards.output.rfind("SHARD  PRIMARY  BACKUPS  PARAMETERS  APPLIED  CHECKPOINT\n", 0) == 0);
  CHECK(std::count(shards.output.begin(), shards.output.end(), '\n') == 1 + 8);
  CHECK(shards.output.find("\n0      ps-0     ps-1") != std::string::npos);
  // 100 epochs of 937 steps (max_steps is higher): the total, and an ETA once the
  // workers have a rate.
  WaitForStatus(dir, scheduler, "the progress against the total", [](const std::string& output) {
    return std::regex_search(output, std::regex("\nstep [0-9]+ of 93700 \\([0-9]+%\\), ETA [0-9]"));
  });
  Result json = Psctl(dir, scheduler, {"--json", "status"});
  REQUIRE(json.code == 0);
  CHECK(json.output.find("\"verdict\": \"training\"") != std::string::npos);
  // The table's words and JSON numbers (protobuf's own mapping would print
  // "NODE_HEALTH_ALIVE" and 64-bit integers as strings).
  CHECK(json.output.find("\"health\": \"alive\"") != std::string::npos);
  CHECK(json.output.find("\"role\": \"worker\"") != std::string::npos);
  CHECK(std::regex_search(json.output, std::regex("\"map_version\": [1-9][0-9]*,")));
  CHECK(std::regex_search(json.output, std::regex("\"total_steps\": 93700,")));
  CHECK(std::regex_search(json.output, std::regex("\"step\": [0-9]+,")));
  CHECK(status.output.find("map version ") != std::string::npos);
  Result json_shards = Psctl(dir, scheduler, {"shards", "--json"});
  REQUIRE(json_shards.code == 0);
  CHECK(json_shards.output.rfind("[\n", 0) == 0);  // a JSON array of shards
  CHECK(json_shards.output.find("\"backups\": [") != std::string::npos);
  CHECK(json_shards.output.find("\"verdict\"") == std::string::npos);
  CHECK(Psctl(dir, scheduler, {"nodes"}).output.find("worker-1  worker") != std::string::npos);
  // The scheduler's address may be a DNS name (every channel resolves names the same way).
  const std::string by_name = "localhost:" + scheduler.substr(scheduler.rfind(':') + 1);
  CHECK(Psctl(dir, by_name, {"status"}).output.rfind("training\n", 0) == 0);
}

// Checks that `psctl checkpoint` is refused without the admin token and with a wrong one,
// and taken with the right one.
void CheckCheckpointNeedsTheToken(const TempDir& dir, const std::string& scheduler,
                                  const std::string& wrong_token,
                                  const std::string& admin_token_file) {
  // Changes need the token: none, a wrong one, the right one.
  Result anonymous = Psctl(dir, scheduler, {"checkpoint"});
  CHECK(anonymous.code == 1);
  CHECK(anonymous.output.find(
            "psctl: checkpoint: UNAUTHENTICATED: checkpoint needs the admin token") == 0);
  Result wrong = Psctl(dir, scheduler, {"--token-file", wrong_token, "checkpoint"});
  CHECK(wrong.code == 1);
  CHECK(wrong.output == "psctl: checkpoint: PERMISSION_DENIED: checkpoint: wrong admin token\n");
  Result checkpoint = Psctl(dir, scheduler, {"--token-file", admin_token_file, "checkpoint"});
  INFO("psctl checkpoint: " << checkpoint.output);
  CHECK(checkpoint.code == 0);
  CHECK(checkpoint.output.rfind("checkpoint: every shard writes one at step ", 0) == 0);
}

TEST_CASE("psctl shows a running job, guards changes with the token, and shuts the job down") {
  TempDir dir;
  TestJob job;
  job.mode = "sync";
  job.max_steps = 100000;  // trains until the test shuts it down
  job.epochs = 100;
  job.heartbeat_interval_ms = 200;
  job.failure_timeout_ms = 2000;
  job.checkpoint_dir = dir.File("checkpoints");
  job.admin_token_file = dir.WriteSecretFile("admin.token", kTestAdminToken);
  const std::string wrong_token = dir.WriteSecretFile("wrong.token", "not-the-admin-token-000");
  const std::string config = dir.WriteFile("job.yaml", TestJobYaml(job));
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(config, dir.path(), 2, 2);
  REQUIRE(cluster.ok());
  const std::string scheduler = (*cluster)->scheduler_address();

  // Reads: the verdict, the nodes, the shards, and the same as JSON.
  Result status = WaitForStatus(dir, scheduler, "every node alive, training", AllAlive);
  INFO(status.output);
  CheckReadCommands(dir, scheduler, status);

  CheckCheckpointNeedsTheToken(dir, scheduler, wrong_token, job.admin_token_file);
  CHECK((*cluster)->scheduler().ReadLog().find(
            "(admin_permission): PERMISSION_DENIED: checkpoint: wrong admin token") !=
        std::string::npos);

  // A stopped server: suspect first, then dead; back after SIGCONT.
  ChildProcess& server = (*cluster)->processes()[1];
  server.Kill(SIGSTOP);
  Result suspect = WaitForStatus(dir, scheduler, " suspect ");
  Result dead = WaitForStatus(dir, scheduler, " dead ");
  server.Kill(SIGCONT);
  CHECK(suspect.output.find("training") == 0);

  // A drain of a node that is not a live server is refused; then the whole job shuts
  // down and every process exits 0. (A real drain is tested in fault_tolerance_test.)
  Result bad_drain = Psctl(dir, scheduler, {"--token-file", job.admin_token_file, "drain", "ps-9"});
  CHECK(bad_drain.code == 1);
  CHECK(bad_drain.output.find("NOT_FOUND: ps-9 is not a live server") != std::string::npos);
  WaitForStatus(dir, scheduler, "every node alive again", AllAlive);
  // Scale-out says what to start; scale-in drains the highest-ranked server and waits
  // until it has left.
  Result more =
      Psctl(dir, scheduler, {"--token-file", job.admin_token_file, "--servers", "3", "scale"});
  CHECK(more.code == 0);
  CHECK(more.output.rfind("scale: 2 live servers; start 1 more", 0) == 0);
  Result fewer =
      Psctl(dir, scheduler, {"--token-file", job.admin_token_file, "--servers", "1", "scale"});
  INFO(fewer.output);
  CHECK(fewer.code == 0);
  CHECK(fewer.output.rfind("scale: draining ps-1 (its shards move at epoch ", 0) == 0);
  CHECK(fewer.output.find("\nscale: 1 live servers\n") != std::string::npos);
  Result shutdown = Psctl(dir, scheduler, {"--token-file", job.admin_token_file, "shutdown"});
  CHECK(shutdown.code == 0);
  absl::Status finished = (*cluster)->WaitForAll(absl::Seconds(60));
  INFO(finished.ToString());
  CHECK(finished.ok());
  CHECK((*cluster)->scheduler().ReadLog().find("shutdown of the whole job requested") !=
        std::string::npos);
}

TEST_CASE(
    "psctl says in one line when the scheduler cannot be reached, and explains usage errors") {
  TempDir dir;
  Result unreachable = Psctl(dir, "127.0.0.1:1", {"status"});
  CHECK(unreachable.code == 1);
  CHECK(unreachable.output.rfind("psctl: scheduler at 127.0.0.1:1: UNAVAILABLE: ", 0) == 0);
  CHECK(std::count(unreachable.output.begin(), unreachable.output.end(), '\n') == 1);
  Result usage = Psctl(dir, "127.0.0.1:1", {"frobnicate"});
  CHECK(usage.code == 2);
  CHECK(usage.output.rfind("psctl: unknown command frobnicate\nusage: psctl", 0) == 0);
  CHECK(Psctl(dir, "127.0.0.1:1", {"drain"}).code == 2);
  Result no_count = Psctl(dir, "127.0.0.1:1", {"scale"});
  CHECK(no_count.code == 2);
  CHECK(no_count.output.rfind("psctl: scale takes --servers N (N >= 1)\n", 0) == 0);
  CHECK(Psctl(dir, "127.0.0.1:1", {"--servers", "0", "scale"}).code == 2);
  CHECK(Psctl(dir, "127.0.0.1:1", {"--servers", "2", "status"}).code == 2);
}

}  // namespace
}  // namespace paramserver
