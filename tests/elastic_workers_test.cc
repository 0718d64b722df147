// Workers that come and go in an async CTR job with `cluster.workers: {min: 2, max: 4}`
// and dynamic data, real processes on 127.0.0.1: the job starts with 2, a third and a
// fourth join while it trains, one of the first two is killed -9; it finishes, every
// epoch's data trained by whoever was there, and its test AUC is within 0.01 of an
// undisturbed 2-worker run of the same spec. And with fixed data ranges, a worker past min
// trains its rank's share (cut by max).
#include <cmath>
#include <csignal>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/testing/local_cluster.h"
#include "common/testing/temp_dir.h"
#include "tests/cluster_config.h"
#include "tools/ctr_data.h"

namespace paramserver {
namespace {

std::string JobYaml(const std::string& data) {
  return absl::StrCat(R"(cluster:
  scheduler: 127.0.0.1:0
  servers: 2
  workers: {min: 2, max: 4}
  shards: 2
  embedding_shards: 4
  heartbeat_interval_ms: 200
  failure_timeout_ms: 1500
model:
  type: ctr
  dense_features: 3
  categorical_features: 4
  embedding_dim: 8
  layers: [35, 16, 1]
training:
  mode: async
  batch_size: 32
  epochs: 4
  max_steps: 0
  shuffle: true
  embedding_optimizer: {type: adam, learning_rate: 0.02}
data:
  format: criteo
  sharding: dynamic
  chunk_batches: 8
  train: )",
                      data, R"(/train.tsv
  test: )",
                      data, "/test.tsv\n");
}

const std::string& DataDir() {
  static TempDir* dir = [] {
    auto* made = new TempDir();
    CtrDataOptions options;
    options.train_examples = 40000;
    options.test_examples = 4000;
    options.dense_features = 3;
    options.categorical_features = 4;
    options.vocabulary = 3000;
    REQUIRE(WriteCtrData(options, made->File("train.tsv"), made->File("test.tsv")).ok());
    return made;
  }();
  return dir->path();
}

// Runs the job with 2 workers, calling `during` once they started; returns the final
// test AUC (and the scheduler's log in *log).
double Run(const std::function<void(LocalCluster&, const TempDir&)>& during, std::string* log) {
  TempDir dir;
  const std::string config = dir.WriteFile("job.yaml", JobYaml(DataDir()));
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(config, dir.path(), 2, 2);
  REQUIRE(cluster.ok());
  if (during) during(**cluster, dir);
  const absl::Status finished = (*cluster)->WaitForAll(absl::Seconds(240));
  *log = (*cluster)->scheduler().ReadLog();
  INFO(finished.ToString());  // names a daemon that failed, with its log's end
  INFO(*log);
  REQUIRE(finished.ok());
  return (*cluster)->FinalValue("test_auc");
}

TEST_CASE("workers 2 -> 4 -> 3 in an async ctr job: it finishes, AUC within 0.01 of 2 workers") {
  std::string undisturbed_log;
  const double undisturbed = Run(nullptr, &undisturbed_log);
  std::string log;
  const double elastic = Run(
      [](LocalCluster& cluster, const TempDir& dir) {
        const auto joined = [&](int rank) {
          return WaitForLoggedNumber(cluster.scheduler(),
                                     absl::StrCat(R"(epoch (\d+): worker-)", rank, " joined"),
                                     absl::Seconds(60));
        };
        REQUIRE(cluster.StartWorker(dir.File("worker-third.log")).ok());
        REQUIRE(joined(2).ok());
        REQUIRE(cluster.StartWorker(dir.File("worker-fourth.log")).ok());
        REQUIRE(joined(3).ok());
        // [scheduler, 2 servers, the first 2 workers, the joined two]
        cluster.processes()[3].Kill(SIGKILL);
      },
      &log);
  INFO(log);
  CHECK(log.find("worker-2 joined") != std::string::npos);
  CHECK(log.find("4 worker(s) train now (cluster.workers 2..4)") != std::string::npos);
  CHECK(log.find("lost; its lease's untrained rest goes to another worker; 3 worker(s) train "
                 "now") != std::string::npos);
  // Killed while the job trained: before any worker finished.
  CHECK(log.find(" lost; ") < log.find(" finished: "));
  std::printf("test AUC: %.4f with workers 2 -> 4 -> 3, %.4f with 2 undisturbed\n", elastic,
              undisturbed);
  CHECK(undisturbed > 0.6);  // the model learned something
  CHECK(std::abs(elastic - undisturbed) <= 0.01);
}

TEST_CASE("fixed data ranges with a workers range: a worker past min trains its rank's share") {
  TempDir dir;
  TestJob job;
  job.mode = "async";
  job.workers = 2;
  job.max_workers = 3;
  job.shards = 4;
  job.max_steps = 0;  // 4 epochs of each rank's 625 batches: long enough to join
  job.epochs = 4;
  const std::string config = dir.WriteFile("job.yaml", TestJobYaml(job));
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(config, dir.path(), job.servers, 2);
  REQUIRE(cluster.ok());
  REQUIRE(WaitForLoggedNumber((*cluster)->scheduler(), R"(cluster complete: (\d+) servers)",
                              absl::Seconds(60))
              .ok());
  REQUIRE((*cluster)->StartWorker(dir.File("worker-third.log")).ok());
  const absl::Status finished = (*cluster)->WaitForAll(absl::Seconds(180));
  const std::string third = (*cluster)->processes().back().ReadLog();
  INFO((*cluster)->scheduler().ReadLog());
  INFO(third);
  INFO(finished.ToString());
  REQUIRE(finished.ok());
  // Cut by the range's max: rank 2's share is the last third of Fashion-MNIST's 60000.
  CHECK(third.find("on examples [40000, 60000)") != std::string::npos);
  CHECK((*cluster)->FinalValue("test_accuracy") > 0.7);
}

}  // namespace
}  // namespace paramserver
