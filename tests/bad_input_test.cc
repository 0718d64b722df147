// Bad input reaching real daemon processes: a bad config, a corrupt data file, an absent
// scheduler, and bad requests from a peer. Each gets one clear line or a clear status;
// nothing crashes or hangs, and a server keeps serving after bad requests. And should a
// daemon crash all the same, its log says with which signal and where.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/checkpoint/shard_checkpoint.h"
#include "common/files/file_system.h"
#include "common/rpc/rpc_endpoints.h"
#include "common/rpc/scheduler_client.h"
#include "common/testing/local_cluster.h"
#include "common/testing/one_shard_calls.h"
#include "common/testing/temp_dir.h"
#include "common/wire/shard_layout.h"
#include "common/wire/sparse_rows.h"
#include "common/wire/tensor_codec.h"
#include "proto/parameter_server.grpc.pb.h"
#include "tests/cluster_config.h"
#include "tools/ctr_data.h"
#include "worker/cuda/gpu_devices.h"

namespace paramserver {
namespace {

// Runs a daemon to completion (20 s at most) and returns {exit code, output}.
std::pair<int, std::string> RunToExit(const std::vector<std::string>& argv, const TempDir& dir) {
  absl::StatusOr<ChildProcess> child = ChildProcess::Start(argv, dir.File("out.log"));
  REQUIRE(child.ok());
  absl::StatusOr<int> code = child->WaitForExit(absl::Now() + absl::Seconds(20));
  REQUIRE(code.ok());
  return {*code, child->ReadLog()};
}

TEST_CASE("every daemon refuses a bad config with one line naming the file, line and key") {
  TempDir dir;
  std::string yaml = TestJobYaml(TestJob{});
  yaml.replace(yaml.find("batch_size"), 10, "batch_sizes");
  const std::string config = dir.WriteFile("bad.yaml", yaml);
  for (const char* binary : {"scheduler/ps_scheduler", "ps/ps_server", "worker/ps_worker"}) {
    auto [code, output] = RunToExit({RunfilePath(binary), "--config", config}, dir);
    INFO(binary << ": " << output);
    CHECK(code == 2);
    CHECK(output.find(config + ":15: training.batch_sizes: unknown key") != std::string::npos);
    CHECK(std::count(output.begin(), output.end(), '\n') == 1);
  }
  auto [code, output] =
      RunToExit({RunfilePath("ps/ps_server"), "--config", dir.File("absent.yaml")}, dir);
  CHECK(code == 2);
  CHECK(output.find("absent.yaml: cannot read the cluster spec") != std::string::npos);
}

TEST_CASE(
    "a worker given a truncated data file exits with a clear line, without waiting for anyone") {
  TempDir dir;
  std::string yaml = TestJobYaml(TestJob{});
  const std::string truncated =
      dir.WriteFile("train-images.gz", std::string("\x1f\x8b\x08\x00garbage", 12));
  yaml += "data:\n  train_images: " + truncated + "\n";
  const std::string config = dir.WriteFile("job.yaml", yaml);
  auto [code, output] = RunToExit(
      {RunfilePath("worker/ps_worker"), "--config", config, "--scheduler", "127.0.0.1:1"}, dir);
  INFO(output);
  CHECK(code == 1);
  CHECK(output.find(truncated) != std::string::npos);
}

TEST_CASE(
    "a resume from a missing, partial, corrupt or other model's checkpoint is refused at start, "
    "naming the file and what is wrong, and nothing is overwritten") {
  TempDir dir;
  const std::string checkpoints = dir.File("checkpoints");
  REQUIRE(LocalFileSystem().CreateDir(checkpoints).ok());
  TestJob job;
  job.checkpoint_dir = checkpoints;
  job.checkpoint_every_steps = 50;
  job.resume = true;
  const std::string config = dir.WriteFile("job.yaml", TestJobYaml(job));
  constexpr int64_t kModel = 784 * 128 + 128 + 128 * 10 + 10;  // the spec's MLP
  // Step 100's two files; `end` is where the second ends (kModel: this model's).
  const auto write_step = [&](int64_t end, bool second) {
    for (int shard = 0; shard < (second ? 2 : 1); ++shard) {
      ShardState state;
      state.shard_id = shard;
      state.range = shard == 0 ? ParameterRange{0, 50000} : ParameterRange{50000, end};
      state.step = 100;
      state.values.assign(static_cast<size_t>(state.range.size()), 0.5f);
      state.optimizer = "adam(exp_avg,exp_avg_sq)";
      state.slots.assign(2, std::vector<float>(state.values.size(), 0.0f));
      REQUIRE(WriteShardCheckpoint(LocalFileSystem(), checkpoints, state).ok());
    }
  };
  // The folder's files and their bytes, to show the refusal changed nothing.
  const auto snapshot = [&] {
    std::map<std::string, std::string> files;
    absl::StatusOr<std::vector<std::string>> names = LocalFileSystem().ListDir(checkpoints);
    REQUIRE(names.ok());
    for (const std::string& name : *names) files[name] = ReadFileOrEmpty(checkpoints + "/" + name);
    return files;
  };
  const auto refused = [&](const std::string& case_name, const std::vector<std::string>& says) {
    const std::map<std::string, std::string> before = snapshot();
    auto [code, output] = RunToExit(
        {RunfilePath("scheduler/ps_scheduler"), "--config", config, "--listen", "127.0.0.1:0"},
        dir);
    INFO(case_name << ": " << output);
    CHECK(code != 0);
    CHECK(output.find("checkpoint.resume is set but " + checkpoints +
                      " holds no complete checkpoint of this model's 101770 parameters") !=
          std::string::npos);
    for (const std::string& text : says) CHECK(output.find(text) != std::string::npos);
    CHECK(snapshot() == before);
  };

  refused("no files", {"it holds no checkpoint files"});
  write_step(kModel, /*second=*/false);
  refused("a shard's file missing",
          {"step 100: no checkpoint in " + checkpoints + " at step 100 covers parameter 50000"});
  write_step(kModel, /*second=*/true);
  const std::string second = ShardCheckpointPath(checkpoints, 1, 100);
  std::string bytes = ReadFileOrEmpty(second);
  bytes[bytes.size() / 2] ^= 0x40;
  REQUIRE(WriteFileAtomically(LocalFileSystem(), second, bytes).ok());
  refused("a corrupt file", {second, "checksum"});
  write_step(kModel + 64, /*second=*/true);  // a larger model's checkpoint
  refused("another model's",
          {second + " holds parameters [50000, 101834) but this model has 101770: a checkpoint "
                    "of another model"});
}

TEST_CASE("a worker told to use a GPU where none is usable exits with one clear line") {
  absl::StatusOr<int> gpus = cuda::CountUsableGpus();
  if (gpus.ok()) {
    std::printf("SKIPPED: this machine has %d usable GPU(s)\n", *gpus);
    return;
  }
  TempDir dir;
  const std::string config = dir.WriteFile("job.yaml", TestJobYaml(TestJob{}));
  auto [code, output] = RunToExit({RunfilePath("worker/ps_worker"), "--config", config,
                                   "--scheduler", "127.0.0.1:1", "--device", "gpu"},
                                  dir);
  INFO(output);
  CHECK(code == 1);
  CHECK(output.find("device gpu asks for a GPU, but there is no usable GPU: ") !=
        std::string::npos);
  if (access("/proc/driver/nvidia/version", F_OK) != 0) {
    // No driver at all: the truth, not the runtime's "driver version is insufficient".
    CHECK(output.find("no GPU on this machine (no NVIDIA driver is loaded") != std::string::npos);
    CHECK(output.find("insufficient") == std::string::npos);
  }
  CHECK(std::count(output.begin(), output.end(), '\n') == 1);
}

TEST_CASE(
    "a server whose scheduler never answers gives up at its startup timeout with the reason") {
  TempDir dir;
  const std::string config = dir.WriteFile("job.yaml", TestJobYaml(TestJob{}));
  auto [code, output] = RunToExit({RunfilePath("ps/ps_server"), "--config", config, "--scheduler",
                                   "127.0.0.1:1", "--startup_timeout_s", "2"},
                                  dir);
  INFO(output);
  CHECK(code == 1);
  CHECK(output.find("register with the scheduler at 127.0.0.1:1") != std::string::npos);
}

// Registers this test as the cluster's one worker (its job has no cluster token) and
// returns the view once the cluster formed.
ClusterView JoinAsTheWorker(LocalCluster& cluster,
                            const std::shared_ptr<CallCredentials>& credentials) {
  SchedulerClient scheduler(cluster.scheduler_address(), absl::Seconds(5), credentials);
  absl::StatusOr<RegisterResponse> me =
      scheduler.Register(NODE_ROLE_WORKER, "127.0.0.1:9", absl::Now() + absl::Seconds(10));
  REQUIRE(me.ok());
  absl::StatusOr<ClusterView> view =
      scheduler.WaitForReady(me->node_name(), absl::Now() + absl::Seconds(20));
  REQUIRE(view.ok());
  return *view;
}

bool Says(const grpc::Status& status, grpc::StatusCode code, const std::string& text) {
  UNSCOPED_INFO(status.error_code() << ": " << status.error_message());
  return status.error_code() == code && status.error_message().find(text) != std::string::npos;
}

TEST_CASE("a daemon that crashes writes the signal and its stack to its log, and dies of it") {
  // The daemons inherit this: no core dumps of three processes.
  rlimit core;
  REQUIRE(getrlimit(RLIMIT_CORE, &core) == 0);
  core.rlim_cur = 0;
  REQUIRE(setrlimit(RLIMIT_CORE, &core) == 0);
  TempDir dir;
  TestJob job;
  job.servers = 1;
  job.workers = 1;
  job.shards = 2;
  job.max_steps = 0;  // a whole epoch: still training when the signals come
  const std::string config = dir.WriteFile("job.yaml", TestJobYaml(job));
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(config, dir.path(), 1, 1);
  REQUIRE(cluster.ok());
  REQUIRE(WaitForLoggedNumber((*cluster)->scheduler(), R"(cluster complete: (\d+) servers)",
                              absl::Seconds(60))
              .ok());
  // [scheduler, server, worker], all signalled before any is waited for: none outlives
  // another long enough to end the job over its loss.
  const char* const binaries[] = {"ps_scheduler", "ps_server", "ps_worker"};
  for (ChildProcess& process : (*cluster)->processes()) process.Kill(SIGSEGV);
  for (int i = 0; i < 3; ++i) {
    ChildProcess& process = (*cluster)->processes()[i];
    const absl::StatusOr<int> code = process.WaitForExit(absl::Now() + absl::Seconds(20));
    const std::string log = process.ReadLog();
    INFO(process.log_path() << ":\n" << log);
    REQUIRE(code.ok());
    CHECK(*code == 128 + SIGSEGV);
    CHECK(log.find(absl::StrCat("*** SIGSEGV received from process ", getpid(),
                                "; the stack of the thread it reached")) != std::string::npos);
    // Frames of the daemon itself (the handler's at least), as addr2line takes them.
    CHECK(log.find(absl::StrCat(binaries[i], "(+0x")) != std::string::npos);
    CHECK(log.find("*** end of the stack") != std::string::npos);
  }
}

TEST_CASE("a real ps_server answers bad pushes with clear statuses and keeps serving") {
  TempDir dir;
  TestJob job;
  job.servers = 1;
  job.workers = 1;
  job.shards = 2;
  const std::string config = dir.WriteFile("job.yaml", TestJobYaml(job));
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(config, dir.path(), 1, 0);
  REQUIRE(cluster.ok());
  // This test is the cluster's one worker.
  auto credentials = std::make_shared<CallCredentials>("");  // the job has no cluster token
  const ClusterView view = JoinAsTheWorker(**cluster, credentials);
  const ShardAssignment shard = view.shard_map().shards(1);
  const int64_t epoch = view.shard_map().epoch();
  auto stub = ParameterServerData::NewStub(CreateChannel(shard.server_address(), credentials));
  auto push = [&](int shard_id, int64_t with_epoch, int worker, const std::string& gradient) {
    PushRequest request;
    request.set_shard_id(shard_id);
    request.set_epoch(with_epoch);
    request.set_worker_rank(worker);
    request.set_step(0);
    request.set_gradient(gradient);
    PushResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return PushOneShard(*stub, &context, request, &response);
  };
  std::vector<float> gradient(shard.end() - shard.begin(), 0.01f);
  std::string good;
  AppendFloatsLittleEndian(gradient, &good);
  gradient[5] = std::numeric_limits<float>::quiet_NaN();
  std::string nan;
  AppendFloatsLittleEndian(gradient, &nan);

  CHECK(Says(push(shard.shard_id(), epoch + 1, 0, good), grpc::StatusCode::FAILED_PRECONDITION,
             "future epoch"));
  CHECK(Says(push(7, epoch, 0, good), grpc::StatusCode::FAILED_PRECONDITION,
             "does not hold shard 7"));
  CHECK(Says(push(shard.shard_id(), epoch, 0, good.substr(4)), grpc::StatusCode::INVALID_ARGUMENT,
             "expected"));
  CHECK(Says(push(shard.shard_id(), epoch, 0, nan), grpc::StatusCode::INVALID_ARGUMENT,
             "gradient[5]"));
  // The only worker pushing as another rank: not allowed, whatever the rank.
  CHECK(Says(push(shard.shard_id(), epoch, 1, good), grpc::StatusCode::PERMISSION_DENIED,
             "worker-0 may not push as worker 1"));
  REQUIRE(push(shard.shard_id(), epoch, 0, good).ok());

  PullRequest pull;
  pull.set_shard_id(shard.shard_id());
  pull.set_epoch(epoch);
  pull.set_worker_rank(0);
  pull.set_step(1);  // sync: ready once the single worker's step-0 push applied
  PullResponse pulled;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  REQUIRE(PullOneShard(*stub, &context, pull, &pulled).ok());
  CHECK(pulled.applied_updates() == 1);
  std::vector<float> values(shard.end() - shard.begin());
  CHECK(DecodeFloatsExactly(pulled.values(), absl::MakeSpan(values), "values").ok());
  CHECK(std::all_of(values.begin(), values.end(), [](float v) { return std::isfinite(v); }));

  ChildProcess& server = (*cluster)->processes()[1];
  CHECK_FALSE(server.WaitForExit(absl::Now()).ok());  // still running
  CHECK(server.ReadLog().find("refused a request from") != std::string::npos);
  server.Kill(SIGTERM);
  absl::StatusOr<int> code = server.WaitForExit(absl::Now() + absl::Seconds(10));
  REQUIRE(code.ok());
  // A clean shutdown, told apart from a finished job (a Kubernetes Job would count exit 0
  // as a completion and start no replacement).
  CHECK(*code == 143);  // kExitStoppedBySignal
}

// Writes a small CTR data set and a config of one server holding the MLP and two
// embedding buckets, and starts that cluster (the test is to be its one worker).
absl::StatusOr<std::unique_ptr<LocalCluster>> StartCtrClusterOfTwoBuckets(const TempDir& dir) {
  CtrDataOptions data;
  data.train_examples = 100;
  data.test_examples = 50;
  data.dense_features = 2;
  data.categorical_features = 3;
  REQUIRE(WriteCtrData(data, dir.File("train.tsv"), dir.File("test.tsv")).ok());
  const std::string config = dir.WriteFile("job.yaml", R"(cluster:
  scheduler: 127.0.0.1:0
  servers: 1
  workers: 1
  shards: 1
  embedding_shards: 2
model:
  type: ctr
  dense_features: 2
  categorical_features: 3
  embedding_dim: 2
  layers: [8, 1]
data:
  train: train.tsv
  test: test.tsv
)");
  return LocalCluster::Start(config, dir.path(), 1, 0);
}

// Ids of table C1: three on embedding bucket 1 of 2 (ours) and one on bucket 0 (theirs).
struct C1Ids {
  std::vector<int64_t> ours;
  int64_t theirs = -1;
};

// Finds the smallest ids of table C1 for C1Ids.
C1Ids FindC1IdsOfEachBucket() {
  // Ids of table C1 on bucket 1 (ours) and one on bucket 0 (not).
  std::vector<int64_t> ours;
  int64_t theirs = -1;
  for (int64_t id = 0; ours.size() < 3 || theirs < 0; ++id) {
    if (EmbeddingShardOf(0, id, 2) == 1) {
      if (ours.size() < 3) ours.push_back(id);
    } else if (theirs < 0) {
      theirs = id;
    }
  }
  return {ours, theirs};
}

// Pushes embedding-row gradients to `rows_server` as worker 0 at step 0: `ids`, `counts`
// of them per table, and `floats` gradient values. Copies the reply to `answer` if set.
struct RowsPusher {
  grpc::Status operator()(int shard_id, const std::string& ids, std::vector<int32_t> counts,
                          size_t floats, PushResponse* answer = nullptr) const {
    PushRequest request;
    request.set_shard_id(shard_id);
    request.set_epoch(epoch);
    request.set_worker_rank(0);
    request.set_step(0);
    request.set_ids(ids);
    for (int32_t c : counts) request.add_id_counts(c);
    AppendFloatsLittleEndian(std::vector<float>(floats, 0.5f), request.mutable_gradient());
    PushResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    const grpc::Status status = PushOneShard(*rows_server, &context, request, &response);
    if (answer != nullptr) *answer = response;
    return status;
  }

  ParameterServerData::Stub* rows_server = nullptr;
  int64_t epoch = 0;
};

// Checks that bad ids, counts and gradients pushed to shard `rows` are refused, each with
// a status naming what is wrong.
void CheckBadRowPushesRefused(const RowsPusher& push, int rows, const ClusterView& view,
                              const std::vector<int64_t>& ours, int64_t theirs) {
  CHECK(Says(push(rows, EncodeIds({ours[1], ours[0]}), {2, 0, 0}, 4),
             grpc::StatusCode::INVALID_ARGUMENT, "table C1: ids must be strictly increasing"));
  CHECK(Says(push(rows, EncodeIds({ours[0], ours[0]}), {2, 0, 0}, 4),
             grpc::StatusCode::INVALID_ARGUMENT, "table C1: ids must be strictly increasing"));
  CHECK(Says(push(rows, EncodeIds({theirs}), {1, 0, 0}, 2), grpc::StatusCode::INVALID_ARGUMENT,
             "belongs to embedding shard 0 of 2, not 1"));
  CHECK(Says(push(rows, EncodeIds({ours[0]}), {1, 0}, 2), grpc::StatusCode::INVALID_ARGUMENT,
             "ids for 2 tables; the model has 3"));
  CHECK(Says(push(rows, EncodeIds({ours[0]}), {1, 0, 0}, 3), grpc::StatusCode::INVALID_ARGUMENT,
             "expected 2 float32 values (8 bytes), got 12 bytes"));
  // Ids packed as int32 (12 bytes for 3 of them): not int64 ids.
  CHECK(Says(push(rows, std::string(12, '\1'), {3, 0, 0}, 6), grpc::StatusCode::INVALID_ARGUMENT,
             "12 bytes is not a whole number of int64 ids"));
  // More ids than any batch sends: refused before anything is sized by them (by the
  // batched call's parser, as it reads the part's header).
  CHECK(Says(push(rows, std::string((kMaxIdsPerShardCall + 1) * 8, '\0'), {0, 0, 0}, 0),
             grpc::StatusCode::INVALID_ARGUMENT, "at most 4194304 ids are accepted"));
  CHECK(Says(push(view.shard_map().shards(0).shard_id(), EncodeIds({ours[0]}), {1, 0, 0}, 2),
             grpc::StatusCode::INVALID_ARGUMENT,
             "holds dense parameters; ids name embedding rows"));
}

// Checks that a push whose next batch's rows (pull_next) are out of order is refused.
void CheckBadNextRowsRefused(const std::unique_ptr<ParameterServerData::Stub>& rows_server,
                             int64_t epoch, int rows, const std::vector<int64_t>& ours) {
  // The next batch's rows a push asks back (pull_next) are checked before it is taken.
  PushRequest request;
  request.set_shard_id(rows);
  request.set_epoch(epoch);
  request.set_worker_rank(0);
  request.set_step(0);
  request.set_ids(EncodeIds({ours[0]}));
  for (int32_t c : {1, 0, 0}) request.add_id_counts(c);
  AppendFloatsLittleEndian(std::vector<float>(2, 0.5f), request.mutable_gradient());
  request.set_pull_next(true);
  request.set_next_ids(EncodeIds({ours[2], ours[1]}));
  for (int32_t c : {2, 0, 0}) request.add_next_id_counts(c);
  PushResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  CHECK(Says(PushOneShard(*rows_server, &context, request, &response),
             grpc::StatusCode::INVALID_ARGUMENT,
             "next rows: table C1: ids must be strictly increasing"));
}

// Checks that after the refusals a good push is taken and a pull reads the rows back.
void CheckRowsServerKeepsServing(const RowsPusher& push,
                                 const std::unique_ptr<ParameterServerData::Stub>& rows_server,
                                 int64_t epoch, int rows, const std::vector<int64_t>& ours) {
  // And it keeps serving: a good push is taken (not a duplicate: nothing of the refused
  // ones was), and a pull reads the row back.
  PushResponse taken;
  REQUIRE(push(rows, EncodeIds({ours[0]}), {1, 0, 0}, 2, &taken).ok());
  CHECK_FALSE(taken.duplicate());
  PullRequest pull;
  pull.set_shard_id(rows);
  pull.set_epoch(epoch);
  pull.set_worker_rank(0);
  pull.set_step(0);
  pull.set_ids(EncodeIds({ours[0], ours[2]}));
  for (int32_t c : {2, 0, 0}) pull.add_id_counts(c);
  PullResponse pulled;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  REQUIRE(PullOneShard(*rows_server, &context, pull, &pulled).ok());
  CHECK(pulled.values().size() == 2 * 2 * sizeof(float));
}

TEST_CASE("a real ps_server refuses bad embedding pushes and pulls, naming what is wrong") {
  TempDir dir;
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = StartCtrClusterOfTwoBuckets(dir);
  REQUIRE(cluster.ok());
  auto credentials = std::make_shared<CallCredentials>("");
  const ClusterView view = JoinAsTheWorker(**cluster, credentials);
  REQUIRE(view.shard_map().shards_size() == 3);  // the MLP, then buckets 0 and 1
  const ShardAssignment rows_shard = view.shard_map().shards(2);
  REQUIRE(rows_shard.embedding_bucket() == 1);
  const int64_t epoch = view.shard_map().epoch();
  auto rows_server =
      ParameterServerData::NewStub(CreateChannel(rows_shard.server_address(), credentials));
  const C1Ids ids = FindC1IdsOfEachBucket();
  const RowsPusher push{rows_server.get(), epoch};
  const int rows = rows_shard.shard_id();
  CheckBadRowPushesRefused(push, rows, view, ids.ours, ids.theirs);
  CheckBadNextRowsRefused(rows_server, epoch, rows, ids.ours);
  CheckRowsServerKeepsServing(push, rows_server, epoch, rows, ids.ours);
  ChildProcess& server = (*cluster)->processes()[1];
  CHECK_FALSE(server.WaitForExit(absl::Now()).ok());  // still running
  server.Kill(SIGTERM);
  REQUIRE(server.WaitForExit(absl::Now() + absl::Seconds(10)).ok());
}

}  // namespace
}  // namespace paramserver
