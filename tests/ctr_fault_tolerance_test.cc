// A CTR job survives what a dense one survives, rows included: with replication 2, a
// server holding embedding shards killed with SIGKILL mid-run (sync, shuffle off) leaves
// the final weights, every row included, bit-identical to an undisturbed run's; and a
// whole cluster killed mid-run (every daemon at once) and resumed from its checkpoints onto
// another number of servers and of embedding shards (its rows rehashed) continues to those
// same weights. A hybrid job (training.embedding_mode: async: async tables under sync
// dense shards) applies every push once, loses none to a kill at replication 2, rolls
// only its dense part back at replication 1, and resumes, near the sync job's AUC.
#include <cmath>
#include <csignal>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/checkpoint/embedding_checkpoint_files.h"
#include "common/checkpoint/shard_checkpoint.h"
#include "common/rpc/rpc_endpoints.h"
#include "common/testing/local_cluster.h"
#include "common/testing/temp_dir.h"
#include "proto/admin.grpc.pb.h"
#include "tools/ctr_data.h"

namespace paramserver {
namespace {

constexpr int kSteps = 400;
constexpr char kAdminToken[] = "ctr-test-admin-token-0123456789";

struct Job {
  int servers = 2;
  int max_servers = 0;  // above servers: cluster.servers is {min: servers, max: max_servers}
  int embedding_shards = 4;
  int replication = 2;
  int max_steps = kSteps;
  bool resume = false;
  int embedding_deltas = 0;      // checkpoint.embedding_deltas
  std::string admin_token_file;  // security.admin_token_file, or none
  bool async_tables = false;     // training.embedding_mode: async
  // Given to every worker: --test_only_rpc_faults=delay_ms=N paces a job that must last
  // while a server joins (its weights are the same: a sync job waits for every push).
  std::vector<std::string> worker_args;
};

// A pace that leaves a joining server seconds to start, copy its backups and take its
// primaries before the job's last step, however fast the workers compute: 20 ms a call,
// at least 6 s from step 100 of kSteps (400).
const std::vector<std::string> kPacedForAJoin = {"--test_only_rpc_faults=delay_ms=20"};

std::string JobYaml(const Job& job, const std::string& data, const std::string& checkpoints,
                    const std::string& weights) {
  return absl::StrCat(
      R"(cluster:
  scheduler: 127.0.0.1:0
  servers: )",
      job.max_servers > job.servers
          ? absl::StrCat("{min: ", job.servers, ", max: ", job.max_servers, "}")
          : absl::StrCat(job.servers),
      R"(
  workers: 2
  shards: 2
  embedding_shards: )",
      job.embedding_shards, R"(
  replication: )",
      job.replication, R"(
  heartbeat_interval_ms: 200
  failure_timeout_ms: 1500
model:
  type: ctr
  dense_features: 3
  categorical_features: 4
  embedding_dim: 8
  layers: [35, 16, 1]
training:
  mode: sync
  batch_size: 32
  max_steps: )",
      job.max_steps, R"(
  shuffle: false
  embedding_mode: )",
      job.async_tables ? "async" : "sync", R"(
  embedding_optimizer: {type: adam, learning_rate: 0.02}
data:
  format: criteo
  train: )",
      data, R"(/train.tsv
  test: )",
      data, R"(/test.tsv
checkpoint:
  dir: )",
      checkpoints, R"(
  every_steps: 50
  embedding_deltas: )",
      job.embedding_deltas, R"(
  resume: )",
      job.resume ? "true" : "false", R"(
output:
  weights: )",
      weights, "\n",
      job.admin_token_file.empty()
          ? std::string()
          : absl::StrCat("security:\n  admin_token_file: ", job.admin_token_file, "\n"));
}

const std::string& DataDir() {
  static TempDir* dir = [] {
    auto* made = new TempDir();
    CtrDataOptions options;
    options.train_examples = 40000;
    options.test_examples = 1000;
    options.dense_features = 3;
    options.categorical_features = 4;
    options.vocabulary = 3000;
    REQUIRE(WriteCtrData(options, made->File("train.tsv"), made->File("test.tsv")).ok());
    return made;
  }();
  return dir->path();
}

// What a run left besides its weights.
struct RunLogs {
  std::string scheduler;
  std::vector<std::string> servers;  // the first `job.servers` servers' logs
  double test_auc = 0;
};

// Runs `job` to the end (calling `during` once it started); returns the weights' bytes
// (and the scheduler's log in *scheduler_log, when not null; every log in *logs).
std::string Run(const Job& job, const TempDir& dir,
                const std::function<void(LocalCluster&)>& during = nullptr,
                std::string* scheduler_log = nullptr, RunLogs* logs = nullptr) {
  const std::string weights = dir.File("weights.safetensors");
  const std::string config =
      dir.WriteFile("job.yaml", JobYaml(job, DataDir(), dir.File("checkpoints"), weights));
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(config, dir.path(), job.servers, 2, job.worker_args);
  REQUIRE(cluster.ok());
  if (during) during(**cluster);
  const absl::Status finished = (*cluster)->WaitForAll(absl::Seconds(180));
  INFO(finished.ToString());
  REQUIRE(finished.ok());
  if (scheduler_log != nullptr) *scheduler_log = (*cluster)->scheduler().ReadLog();
  if (logs != nullptr) {
    logs->scheduler = (*cluster)->scheduler().ReadLog();
    for (int s = 1; s <= job.servers; ++s)
      logs->servers.push_back((*cluster)->processes()[s].ReadLog());
    logs->test_auc = (*cluster)->FinalValue("test_auc");
  }
  std::string bytes = ReadFileOrEmpty(weights);
  REQUIRE(bytes.size() > 100000);  // the MLP and thousands of rows
  return bytes;
}

TempDir& UndisturbedDir() {
  static TempDir* dir = new TempDir();
  return *dir;
}

RunLogs& UndisturbedLogs() {
  static RunLogs* logs = new RunLogs();
  return *logs;
}

const std::string& Undisturbed() {
  static const std::string weights =
      Run(Job(), UndisturbedDir(), nullptr, nullptr, &UndisturbedLogs());
  return weights;
}

void WaitForCheckpoint(const std::string& dir, int64_t step) {
  const absl::Status reached = paramserver::WaitForCheckpoint(dir, step);
  INFO(reached.ToString());
  REQUIRE(reached.ok());
}

// Starts `job` (2 servers, 2 workers) in `dir` and kills every daemon at once (SIGKILL)
// once a checkpoint of `step` is on disk.
void KillWholeClusterAt(const Job& job, const TempDir& dir, int64_t step) {
  const std::string config = dir.WriteFile(
      "job.yaml",
      JobYaml(job, DataDir(), dir.File("checkpoints"), dir.File("weights.safetensors")));
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(config, dir.path(), 2, 2);
  REQUIRE(cluster.ok());
  WaitForCheckpoint(dir.File("checkpoints"), step);
  for (ChildProcess& process : (*cluster)->processes()) process.Kill(SIGKILL);
  for (ChildProcess& process : (*cluster)->processes())
    REQUIRE(process.WaitForExit(absl::Now() + absl::Seconds(10)).ok());
}

TEST_CASE(
    "kill -9 of a server holding embedding shards: the final rows equal an undisturbed run's") {
  const std::string& reference = Undisturbed();
  TempDir dir;
  std::string scheduler_log;
  const std::string weights = Run(
      Job(), dir,
      [&](LocalCluster& cluster) {
        WaitForCheckpoint(dir.File("checkpoints"), 100);
        // Each server is primary of 3 of the 6 shards: ps-0 of 0, 2 and 4, ps-1 of 1, 3
        // and 5; 2..5 are the embedding shards.
        cluster.processes()[2].Kill(SIGKILL);
      },
      &scheduler_log);
  INFO(scheduler_log);
  CHECK(scheduler_log.find("declared dead") != std::string::npos);
  // An embedding shard's backup took over (whichever server the process was).
  CHECK((scheduler_log.find("shard 4: backup ps-1 promoted") != std::string::npos ||
         scheduler_log.find("shard 5: backup ps-0 promoted") != std::string::npos));
  CHECK(scheduler_log.find("rolls back") == std::string::npos);
  CHECK(weights == reference);  // bit-identical: the MLP and every row
}

TEST_CASE(
    "a whole cluster killed mid-run resumes from delta checkpoints onto 3 servers and 3 "
    "embedding shards, to the same final weights") {
  const std::string& reference = Undisturbed();
  TempDir dir;
  Job first;
  // Full at steps 0 and 50, deltas at 100, 150 and 200, full at 250: the resume at 200
  // (or 250, if the kill comes late) reads its rows through the chain.
  first.embedding_deltas = 3;
  KillWholeClusterAt(first, dir, 200);
  REQUIRE(ReadFileOrEmpty(dir.File("weights.safetensors")).empty());  // it did not finish
  // The newest complete step, the one resumed from (100, 150 or 200: the embedding shards'
  // files may lag the dense ones): its rows are read through deltas (unless the kill came
  // after the full checkpoint at 250).
  const int64_t newest = NewestCompleteCheckpointStep(LocalFileSystem(), dir.File("checkpoints"),
                                                      /*total_parameters=*/593, /*tables=*/4);
  INFO("the newest complete checkpoint is at step " << newest);
  REQUIRE(newest >= 100);  // the killed job wrote its dense files at 200
  int deltas = 0;
  for (const EmbeddingCheckpointFile& file :
       ListEmbeddingCheckpoints(LocalFileSystem(), dir.File("checkpoints")))
    deltas += file.step == newest && file.previous_step >= 0;
  if (newest <= 200) CHECK(deltas == 4 * 4);  // each of 4 embedding shards' 4 tables
  Job resumed;
  resumed.embedding_deltas = 3;
  resumed.servers = 3;
  resumed.embedding_shards = 3;  // another cut of the key space: rows rehashed
  resumed.resume = true;
  std::string scheduler_log;
  const std::string weights = Run(resumed, dir, nullptr, &scheduler_log);
  INFO(scheduler_log);
  CHECK(scheduler_log.find(absl::StrCat("resuming from the checkpoint at step ", newest)) !=
        std::string::npos);
  CHECK(weights == reference);
}

TEST_CASE("a server drained mid-run without replication hands its rows off: the same weights") {
  const std::string& reference = Undisturbed();
  TempDir dir;
  Job job;
  job.replication = 1;  // every shard, embedding ones included, moves by a handoff checkpoint
  job.admin_token_file = dir.WriteSecretFile("admin.token", kAdminToken);
  std::string scheduler_log;
  const std::string weights = Run(
      job, dir,
      [&](LocalCluster& cluster) {
        WaitForCheckpoint(dir.File("checkpoints"), 100);
        auto admin = Admin::NewStub(CreateChannel(cluster.scheduler_address()));
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
        context.AddMetadata("authorization", std::string("Bearer ") + kAdminToken);
        DrainServerRequest request;
        request.set_node_name("ps-0");
        DrainServerResponse response;
        const grpc::Status drained = admin->DrainServer(&context, request, &response);
        INFO(drained.error_message());
        REQUIRE(drained.ok());
      },
      &scheduler_log);
  INFO(scheduler_log);
  CHECK(scheduler_log.find("ps-0 drained") != std::string::npos);
  CHECK(weights == reference);
}

TEST_CASE(
    "a server added mid-run takes its share of embedding buckets and dense ranges as primary, "
    "live: the same weights") {
  const std::string& reference = Undisturbed();
  TempDir dir;
  Job job;
  job.max_servers = 3;
  job.worker_args = kPacedForAJoin;
  std::string scheduler_log;
  const std::string weights = Run(
      job, dir,
      [&](LocalCluster& cluster) {
        WaitForCheckpoint(dir.File("checkpoints"), 100);
        REQUIRE(cluster.StartServer(dir.File("server-added.log")).ok());
      },
      &scheduler_log);
  INFO(scheduler_log);
  CHECK(scheduler_log.find("ps-2 (re)joined at") != std::string::npos);
  CHECK(scheduler_log.find("primaries rebalanced: shards [") != std::string::npos);
  CHECK(scheduler_log.find("rolls back") == std::string::npos);
  CHECK(weights == reference);  // the MLP and every row
}

TEST_CASE("kill -9 of a joined server before or after it takes primaries leaves the same weights") {
  const std::string& reference = Undisturbed();
  const bool after_switch = GENERATE(false, true);
  TempDir dir;
  Job job;
  job.max_servers = 3;
  job.worker_args = kPacedForAJoin;
  std::string scheduler_log;
  const std::string weights = Run(
      job, dir,
      [&](LocalCluster& cluster) {
        WaitForCheckpoint(dir.File("checkpoints"), 100);
        REQUIRE(cluster.StartServer(dir.File("server-added.log")).ok());
        ChildProcess& added = cluster.processes().back();
        // Killed as it copies its backups (it logs each copy), or once the scheduler
        // switched primaries to it.
        const absl::StatusOr<int> reached =
            after_switch
                ? WaitForLoggedNumber(cluster.scheduler(), R"(epoch (\d+): primaries rebalanced)",
                                      absl::Seconds(30))
                : WaitForLoggedNumber(added, R"(shard (\d+): copied from its primary)",
                                      absl::Seconds(30));
        REQUIRE(reached.ok());
        added.Kill(SIGKILL);
      },
      &scheduler_log);
  INFO(scheduler_log);
  CHECK(scheduler_log.find("ps-2 (re)joined at") != std::string::npos);
  CHECK(scheduler_log.find("ps-2 lost") != std::string::npos);
  // Killed before the switch: every shard still has its old primary. Killed after it:
  // the old primaries handed their shards over and are promoted back; killed during
  // the switch, a shard whose old primary had not handed it over yet (it copies it back
  // instead) has no copy that holds it, and every shard rolls back to the checkpoint
  // (sync: the replay is exact).
  if (!after_switch) CHECK(scheduler_log.find("rolls back") == std::string::npos);
  if (scheduler_log.find("rolls back") != std::string::npos)
    WARN("killed during the switch, before a handover completed: a rollback");
  CHECK(weights == reference);
  // Which it was: killed before the switch (the move abandoned: the old primaries kept
  // their shards and re-replicate) or after (its new primaries' backups promoted).
  const size_t switched = scheduler_log.find("primaries rebalanced");
  WARN((switched != std::string::npos && switched < scheduler_log.find("ps-2 lost")
            ? "the joined server was killed after taking primaries: its backups were promoted"
            : "the joined server was killed before taking primaries: the move was abandoned"));
}

// Each shard's "N updates applied" in the servers' last lines (the last one logged).
std::map<int, int64_t> UpdatesApplied(const RunLogs& logs) {
  std::map<int, int64_t> applied;
  const std::regex line(R"(shard (\d+): (\d+) updates applied)");
  for (const std::string& log : logs.servers) {
    for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator();
         ++it) {
      applied[std::stoi((*it)[1].str())] = std::stoll((*it)[2].str());
    }
  }
  return applied;
}

// A hybrid job (training.embedding_mode: async): the 2 dense shards applied exactly the
// job's steps; the 4 tables' shards, each an async one, every worker's push of every
// step once (2 x kSteps), or (`lost_tables`) those that restored a checkpoint fewer.
void CheckHybridCounts(const RunLogs& logs, const std::set<int>& lost_tables = {}) {
  const std::map<int, int64_t> applied = UpdatesApplied(logs);
  REQUIRE(applied.size() == 6);
  for (const auto& [shard, updates] : applied) {
    INFO("shard " << shard);
    if (shard < 2) {
      CHECK(updates == kSteps);
    } else if (lost_tables.count(shard) == 0) {
      CHECK(updates == 2 * kSteps);
    } else {
      CHECK(updates > kSteps);  // restored at its newest: about what it held then, and on
      CHECK(updates <= 2 * kSteps + 2);
    }
  }
  // Async tables cost the sync run little: within 0.02 of its AUC on the same 400 steps
  // (run to run, the tables' pushes arrive in another order).
  CHECK(std::abs(logs.test_auc - UndisturbedLogs().test_auc) < 0.02);
}

// The tables whose shards the scheduler's log says restored their newest checkpoint.
std::set<int> RestoredTables(const std::string& scheduler_log) {
  std::set<int> restored;
  const std::regex line(R"(shard (\d+) restores its checkpoint at update)");
  for (auto it = std::sregex_iterator(scheduler_log.begin(), scheduler_log.end(), line);
       it != std::sregex_iterator(); ++it) {
    restored.insert(std::stoi((*it)[1].str()));
  }
  return restored;
}

TEST_CASE("hybrid, async tables under sync dense shards: every push applied once, the sync AUC") {
  Undisturbed();
  TempDir dir;
  Job job;
  job.async_tables = true;
  RunLogs logs;
  Run(job, dir, nullptr, nullptr, &logs);
  INFO(logs.scheduler);
  CHECK(logs.scheduler.find("mode sync (embedding tables async)") != std::string::npos);
  CheckHybridCounts(logs);
}

// Runs ps_checkpoint_export on `dir`'s job.yaml into exported.safetensors, as a user
// would; its output (it must exit 0).
std::string ExportCheckpoint(const TempDir& dir) {
  absl::StatusOr<ChildProcess> exporter =
      ChildProcess::Start({RunfilePath("ps/ps_checkpoint_export"), "--config", dir.File("job.yaml"),
                           "--out", dir.File("exported.safetensors")},
                          dir.File("export.log"));
  REQUIRE(exporter.ok());
  absl::StatusOr<int> code = exporter->WaitForExit(absl::Now() + absl::Seconds(60));
  INFO(exporter->ReadLog());
  REQUIRE(code.ok());
  REQUIRE(*code == 0);
  return exporter->ReadLog();
}

// A hybrid job (and the sync reference) run to the end, one server killed with SIGKILL
// once the checkpoint of step 100 is on disk.
RunLogs RunHybridKillingAServer(int replication) {
  Undisturbed();
  TempDir dir;
  Job job;
  job.async_tables = true;
  job.replication = replication;
  RunLogs logs;
  Run(
      job, dir,
      [&](LocalCluster& cluster) {
        WaitForCheckpoint(dir.File("checkpoints"), 100);
        cluster.processes()[2].Kill(SIGKILL);
      },
      nullptr, &logs);
  return logs;
}

TEST_CASE("hybrid, replication 2: kill -9 of a server holding tables loses no push") {
  const RunLogs logs = RunHybridKillingAServer(/*replication=*/2);
  INFO(logs.scheduler);
  CHECK(logs.scheduler.find("declared dead") != std::string::npos);
  CHECK(logs.scheduler.find("rolls back") == std::string::npos);
  CheckHybridCounts(logs);  // the backups held every push: exactly once each
}

TEST_CASE(
    "hybrid, no replication: kill -9 of a server rolls the dense shards back and restores its "
    "tables' newest checkpoints; the other tables keep their rows") {
  const RunLogs logs = RunHybridKillingAServer(/*replication=*/1);
  INFO(logs.scheduler);
  CHECK(logs.scheduler.find("every dense shard rolls back to its checkpoint at step") !=
        std::string::npos);
  // The killed server was primary of one dense shard and two tables' shards.
  const std::set<int> restored = RestoredTables(logs.scheduler);
  CHECK(restored.size() == 2);
  for (int shard : restored) CHECK(shard >= 2);
  // The surviving tables took the replayed steps' pushes for repeats: still once each.
  CheckHybridCounts(logs, restored);
}

TEST_CASE(
    "hybrid: a whole cluster killed mid-run resumes, the dense part at its step and each "
    "table at its newest; ps_checkpoint_export writes the same cut") {
  Undisturbed();
  TempDir dir;
  Job first;
  first.async_tables = true;
  first.replication = 1;
  KillWholeClusterAt(first, dir, 200);
  // The tables' files are at update counts, never all at one step: a complete cut is
  // the dense part's, and ps_checkpoint_export takes each bucket's newest with it.
  const int64_t newest = NewestCompleteCheckpointStep(LocalFileSystem(), dir.File("checkpoints"),
                                                      /*total_parameters=*/593, /*tables=*/0);
  REQUIRE(newest >= 100);  // 150 or 200: one dense shard's file at 200 may lag the other's
  CHECK(ExportCheckpoint(dir).find(absl::StrCat("at step ", newest)) != std::string::npos);
  CHECK(ReadFileOrEmpty(dir.File("exported.safetensors")).size() > 100000);  // thousands of rows
  Job resumed = first;
  resumed.resume = true;
  RunLogs logs;
  Run(resumed, dir, nullptr, nullptr, &logs);
  INFO(logs.scheduler);
  CHECK(logs.scheduler.find(absl::StrCat("resuming from the checkpoint at step ", newest)) !=
        std::string::npos);
  const std::map<int, int64_t> applied = UpdatesApplied(logs);
  REQUIRE(applied.size() == 6);
  CHECK(applied.at(0) == kSteps);
  CHECK(applied.at(1) == kSteps);
  CHECK(std::abs(logs.test_auc - UndisturbedLogs().test_auc) < 0.02);
}

TEST_CASE("ps_checkpoint_export writes the same weights file as output.weights, tables included") {
  const std::string& reference = Undisturbed();
  const TempDir& dir = UndisturbedDir();
  CHECK(ExportCheckpoint(dir).find("at step 400") != std::string::npos);
  CHECK(ReadFileOrEmpty(dir.File("exported.safetensors")) == reference);
}

}  // namespace
}  // namespace paramserver
