// Fault injection with real processes on 127.0.0.1: kill -9 and SIGSTOP of servers and workers in
// the middle of training (sync: SGD with momentum and a cosine schedule; async: Adam), with
// replicated shards (a backup takes over) and without (checkpoints),
// restarts, a whole-cluster restart from checkpoints onto another number of servers, and kills
// during checkpoint writes. Each run must finish, every process must exit, and the result must
// match an undisturbed run: sync runs bit-for-bit, async runs with every acknowledged push
// applied exactly once (replicated) or within 2 points of accuracy (checkpoints only; see
// kAsyncAccuracyAgreement). The recovery figures (detection time over the failure timeout, and
// the time from detection to the first step on the new shard map) are printed as warnings.
#include <signal.h>

#include <algorithm>
#include <functional>
#include <map>
#include <regex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/checkpoint/shard_checkpoint.h"
#include "common/rpc/rpc_endpoints.h"
#include "common/testing/local_cluster.h"
#include "common/testing/temp_dir.h"
#include "proto/admin.grpc.pb.h"
#include "proto/scheduler.pb.h"
#include "tests/cluster_config.h"

namespace paramserver {
namespace {

// How close two async runs' test accuracies must be. Async training's result depends on
// the order pushes arrive in, so two runs are two different models of the same quality,
// scored on the same 10,000 test images: at accuracy p ~ 0.86 one model's score has a
// sampling standard deviation of sqrt(p (1 - p) / 10000) = 0.0035, a difference of two
// 0.0049. Four standard deviations: 0.02 (0.01 was 2 and failed once, by 0.0135).
constexpr double kAsyncAccuracyAgreement = 0.02;

constexpr int kSteps = 1500;  // per worker: about 1.6 epochs of 2 x 30000 examples
constexpr int kFailureTimeoutMs = 1500;

struct RunResult {
  std::string weights;  // the safetensors file's bytes
  double accuracy = -1;
  std::string scheduler_log;
  std::vector<std::string> logs;  // every daemon's, scheduler first
};

// Sync runs train with SGD, nesterov momentum, weight decay and a warm-up then cosine
// schedule, the biases in a group without decay or momentum, the mean gradient clipped
// to a norm of 1.5 (about one step in six: its norm runs 0.7 to 1.9): a kill, a
// rollback and a whole-cluster restart must carry the momentum buffers (and the groups'
// runs) and continue the schedule at the step they resume from, and every fault must
// leave each clipped step held, scaled and applied once. Async runs keep TestJob's Adam.
constexpr char kSyncOptimizer[] =
    "{type: sgd, learning_rate: 0.05, momentum: 0.9, nesterov: true, weight_decay: 0.0001, "
    "clip_grad_norm: 1.5, "
    "lr_schedule: {warmup_steps: 100, decay: cosine, total_steps: 1500, min_learning_rate: "
    "0.001}, groups: [{params: ['*.bias'], weight_decay: 0.0, momentum: 0.0}]}";

TestJob Job(const std::string& mode, const TempDir& dir) {
  TestJob job;
  job.mode = mode;
  if (mode == "sync") job.optimizer = kSyncOptimizer;
  // Async accuracy settles later: compare it after 3 epochs, not in the middle of the second.
  job.max_steps = mode == "sync" ? kSteps : 0;
  job.epochs = mode == "sync" ? 2 : 3;
  job.heartbeat_interval_ms = 200;
  job.failure_timeout_ms = kFailureTimeoutMs;
  job.checkpoint_dir = dir.File("checkpoints");
  job.checkpoint_every_steps = 50;
  job.weights = dir.File("weights.safetensors");
  job.admin_token_file = dir.WriteSecretFile("admin.token", kTestAdminToken);
  return job;
}

// A context for the scheduler's admin service, with the admin token.
void PrepareAdminCall(grpc::ClientContext* context, absl::Duration timeout) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  context->AddMetadata("authorization", std::string("Bearer ") + kTestAdminToken);
}

// An operator's shutdown of the whole job (psctl shutdown), asked of the scheduler.
void ShutDownJob(LocalCluster& cluster) {
  auto admin = Admin::NewStub(CreateChannel(cluster.scheduler_address()));
  grpc::ClientContext context;
  PrepareAdminCall(&context, absl::Seconds(10));
  ShutdownResponse response;
  const grpc::Status shut = admin->Shutdown(&context, ShutdownRequest(), &response);
  INFO(shut.error_message());
  REQUIRE(shut.ok());
}

// Waits until some shard has a checkpoint at `step` or later.
void WaitForCheckpoint(const std::string& dir, int64_t step) {
  const absl::Status reached = paramserver::WaitForCheckpoint(dir, step);
  INFO(reached.ToString());
  REQUIRE(reached.ok());
}

using Fault = std::function<void(LocalCluster&, const TempDir&)>;

RunResult Run(const TestJob& job, const TempDir& dir, const Fault& fault = nullptr,
              std::vector<std::string> worker_args = {},
              std::vector<std::string> scheduler_args = {},
              std::vector<std::string> server_args = {}) {
  const std::string config = dir.WriteFile("job.yaml", TestJobYaml(job));
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(config, dir.path(), job.servers, job.workers, std::move(worker_args),
                          std::move(scheduler_args), std::move(server_args));
  REQUIRE(cluster.ok());
  if (fault) fault(**cluster, dir);
  absl::Status finished = (*cluster)->WaitForAll(absl::Seconds(180));
  INFO(finished.ToString());
  REQUIRE(finished.ok());
  RunResult result;
  result.weights = ReadFileOrEmpty(job.weights);
  result.accuracy = (*cluster)->FinalValue("test_accuracy");
  result.scheduler_log = (*cluster)->scheduler().ReadLog();
  for (ChildProcess& process : (*cluster)->processes()) result.logs.push_back(process.ReadLog());
  REQUIRE_FALSE(result.weights.empty());
  return result;
}

// The undisturbed run of each mode, computed once.
const RunResult& Undisturbed(const std::string& mode) {
  static std::map<std::string, RunResult> runs;
  static std::map<std::string, std::unique_ptr<TempDir>> dirs;
  auto it = runs.find(mode);
  if (it == runs.end()) {
    dirs[mode] = std::make_unique<TempDir>();
    it = runs.emplace(mode, Run(Job(mode, *dirs[mode]), *dirs[mode])).first;
  }
  return it->second;
}

// Seconds since midnight of a log line's timestamp ("2026-11-29 22:58:57.345 [...").
double LogSeconds(const std::string& line) {
  int hours = 0, minutes = 0;
  double seconds = 0;
  std::sscanf(line.c_str() + 11, "%d:%d:%lf", &hours, &minutes, &seconds);
  return hours * 3600.0 + minutes * 60.0 + seconds;
}

std::string FirstLineWith(const std::string& log, const std::string& text) {
  const size_t at = log.find(text);
  if (at == std::string::npos) return "";
  const size_t begin = log.rfind('\n', at);
  return log.substr(begin == std::string::npos ? 0 : begin + 1, log.find('\n', at) - (begin + 1));
}

double NowSeconds() {
  const absl::Time now = absl::Now();
  const absl::TimeZone local = absl::LocalTimeZone();
  const absl::CivilSecond civil = absl::ToCivilSecond(now, local);
  return civil.hour() * 3600.0 + civil.minute() * 60.0 + civil.second() +
         absl::ToDoubleSeconds(now - absl::FromCivil(civil, local));
}

// Prints the recovery figures for a failure injected at `killed_at` (seconds of day).
void ReportRecovery(const RunResult& run, double killed_at, int failure_timeout_ms) {
  const std::string declared = FirstLineWith(run.scheduler_log, "declared dead");
  REQUIRE_FALSE(declared.empty());
  const double detection = LogSeconds(declared) - killed_at;
  double first_step = -1;
  for (const std::string& log : run.logs) {
    const std::string recovered = FirstLineWith(log, "completed: recovered");
    if (!recovered.empty() && (first_step < 0 || LogSeconds(recovered) < first_step))
      first_step = LogSeconds(recovered);
  }
  WARN("recovery: detected after "
       << static_cast<int>(detection * 1000) << " ms = " << detection * 1000 / failure_timeout_ms
       << " x failure_timeout; first step on "
       << "the new map " << static_cast<int>((first_step - LogSeconds(declared)) * 1000)
       << " ms after detection");
  CHECK(detection * 1000 < 1.5 * failure_timeout_ms + 250);  // goal 1.5x, plus scheduling slack
  CHECK(first_step > 0);
}

ChildProcess& Server(LocalCluster& cluster, int i) { return cluster.processes()[1 + i]; }

// The number after `key` in every line of `log` that has it, e.g. "duplicate pushes".
std::vector<int64_t> NumbersBefore(const std::string& log, const std::string& key) {
  std::vector<int64_t> numbers;
  for (size_t at = log.find(key); at != std::string::npos; at = log.find(key, at + 1)) {
    size_t begin = log.rfind(' ', at - 2);
    numbers.push_back(std::atoll(log.c_str() + begin + 1));
  }
  return numbers;
}

// The number right after `key` in every line of `log` that has it.
std::vector<int64_t> NumbersAfter(const std::string& log, const std::string& key) {
  std::vector<int64_t> numbers;
  for (size_t at = log.find(key); at != std::string::npos; at = log.find(key, at + 1)) {
    numbers.push_back(std::atoll(log.c_str() + at + key.size()));
  }
  return numbers;
}

// The job's worker figures as the scheduler summed them ("the workers trained N samples
// in P process(es)"), and the samples of each worker process that finished ("finished S
// steps, N samples in ...").
struct WorkerFigures {
  int64_t job_samples = -1;
  int processes = -1;
  int64_t finished_samples = 0;
  int finished_processes = 0;
};
WorkerFigures Figures(const RunResult& run) {
  WorkerFigures figures;
  const std::string summed = FirstLineWith(run.scheduler_log, "the workers trained ");
  if (!summed.empty()) {
    std::sscanf(summed.c_str() + summed.find("the workers trained "),
                "the workers trained %ld samples in %d process", &figures.job_samples,
                &figures.processes);
  }
  for (const std::string& log : run.logs) {
    for (size_t at = log.find("] info: finished "); at != std::string::npos;
         at = log.find("] info: finished ", at + 1)) {
      int64_t steps = 0, samples = 0;
      if (std::sscanf(log.c_str() + at, "] info: finished %ld steps, %ld samples", &steps,
                      &samples) == 2) {
        figures.finished_samples += samples;
        ++figures.finished_processes;
      }
    }
  }
  return figures;
}

// The updates each shard's final primary applied, from the servers' closing lines.
std::vector<int64_t> AppliedPerShard(const RunResult& run) {
  std::vector<int64_t> applied;
  for (const std::string& log : run.logs) {
    for (int64_t n : NumbersBefore(log, "updates applied")) applied.push_back(n);
  }
  return applied;
}

// Every one of the job's shards applied `expected` updates: each of its steps (sync) or
// each acknowledged push (async) exactly once.
void ExpectEveryStepOnceOnEveryShard(const RunResult& run, const TestJob& job,
                                     int64_t expected = kSteps) {
  const std::vector<int64_t> applied = AppliedPerShard(run);
  REQUIRE(applied.size() == static_cast<size_t>(job.shards));
  for (int64_t n : applied) CHECK(n == expected);
}

TEST_CASE(
    "kill -9 of a primary in sync training with replication 2: backups take over, nothing rolls "
    "back") {
  const RunResult& reference = Undisturbed("sync");
  TempDir dir;
  TestJob job = Job("sync", dir);
  job.replication = 2;
  double killed_at = 0;
  RunResult run = Run(job, dir, [&](LocalCluster& cluster, const TempDir& d) {
    WaitForCheckpoint(d.File("checkpoints"), 300);
    killed_at = NowSeconds();
    Server(cluster, 1).Kill(SIGKILL);
  });
  CHECK(run.scheduler_log.find(" promoted") != std::string::npos);
  CHECK(run.scheduler_log.find("rolls back") == std::string::npos);
  CHECK(run.weights == reference.weights);  // bit-identical
  ExpectEveryStepOnceOnEveryShard(run, job);
  ReportRecovery(run, killed_at, kFailureTimeoutMs);
}

// A backup acknowledges an entry once it holds it in memory and applies it later: the
// servers of these runs hold every entry they receive this long before applying it, so
// that each kill lands while acknowledged entries wait unapplied on the survivors.
const std::vector<std::string> kHoldReceivedEntries = {"--testing_replica_apply_hold_ms=2500"};

// How many log entries the servers applied as they were promoted, having received them
// and not yet applied them (what the promoted shards log).
int64_t EntriesAppliedOnPromotion(const RunResult& run) {
  int64_t total = 0;
  for (const std::string& log : run.logs) {
    for (int64_t n : NumbersAfter(log, "applied the ")) total += n;
  }
  return total;
}

// Runs `job` on servers holding received entries (kHoldReceivedEntries), killing the
// servers `victims` with SIGKILL together once step 300 is checkpointed.
RunResult RunKillingWithHeldEntries(const TestJob& job, const TempDir& dir,
                                    const std::vector<int>& victims) {
  return Run(
      job, dir,
      [&](LocalCluster& cluster, const TempDir& d) {
        WaitForCheckpoint(d.File("checkpoints"), 300);
        for (int victim : victims) Server(cluster, victim).Kill(SIGKILL);
      },
      {}, {}, kHoldReceivedEntries);
}

TEST_CASE(
    "sync replication 2: a primary killed while its backups hold entries unapplied; they apply "
    "them as they are promoted, bit-identical") {
  // The killed server is also the backup of the other shards: the entries it held die
  // with it, and their primaries, which applied them, go on.
  const RunResult& reference = Undisturbed("sync");
  TempDir dir;
  TestJob job = Job("sync", dir);
  job.replication = 2;
  RunResult run = RunKillingWithHeldEntries(job, dir, {1});
  CHECK(run.scheduler_log.find(" promoted") != std::string::npos);
  CHECK(EntriesAppliedOnPromotion(run) > 0);  // the kill landed between receipt and apply
  CHECK(run.weights == reference.weights);    // bit-identical
  ExpectEveryStepOnceOnEveryShard(run, job);
}

TEST_CASE(
    "replication 2 on 3 servers: a shard's primary and backup killed together between receipt "
    "and apply; it restores its checkpoint and the job replays, bit-identical") {
  // An acknowledgement promises the update survives the loss of any R-1 servers: with
  // both copies gone (the backup's held in memory, as an applied one would be), the job
  // falls back to its checkpoints.
  const RunResult& reference = Undisturbed("sync");
  TempDir dir;
  TestJob job = Job("sync", dir);
  job.servers = 3;
  job.replication = 2;
  RunResult run = RunKillingWithHeldEntries(job, dir, {0, 1});
  CHECK(run.scheduler_log.find("no copy left") != std::string::npos);
  CHECK(run.scheduler_log.find("rolls back to its checkpoint") != std::string::npos);
  CHECK(run.weights == reference.weights);
  ExpectEveryStepOnceOnEveryShard(run, job);
}

// The server process that registered as `name` (its log's "lines are tagged [NAME]").
ChildProcess& ServerNamed(LocalCluster& cluster, const std::string& name) {
  for (size_t i = 1; i < cluster.processes().size(); ++i) {
    ChildProcess& process = cluster.processes()[i];
    if (process.ReadLog().find("this node's lines are tagged [" + name + "]") != std::string::npos)
      return process;
  }
  FAIL("no process registered as " << name);
  return cluster.processes()[0];
}

TEST_CASE(
    "replication 3: a primary and its first backup killed together; the second backup takes "
    "over, nothing rolls back, bit-identical") {
  // The two are found dead one after the other. Had the first loss's plan promoted the
  // backup killed with it, the shard's other backup would have had to copy the shard
  // again from that (dead) new primary, so the second loss would have found no copy
  // holding it, and every shard would have rolled back to its checkpoint.
  const RunResult& reference = Undisturbed("sync");
  TempDir dir;
  TestJob job = Job("sync", dir);
  job.servers = 4;
  job.replication = 3;
  std::string primary, first_backup;
  RunResult run = Run(job, dir, [&](LocalCluster& cluster, const TempDir& d) {
    WaitForCheckpoint(d.File("checkpoints"), 300);
    auto admin = Admin::NewStub(CreateChannel(cluster.scheduler_address()));
    grpc::ClientContext context;
    PrepareAdminCall(&context, absl::Seconds(10));
    ClusterStatus status;
    REQUIRE(admin->GetStatus(&context, GetStatusRequest(), &status).ok());
    REQUIRE(status.shards_size() > 0);
    REQUIRE(status.shards(0).backups_size() == 2);
    primary = status.shards(0).primary();
    first_backup = status.shards(0).backups(0);
    // The primary first, the backup a quarter of the failure timeout later (more than a
    // heartbeat interval): the primary's silence is found first, the backup's a moment
    // after, when it has been silent for over half the timeout (the backup's last beat
    // is at most 375 - 200 ms after the primary's kill).
    ServerNamed(cluster, primary).Kill(SIGKILL);
    absl::SleepFor(absl::Milliseconds(kFailureTimeoutMs / 4));
    ServerNamed(cluster, first_backup).Kill(SIGKILL);
  });
  INFO(run.scheduler_log);
  const size_t primary_found = run.scheduler_log.find(primary + " has sent no heartbeat");
  const size_t backup_found = run.scheduler_log.find(first_backup + " has sent no heartbeat");
  REQUIRE(primary_found != std::string::npos);
  REQUIRE(backup_found != std::string::npos);
  // Found in that order (in one pass of a starved scheduler they could come the other
  // way round; then the backup is dropped first and nothing need be passed over).
  if (primary_found < backup_found) {
    CHECK(run.scheduler_log.find(first_backup + ", not heard from lately, passed over") !=
          std::string::npos);
  }
  CHECK(run.scheduler_log.find("no copy left") == std::string::npos);
  CHECK(run.scheduler_log.find("rolls back") == std::string::npos);
  CHECK(run.weights == reference.weights);  // bit-identical
  ExpectEveryStepOnceOnEveryShard(run, job);
}

TEST_CASE(
    "async replication 2: a primary killed while its backups hold entries unapplied; every "
    "acknowledged push applied once") {
  TempDir dir;
  TestJob job = Job("async", dir);
  job.replication = 2;
  job.max_steps = 1000;
  RunResult run = RunKillingWithHeldEntries(job, dir, {0});
  CHECK(run.scheduler_log.find(" promoted") != std::string::npos);
  CHECK(EntriesAppliedOnPromotion(run) > 0);
  CHECK(run.scheduler_log.find("rolling back") == std::string::npos);
  ExpectEveryStepOnceOnEveryShard(run, job, 2 * 1000);  // 2 workers x 1000 pushes: 0 lost, 0 twice
}

TEST_CASE(
    "kill -9 of a server in sync training without replication: every shard rolls back to its "
    "checkpoint") {
  const RunResult& reference = Undisturbed("sync");
  TempDir dir;
  TestJob job = Job("sync", dir);
  job.replication = 1;
  double killed_at = 0;
  RunResult run = Run(job, dir, [&](LocalCluster& cluster, const TempDir& d) {
    WaitForCheckpoint(d.File("checkpoints"), 300);
    killed_at = NowSeconds();
    Server(cluster, 1).Kill(SIGKILL);
  });
  CHECK(run.scheduler_log.find("every shard rolls back to its checkpoint") != std::string::npos);
  CHECK(run.weights == reference.weights);  // bit-identical: the replay is exact
  CHECK(run.accuracy == reference.accuracy);
  ReportRecovery(run, killed_at, kFailureTimeoutMs);
}

TEST_CASE(
    "kill -9 of a server in async training without replication: within 2 points of an undisturbed "
    "run") {
  const RunResult& reference = Undisturbed("async");
  TempDir dir;
  TestJob job = Job("async", dir);
  job.replication = 1;
  RunResult run = Run(job, dir, [&](LocalCluster& cluster, const TempDir& d) {
    WaitForCheckpoint(d.File("checkpoints"), 300);
    Server(cluster, 0).Kill(SIGKILL);
  });
  CHECK(run.scheduler_log.find("rolling back about") != std::string::npos);  // the loss is measured
  INFO("accuracy " << run.accuracy << " vs undisturbed " << reference.accuracy);
  CHECK(std::abs(run.accuracy - reference.accuracy) <= kAsyncAccuracyAgreement);
}

TEST_CASE(
    "a stopped (SIGSTOP) primary is replaced by its backup and fenced; after SIGCONT it rejoins "
    "cleanly") {
  const RunResult& reference = Undisturbed("sync");
  TempDir dir;
  double stopped_at = 0;
  RunResult run = Run(Job("sync", dir), dir, [&](LocalCluster& cluster, const TempDir& d) {
    WaitForCheckpoint(d.File("checkpoints"), 300);
    stopped_at = NowSeconds();
    Server(cluster, 0).Kill(SIGSTOP);
    WaitForCheckpoint(d.File("checkpoints"), 900);  // training went on without it
    Server(cluster, 0).Kill(SIGCONT);
  });
  CHECK(run.scheduler_log.find("has sent no heartbeat") != std::string::npos);
  CHECK(run.scheduler_log.find(" promoted") != std::string::npos);
  CHECK(run.logs[1].find("dropping every shard and registering again") != std::string::npos);
  // No write of the stopped primary's landed after its replacement: the steps each
  // shard applied are exactly the job's, and the weights are the undisturbed run's.
  const std::vector<int64_t> applied = AppliedPerShard(run);
  REQUIRE(applied.size() == 8);
  for (int64_t n : applied) CHECK(n == kSteps);
  CHECK(run.logs[1].find("rejoined the cluster") != std::string::npos);
  CHECK(run.weights == reference.weights);
  ReportRecovery(run, stopped_at, kFailureTimeoutMs);
}

TEST_CASE(
    "kill -9 of a worker in sync training: the others go on without it, and a restarted worker "
    "rejoins") {
  const RunResult& reference = Undisturbed("sync");
  TempDir dir;
  TestJob job = Job("sync", dir);
  RunResult run = Run(job, dir, [&](LocalCluster& cluster, const TempDir& d) {
    WaitForCheckpoint(d.File("checkpoints"), 300);
    // The second worker process; which rank it has depends on registration order, and
    // either may go (the rank-0 worker's replacement reports the result).
    cluster.processes()[1 + job.servers + 1].Kill(SIGKILL);
    WaitForCheckpoint(d.File("checkpoints"), 500);  // the other trains alone meanwhile
    REQUIRE(cluster.StartWorker(d.File("worker-restarted.log")).ok());
  });
  CHECK(run.scheduler_log.find(" lost; sync steps complete without it") != std::string::npos);
  CHECK(run.scheduler_log.find("rejoined at") != std::string::npos);
  INFO("accuracy " << run.accuracy << " vs undisturbed " << reference.accuracy);
  CHECK(std::abs(run.accuracy - reference.accuracy) <= kAsyncAccuracyAgreement);
  // The job's figures count the killed process too: more samples than the two processes
  // that finished trained.
  const WorkerFigures figures = Figures(run);
  INFO(run.scheduler_log);
  CHECK(figures.processes == 3);
  CHECK(figures.job_samples > figures.finished_samples);
}

TEST_CASE(
    "a worker stopped (SIGSTOP) past the failure timeout registers again by itself after SIGCONT, "
    "trains on at the job's step, and the job's figures count its samples") {
  const RunResult& reference = Undisturbed("sync");
  TempDir dir;
  TestJob job = Job("sync", dir);
  RunResult run = Run(job, dir, [&](LocalCluster& cluster, const TempDir& d) {
    WaitForCheckpoint(d.File("checkpoints"), 300);
    ChildProcess& worker = cluster.processes()[1 + job.servers + 1];
    worker.Kill(SIGSTOP);
    const absl::StatusOr<int> declared = WaitForLoggedNumber(
        cluster.scheduler(), R"(worker-(\d+) has sent no heartbeat)", absl::Seconds(30));
    INFO(declared.status().ToString());
    REQUIRE(declared.ok());
    WaitForCheckpoint(d.File("checkpoints"), 600);  // the other trains alone meanwhile
    worker.Kill(SIGCONT);                           // no --restart: it comes back by itself
  });
  CHECK(run.scheduler_log.find(" lost; sync steps complete without it") != std::string::npos);
  CHECK(run.scheduler_log.find("rejoined at") != std::string::npos);
  const std::string& paused_log = run.logs[1 + job.servers + 1];
  CHECK(paused_log.find("registering again") != std::string::npos);
  CHECK(paused_log.find("admitted again after being declared dead; continuing at step") !=
        std::string::npos);
  INFO("accuracy " << run.accuracy << " vs undisturbed " << reference.accuracy);
  CHECK(std::abs(run.accuracy - reference.accuracy) <= kAsyncAccuracyAgreement);
  // Both processes finished; the job's samples are theirs, the paused one's included.
  const WorkerFigures figures = Figures(run);
  INFO(run.scheduler_log);
  CHECK(figures.processes == 2);
  CHECK(figures.finished_processes == 2);
  CHECK(figures.job_samples == figures.finished_samples);
}

TEST_CASE(
    "a killed server that is restarted rejoins, takes shards back with their state, and nothing is "
    "lost") {
  const RunResult& reference = Undisturbed("sync");
  TempDir dir;
  RunResult run = Run(Job("sync", dir), dir, [&](LocalCluster& cluster, const TempDir& d) {
    WaitForCheckpoint(d.File("checkpoints"), 300);
    Server(cluster, 1).Kill(SIGKILL);
    WaitForCheckpoint(d.File("checkpoints"), 700);
    REQUIRE(cluster.StartServer(d.File("server-restarted.log")).ok());
  });
  CHECK(run.scheduler_log.find("(re)joined") != std::string::npos);
  CHECK(run.logs.back().find("serving epoch") != std::string::npos);
  CHECK(run.weights == reference.weights);
}

TEST_CASE(
    "a whole cluster killed and restarted from its checkpoints on 3 servers ends where an "
    "undisturbed run does") {
  const RunResult& reference = Undisturbed("sync");
  TempDir dir;
  TestJob first = Job("sync", dir);
  {
    const std::string config = dir.WriteFile("first.yaml", TestJobYaml(first));
    absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
        LocalCluster::Start(config, dir.path(), 2, 2);
    REQUIRE(cluster.ok());
    WaitForCheckpoint(first.checkpoint_dir, 600);
    for (ChildProcess& process : (*cluster)->processes()) process.Kill(SIGKILL);
    for (ChildProcess& process : (*cluster)->processes())
      REQUIRE(process.WaitForExit(absl::Now() + absl::Seconds(10)).ok());
  }
  TestJob resumed = first;
  resumed.servers = 3;
  resumed.shards = 6;  // re-sharded too: the checkpoint's 8 shards are cut anew
  resumed.resume = true;
  RunResult run = Run(resumed, dir);
  CHECK(run.scheduler_log.find("resuming from the checkpoint at step") != std::string::npos);
  CHECK(run.weights == reference.weights);

  // The final checkpoint exported as safetensors holds the same weights the job wrote.
  absl::StatusOr<ChildProcess> exporter = ChildProcess::Start(
      {RunfilePath("ps/ps_checkpoint_export"), "--config", dir.File("job.yaml"), "--step",
       std::to_string(kSteps), "--out", dir.File("exported.safetensors")},
      dir.File("export.log"));
  REQUIRE(exporter.ok());
  absl::StatusOr<int> code = exporter->WaitForExit(absl::Now() + absl::Seconds(30));
  REQUIRE(code.ok());
  INFO(exporter->ReadLog());
  CHECK(*code == 0);
  CHECK(ReadFileOrEmpty(dir.File("exported.safetensors")) == run.weights);
}

TEST_CASE("servers killed while writing checkpoints leave usable ones behind") {
  const RunResult& reference = Undisturbed("sync");
  TempDir dir;
  TestJob job = Job("sync", dir);
  job.checkpoint_every_steps = 1;  // a write in flight nearly all the time
  RunResult run = Run(job, dir, [&](LocalCluster& cluster, const TempDir& d) {
    WaitForCheckpoint(d.File("checkpoints"), 400);
    Server(cluster, 0).Kill(SIGKILL);
  });
  // Whatever the kill interrupted, every file with a final name verifies.
  for (const CheckpointFileName& file :
       ListShardCheckpoints(LocalFileSystem(), job.checkpoint_dir)) {
    INFO(file.path);
    CHECK(ReadShardCheckpoint(LocalFileSystem(), file.path).ok());
  }
  CHECK(run.weights == reference.weights);
}

TEST_CASE(
    "a scheduler killed mid-training and restarted takes the job over; training never stopped") {
  const RunResult& reference = Undisturbed("sync");
  TempDir dir;
  std::string killed_log;
  RunResult run = Run(Job("sync", dir), dir,
                      [&](LocalCluster& cluster, const TempDir& d) {
                        WaitForCheckpoint(d.File("checkpoints"), 300);
                        cluster.scheduler().Kill(SIGKILL);
                        // Servers and workers train on while it is gone (nothing needs it in steady
                        // state).
                        std::vector<CheckpointFileName> before =
                            ListShardCheckpoints(LocalFileSystem(), d.File("checkpoints"));
                        WaitForCheckpoint(d.File("checkpoints"), before.front().step + 100);
                        REQUIRE(cluster.RestartScheduler(d.File("scheduler-restarted.log")).ok());
                      },
                      {}, {"--state_file", dir.File("scheduler.state")});
  CHECK(run.scheduler_log.find("took over the running job") != std::string::npos);
  CHECK(run.scheduler_log.find("declared dead") == std::string::npos);  // nobody was
  // The new scheduler is a process of its own (no credential is saved): the servers
  // learned its identity from its heartbeat replies, and installed its signed maps.
  int servers_that_learned = 0;
  for (const std::string& log : run.logs) {
    if (log.find("the scheduler's identity changed") != std::string::npos) ++servers_that_learned;
  }
  CHECK(servers_that_learned == 2);
  CHECK(run.weights == reference.weights);
}

TEST_CASE(
    "a scheduler stopped (SIGSTOP) for longer than the failure timeout declares nobody dead when "
    "it resumes") {
  // It heard no heartbeat while stopped, through no fault of the nodes'.
  const RunResult& reference = Undisturbed("sync");
  TempDir dir;
  RunResult run = Run(Job("sync", dir), dir, [&](LocalCluster& cluster, const TempDir& d) {
    WaitForCheckpoint(d.File("checkpoints"), 300);
    cluster.scheduler().Kill(SIGSTOP);
    absl::SleepFor(absl::Milliseconds(3 * kFailureTimeoutMs));
    cluster.scheduler().Kill(SIGCONT);
  });
  CHECK(run.scheduler_log.find("the scheduler did not run for") != std::string::npos);
  CHECK(run.scheduler_log.find("declared dead") == std::string::npos);
  CHECK(run.weights == reference.weights);
}

TEST_CASE(
    "a scheduler killed after an operator's shutdown, before any node heard it: its successor "
    "tells them, and the job ends") {
  TempDir dir;
  TestJob job = Job("sync", dir);
  job.failure_timeout_ms = 20000;  // the nodes are stopped for a while: not declared dead
  const std::string config = dir.WriteFile("job.yaml", TestJobYaml(job));
  const std::string state_file = dir.File("scheduler.state");
  absl::StatusOr<std::unique_ptr<LocalCluster>> started = LocalCluster::Start(
      config, dir.path(), job.servers, job.workers, {}, {"--state_file", state_file});
  REQUIRE(started.ok());
  LocalCluster& cluster = **started;
  WaitForCheckpoint(dir.File("checkpoints"), 100);
  // Every server and worker stopped: none can hear of the shutdown.
  for (size_t i = 1; i < cluster.processes().size(); ++i) cluster.processes()[i].Kill(SIGSTOP);
  ShutDownJob(cluster);
  // The scheduler dies once its state says so, before any node has heard it.
  SchedulerState saved;
  for (absl::Time until = absl::Now() + absl::Seconds(10);
       absl::Now() < until && !saved.shutdown_requested(); absl::SleepFor(absl::Milliseconds(10))) {
    saved.ParseFromString(ReadFileOrEmpty(state_file));
  }
  REQUIRE(saved.shutdown_requested());
  cluster.scheduler().Kill(SIGKILL);
  REQUIRE(cluster.RestartScheduler(dir.File("scheduler-restarted.log")).ok());
  for (size_t i = 1; i < cluster.processes().size(); ++i) {
    if (static_cast<int>(i) <= job.servers + job.workers) cluster.processes()[i].Kill(SIGCONT);
  }
  const absl::Status finished = cluster.WaitForAll(absl::Seconds(60));
  INFO(finished.ToString());
  CHECK(finished.ok());
  const std::string successor = cluster.scheduler().ReadLog();
  INFO(successor);
  CHECK(successor.find("a job that had ended (shut down by an operator)") != std::string::npos);
  CHECK(successor.find("every node has been told to stop") != std::string::npos);
  CHECK(successor.find("] info: final ") == std::string::npos);  // not trained on to the end
  CHECK(ReadFileOrEmpty(state_file).empty());  // removed: nothing left to take over
}

TEST_CASE(
    "a server drained while training runs, and a new one in its slot: shards move with their "
    "state") {
  const RunResult& reference = Undisturbed("sync");
  TempDir dir;
  int64_t drained_epoch = 0;
  RunResult run = Run(Job("sync", dir), dir, [&](LocalCluster& cluster, const TempDir& d) {
    WaitForCheckpoint(d.File("checkpoints"), 300);
    auto admin = Admin::NewStub(CreateChannel(cluster.scheduler_address()));
    grpc::ClientContext context;
    PrepareAdminCall(&context, absl::Seconds(10));
    DrainServerRequest request;
    request.set_node_name("ps-0");
    DrainServerResponse response;
    grpc::Status drained = admin->DrainServer(&context, request, &response);
    INFO(drained.error_message());
    REQUIRE(drained.ok());
    drained_epoch = response.epoch();
    WaitForCheckpoint(d.File("checkpoints"), 600);
    // The cluster admits no extra server, but the drained one's slot takes a new one.
    REQUIRE(cluster.StartServer(d.File("server-replacement.log")).ok());
  });
  CHECK(drained_epoch >= 2);
  CHECK(run.scheduler_log.find("ps-0 (re)joined") != std::string::npos);
  CHECK(run.scheduler_log.find("ps-0 drained") != std::string::npos);
  bool drained_server_exited = false;
  for (const std::string& log : run.logs) {
    if (log.find("drained: every shard was handed off") != std::string::npos)
      drained_server_exited = true;
  }
  CHECK(drained_server_exited);
  CHECK(run.weights == reference.weights);
}

// Drains `server` through the admin service; the map's epoch.
int64_t DrainServer(LocalCluster& cluster, const std::string& server) {
  auto admin = Admin::NewStub(CreateChannel(cluster.scheduler_address()));
  grpc::ClientContext context;
  PrepareAdminCall(&context, absl::Seconds(10));
  DrainServerRequest request;
  request.set_node_name(server);
  DrainServerResponse response;
  const grpc::Status drained = admin->DrainServer(&context, request, &response);
  INFO(drained.error_message());
  REQUIRE(drained.ok());
  return response.epoch();
}

// Runs `job`, starting one more server once step 300 is checkpointed (job.max_servers
// must leave room for it): it takes its share of primaries by handover.
RunResult RunAddingAServer(const TestJob& job, const TempDir& dir) {
  return Run(job, dir, [&](LocalCluster& cluster, const TempDir& d) {
    WaitForCheckpoint(d.File("checkpoints"), 300);
    REQUIRE(cluster.StartServer(d.File("server-added.log")).ok());
  });
}

TEST_CASE(
    "a server added mid-run (servers {min: 2, max: 3}) takes its fair share of primaries live: "
    "the undisturbed weights") {
  const RunResult& reference = Undisturbed("sync");
  TempDir dir;
  TestJob job = Job("sync", dir);
  job.max_servers = 3;
  job.replication = 2;
  RunResult run = RunAddingAServer(job, dir);
  INFO(run.scheduler_log);
  CHECK(run.scheduler_log.find("ps-2 (re)joined at") != std::string::npos);
  CHECK(run.scheduler_log.find("primaries rebalanced: shards [") != std::string::npos);
  CHECK(run.scheduler_log.find("rolls back") == std::string::npos);
  // The old primaries handed their shards over and follow the new one's log: no copy.
  bool handed_over = false;
  for (const std::string& log : run.logs) {
    handed_over |= log.find("] over to their new primaries") != std::string::npos;
    CHECK(log.find("copied from its primary ps-2") == std::string::npos);
  }
  CHECK(handed_over);
  CHECK(run.weights == reference.weights);  // moving a shard does not change the math
  // Every shard applied every step once, and the new server ended as primary of its
  // share (8 shards on 3 servers: 2 or 3), reporting them as it exits.
  ExpectEveryStepOnceOnEveryShard(run, job);
  const std::vector<int64_t> on_new = NumbersBefore(run.logs.back(), "updates applied");
  CHECK(on_new.size() >= 2);
  // The pause: each worker's longest step (the move's) against its median step.
  for (const std::string& log : run.logs) {
    const std::string line = FirstLineWith(log, "step_times median_ms=");
    if (line.empty()) continue;
    double median_ms = 0, longest_ms = 0;
    REQUIRE(std::sscanf(line.c_str() + line.find("step_times"),
                        "step_times median_ms=%lf longest_ms=%lf", &median_ms, &longest_ms) == 2);
    CHECK(median_ms > 0);
    CHECK(longest_ms >= median_ms);
    // The steps that met the move's map changes (the join, the primaries' switch) log
    // their time: the pause, against the median step. Printed, not bounded (a figure of
    // this shared machine, docs/FAULT_TOLERANCE.md).
    double move_ms = 0;
    const std::regex met(R"(completed: recovered; it took ([0-9.]+) ms)");
    for (auto it = std::sregex_iterator(log.begin(), log.end(), met); it != std::sregex_iterator();
         ++it) {
      move_ms = std::max(move_ms, std::stod((*it)[1].str()));
    }
    CHECK(move_ms > 0);  // the worker met the map changes
    WARN("server added: a worker's longest step during the move "
         << move_ms << " ms = " << move_ms / median_ms << " x its median step " << median_ms
         << " ms (its longest of the job: " << longest_ms << " ms)");
  }
}

TEST_CASE(
    "async, replication 2: a server added mid-run takes primaries by handover; the old "
    "primaries, closed to workers, apply their successors' pushes: every push once") {
  // Found by bench/memory_soak.py: a primary that handed its shard over stays its backup
  // but is closed to workers, and it refused its successor's async pushes as a closed
  // shard; the successor's pushes then waited on it for good.
  TempDir dir;
  TestJob job = Job("async", dir);
  job.max_steps = 1000;
  job.max_servers = 3;
  job.replication = 2;
  RunResult run = RunAddingAServer(job, dir);
  INFO(run.scheduler_log);
  CHECK(run.scheduler_log.find("primaries rebalanced: shards [") != std::string::npos);
  bool handed_over = false;
  for (const std::string& log : run.logs) {
    handed_over |= log.find("] over to their new primaries") != std::string::npos;
    CHECK(log.find("replica diverged") == std::string::npos);
  }
  CHECK(handed_over);
  ExpectEveryStepOnceOnEveryShard(run, job, 2 * 1000);  // 2 workers x 1000 acknowledged pushes
}

TEST_CASE("two servers drained one after the other: shards move with their state, bit-identical") {
  const RunResult& reference = Undisturbed("sync");
  TempDir dir;
  TestJob job = Job("sync", dir);
  job.servers = 4;
  job.replication = 2;
  RunResult run = Run(job, dir, [&](LocalCluster& cluster, const TempDir& d) {
    WaitForCheckpoint(d.File("checkpoints"), 300);
    const int64_t first = DrainServer(cluster, "ps-3");
    WaitForCheckpoint(d.File("checkpoints"), 600);
    CHECK(DrainServer(cluster, "ps-2") > first);
  });
  CHECK(run.scheduler_log.find("ps-3 drained") != std::string::npos);
  CHECK(run.scheduler_log.find("ps-2 drained") != std::string::npos);
  CHECK(run.weights == reference.weights);
  ExpectEveryStepOnceOnEveryShard(run, job);
}

TEST_CASE(
    "with dropped requests and dropped responses, sync training still ends with the undisturbed "
    "weights") {
  const RunResult& reference = Undisturbed("sync");
  TempDir dir;
  RunResult run = Run(Job("sync", dir), dir, nullptr,
                      {"--test_only_rpc_faults=drop_request=0.03,drop_response=0.03,seed=7"});
  int64_t duplicates = 0;
  for (const std::string& log : run.logs) {
    for (int64_t n : NumbersBefore(log, "duplicate pushes ignored")) duplicates += n;
  }
  CHECK(duplicates > 0);  // dropped responses were retried, and the retries ignored
  CHECK(run.weights == reference.weights);
}

TEST_CASE(
    "workers whose start-up outlasts the failure timeout are heard through it: nobody is "
    "declared dead, and the weights are the undisturbed run's") {
  const RunResult& reference = Undisturbed("sync");
  TempDir dir;
  // Twice the failure timeout between the cluster forming and each worker's first step,
  // as a large test set to load or servers still restoring their shards would take.
  RunResult run = Run(Job("sync", dir), dir, nullptr,
                      {absl::StrCat("--test_only_start_delay_ms=", 2 * kFailureTimeoutMs)});
  CHECK(run.scheduler_log.find("declared dead") == std::string::npos);
  CHECK(run.weights == reference.weights);
}

TEST_CASE(
    "an operator's shutdown while the workers are still starting: they hear it, stop before "
    "their first step, and the scheduler sees every node told") {
  TempDir dir;
  TestJob job = Job("sync", dir);
  const std::string config = dir.WriteFile("job.yaml", TestJobYaml(job));
  absl::StatusOr<std::unique_ptr<LocalCluster>> started =
      LocalCluster::Start(config, dir.path(), job.servers, job.workers,
                          {absl::StrCat("--test_only_start_delay_ms=", 8 * kFailureTimeoutMs)});
  REQUIRE(started.ok());
  LocalCluster& cluster = **started;
  const auto starting = [&cluster] {
    int waiting = 0;
    for (ChildProcess& process : cluster.processes()) {
      if (process.ReadLog().find("TEST ONLY: waiting") != std::string::npos) ++waiting;
    }
    return waiting;
  };
  for (absl::Time until = absl::Now() + absl::Seconds(60);
       absl::Now() < until && starting() < job.workers; absl::SleepFor(absl::Milliseconds(20))) {
  }
  REQUIRE(starting() == job.workers);
  ShutDownJob(cluster);
  const absl::Status finished = cluster.WaitForAll(absl::Seconds(60));
  INFO(finished.ToString());
  CHECK(finished.ok());
  const std::string scheduler_log = cluster.scheduler().ReadLog();
  INFO(scheduler_log);
  CHECK(scheduler_log.find("every node has been told to stop") != std::string::npos);
  CHECK(scheduler_log.find("declared dead") == std::string::npos);
  int stopped = 0;
  for (ChildProcess& process : cluster.processes()) {
    const std::string log = process.ReadLog();
    if (log.find("stopped: the scheduler shut the job down before the first step") !=
        std::string::npos) {
      ++stopped;
      CHECK(log.find("training steps") == std::string::npos);
    }
  }
  CHECK(stopped == job.workers);
}

TEST_CASE(
    "an operator's shutdown before the cluster forms (a server never came): the workers "
    "waiting for it hear it and stop") {
  TempDir dir;
  TestJob job = Job("sync", dir);
  const std::string config = dir.WriteFile("job.yaml", TestJobYaml(job));
  // One of the job's servers is never started.
  absl::StatusOr<std::unique_ptr<LocalCluster>> started =
      LocalCluster::Start(config, dir.path(), job.servers - 1, job.workers);
  REQUIRE(started.ok());
  LocalCluster& cluster = **started;
  const auto registered_workers = [&cluster, &job] {
    int registered = 0;
    const std::string log = cluster.scheduler().ReadLog();
    for (int w = 0; w < job.workers; ++w)
      registered += log.find(absl::StrCat("registered worker-", w)) != std::string::npos;
    return registered;
  };
  for (absl::Time until = absl::Now() + absl::Seconds(60);
       absl::Now() < until && registered_workers() < job.workers;
       absl::SleepFor(absl::Milliseconds(20))) {
  }
  REQUIRE(registered_workers() == job.workers);
  ShutDownJob(cluster);
  int stopped = 0;
  // The scheduler, the job.servers - 1 servers started, then the workers.
  for (size_t i = job.servers; i < cluster.processes().size(); ++i) {
    ChildProcess& process = cluster.processes()[i];
    REQUIRE(WaitForLoggedNumber(process, R"(as rank (\d+))", absl::Seconds(30)).ok());
    // Well within the start-up timeout (600 s) they would otherwise wait.
    const absl::StatusOr<int> exit_code = process.WaitForExit(absl::Now() + absl::Seconds(30));
    const std::string log = process.ReadLog();
    INFO(log);
    REQUIRE(exit_code.ok());
    CHECK(*exit_code == 0);
    CHECK(log.find("stopped: the scheduler shut the job down before the first step") !=
          std::string::npos);
    ++stopped;
  }
  CHECK(stopped == job.workers);
}

TEST_CASE("with dropped requests and responses, async shards apply every push exactly once") {
  TempDir dir;
  TestJob job = Job("async", dir);
  job.max_steps = 400;
  RunResult run = Run(job, dir, nullptr,
                      {"--test_only_rpc_faults=drop_request=0.05,drop_response=0.05,seed=3"});
  std::vector<int64_t> applied;
  int64_t duplicates = 0;
  for (const std::string& log : run.logs) {
    for (int64_t n : NumbersBefore(log, "updates applied")) applied.push_back(n);
    for (int64_t n : NumbersBefore(log, "duplicate pushes ignored")) duplicates += n;
  }
  REQUIRE(applied.size() == static_cast<size_t>(job.shards));
  for (int64_t n : applied)
    CHECK(n == 2 * 400);  // 2 workers x 400 acknowledged pushes: 0 lost, 0 twice
  CHECK(duplicates > 0);
}

TEST_CASE("time-based and on-demand checkpoints are complete snapshots at one step") {
  TempDir dir;
  TestJob job = Job("sync", dir);
  job.checkpoint_every_steps = 0;
  std::string yaml = TestJobYaml(job);
  const std::string periodic = "  every_steps: 0\n";
  yaml.replace(yaml.find(periodic), periodic.size(), periodic + "  every_seconds: 1\n");
  const std::string config = dir.WriteFile("job.yaml", yaml);
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(config, dir.path(), 2, 2);
  REQUIRE(cluster.ok());
  const int64_t total = 784 * 128 + 128 + 128 * 10 + 10;
  // Time-based: after a couple of seconds a complete checkpoint past step 0 exists.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (NewestCompleteCheckpointStep(LocalFileSystem(), job.checkpoint_dir, total) <= 0 &&
         absl::Now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(NewestCompleteCheckpointStep(LocalFileSystem(), job.checkpoint_dir, total) > 0);
  // On demand, through the scheduler's admin RequestCheckpoint.
  auto admin = Admin::NewStub(CreateChannel((*cluster)->scheduler_address()));
  grpc::ClientContext context;
  PrepareAdminCall(&context, absl::Seconds(20));
  RequestCheckpointResponse response;
  grpc::Status requested =
      admin->RequestCheckpoint(&context, RequestCheckpointRequest(), &response);
  INFO(requested.error_message());
  REQUIRE(requested.ok());
  CHECK(response.step() > 0);
  while (
      !LoadRangeAtStep(LocalFileSystem(), job.checkpoint_dir, {0, total}, response.step()).ok() &&
      absl::Now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK(LoadRangeAtStep(LocalFileSystem(), job.checkpoint_dir, {0, total}, response.step()).ok());
  absl::Status finished = (*cluster)->WaitForAll(absl::Seconds(120));
  INFO(finished.ToString());
  REQUIRE(finished.ok());
}

}  // namespace
}  // namespace paramserver
