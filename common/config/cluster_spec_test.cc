#include "common/config/cluster_spec.h"

#include <cstdlib>

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

constexpr char kFullSpec[] = R"(cluster:
  scheduler: 127.0.0.1:7000
  servers: 3
  workers: 4
  shards: 12
  heartbeat_interval_ms: 200
  failure_timeout_ms: 1000
  no_worker_timeout_ms: 600000
model:
  type: mlp
  layers: [784, 64, 32, 10]
  init_seed: 7
  init_from: init.safetensors
training:
  mode: ssp
  staleness: 2
  batch_size: 16
  epochs: 3
  max_steps: 100
  shuffle: false
  seed: 9
  wire_dtype: bfloat16
  overlap: true
  push_bucket_kb: 64
  optimizer: {type: adam, learning_rate: 0.01, beta1: 0.8, beta2: 0.99, epsilon: 1.0e-8}
data:
  train_images: train.gz
  train_labels: /abs/labels.gz
  test_images: t.gz
  test_labels: tl.gz
worker:
  device: gpu:1
checkpoint:
  dir: ckpt
  every_steps: 50
  keep: 4
  resume: true
output:
  weights: out.safetensors
)";

std::string ErrorOf(const std::string& yaml) {
  absl::StatusOr<ClusterSpec> spec = ParseClusterSpec(yaml, "job.yaml");
  REQUIRE_FALSE(spec.ok());
  CHECK(spec.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(spec.status().message());
}

TEST_CASE("every key of the documented spec is read") {
  absl::StatusOr<ClusterSpec> spec = ParseClusterSpec(kFullSpec, "job.yaml", "/jobs");
  REQUIRE(spec.ok());
  CHECK(spec->cluster.scheduler_address == "127.0.0.1:7000");
  CHECK(spec->cluster.servers == 3);
  CHECK(spec->cluster.workers == 4);
  CHECK(spec->cluster.shards == 12);
  CHECK(spec->cluster.heartbeat_interval_ms == 200);
  CHECK(spec->cluster.failure_timeout_ms == 1000);
  CHECK(spec->cluster.no_worker_timeout_ms == 600000);
  CHECK(spec->model.layers == std::vector<int64_t>{784, 64, 32, 10});
  CHECK(spec->model.init_seed == 7);
  CHECK(spec->model.init_from == "/jobs/init.safetensors");
  CHECK(spec->training.mode == TrainingMode::kSsp);
  CHECK(spec->training.staleness == 2);
  CHECK(spec->training.batch_size == 16);
  CHECK(spec->training.epochs == 3);
  CHECK(spec->training.max_steps == 100);
  CHECK_FALSE(spec->training.shuffle);
  CHECK(spec->training.seed == 9);
  CHECK(spec->training.wire_dtype == WireDtype::kBfloat16);
  CHECK(spec->training.overlap);
  CHECK(spec->training.push_bucket_kb == 64);
  CHECK(spec->training.optimizer.learning_rate == Approx(0.01));
  CHECK(spec->training.optimizer.beta1 == Approx(0.8));
  CHECK(spec->training.optimizer.beta2 == Approx(0.99));
  CHECK(spec->training.optimizer.epsilon == Approx(1e-8));
  CHECK(spec->data.train_images == "/jobs/train.gz");
  CHECK(spec->data.train_labels == "/abs/labels.gz");
  CHECK(spec->worker.device == "gpu:1");
  CHECK(spec->checkpoint.dir == "/jobs/ckpt");
  CHECK(spec->checkpoint.every_steps == 50);
  CHECK(spec->checkpoint.keep == 4);
  CHECK(spec->checkpoint.embedding_deltas == 4);  // the default
  CHECK(spec->checkpoint.resume);
  CHECK(spec->output.weights == "/jobs/out.safetensors");
}

TEST_CASE("absent keys take the documented defaults") {
  absl::StatusOr<ClusterSpec> spec = ParseClusterSpec("cluster: {scheduler: 'h:1'}\n", "job.yaml");
  REQUIRE(spec.ok());
  CHECK(spec->cluster.servers == 2);
  CHECK(spec->cluster.shards == 8);
  CHECK(spec->cluster.replication == 2);
  CHECK(spec->model.layers == std::vector<int64_t>{784, 128, 10});
  CHECK(spec->training.mode == TrainingMode::kSync);
  CHECK(spec->training.batch_size == 32);
  CHECK(spec->training.wire_dtype == WireDtype::kFloat32);
  CHECK_FALSE(spec->training.overlap);
  CHECK(spec->training.push_bucket_kb == 1024);
  CHECK(spec->training.optimizer.type == DenseOptimizerType::kAdam);
  CHECK(spec->training.optimizer.epsilon == Approx(1e-8));  // torch.optim.Adam's
  CHECK(spec->data.test_labels == "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz");
}

TEST_CASE(
    "replication defaults to 2 copies when there are 2 servers, else 1, and is bounded by "
    "servers") {
  absl::StatusOr<ClusterSpec> one =
      ParseClusterSpec("cluster: {scheduler: 'h:1', servers: 1}\n", "job.yaml");
  REQUIRE(one.ok());
  CHECK(one->cluster.replication == 1);
  absl::StatusOr<ClusterSpec> three =
      ParseClusterSpec("cluster: {scheduler: 'h:1', servers: 3, replication: 3}\n", "job.yaml");
  REQUIRE(three.ok());
  CHECK(three->cluster.replication == 3);
  CHECK(ErrorOf("cluster: {scheduler: 'h:1', servers: 2, replication: 3}\n") ==
        "job.yaml:1: cluster.replication: must be between 1 and servers (2), got 3");
  CHECK(ErrorOf("cluster: {scheduler: 'h:1', replication: -1}\n")
            .find("cluster.replication: must be between") != std::string::npos);
}

TEST_CASE("cluster.workers may be a range: the cluster forms at min, ranks up to max") {
  absl::StatusOr<ClusterSpec> fixed = ParseClusterSpec("cluster: {scheduler: 'h:1'}\n", "job.yaml");
  REQUIRE(fixed.ok());
  CHECK(fixed->cluster.workers == 2);
  CHECK(WorkerSlots(fixed->cluster) == 2);
  absl::StatusOr<ClusterSpec> ranged =
      ParseClusterSpec("cluster: {scheduler: 'h:1', workers: {min: 2, max: 8}}\n", "job.yaml");
  REQUIRE(ranged.ok());
  CHECK(ranged->cluster.workers == 2);
  CHECK(ranged->cluster.max_workers == 8);
  CHECK(WorkerSlots(ranged->cluster) == 8);
  CHECK(ErrorOf("cluster: {scheduler: 'h:1', workers: {min: 3, max: 2}}\n") ==
        "job.yaml:1: cluster.workers: max must be between min (3) and 4096, got 2");
  CHECK(ErrorOf("cluster: {scheduler: 'h:1', workers: {min: 0, max: 2}}\n") ==
        "job.yaml:1: cluster.workers: must be >= 1");
}

TEST_CASE("training.sync.backup_workers: below the workers' min, sync only, no clipping") {
  absl::StatusOr<ClusterSpec> spec = ParseClusterSpec(
      "cluster: {scheduler: 'h:1', workers: 4}\ntraining: {sync: {backup_workers: 1}}\n",
      "job.yaml");
  REQUIRE(spec.ok());
  CHECK(spec->training.backup_workers == 1);
  CHECK(ParseClusterSpec("cluster: {scheduler: 'h:1'}\n", "job.yaml")->training.backup_workers ==
        0);
  CHECK(ErrorOf("cluster: {scheduler: 'h:1', workers: {min: 2, max: 6}}\n"
                "training: {sync: {backup_workers: 2}}\n") ==
        "job.yaml:2: training.sync.backup_workers: must be below cluster.workers (its min, 2): "
        "a step needs one worker's push, got 2");
  CHECK(ErrorOf("cluster: {scheduler: 'h:1', workers: 3}\n"
                "training: {mode: async, sync: {backup_workers: 1}}\n") ==
        "job.yaml:2: training.sync.backup_workers: is for training.mode sync (async and ssp "
        "steps wait for no worker's push)");
  CHECK(ErrorOf("cluster: {scheduler: 'h:1', workers: 3}\n"
                "training: {sync: {backup_workers: -1}}\n") ==
        "job.yaml:2: training.sync.backup_workers: must be >= 0, got -1");
  CHECK(ErrorOf("cluster: {scheduler: 'h:1', workers: 3}\n"
                "training: {sync: {backup_workers: 1, backups: 2}}\n")
            .find("training.sync.backups") != std::string::npos);
  CHECK(ErrorOf("cluster: {scheduler: 'h:1', workers: 3}\n"
                "training: {sync: {backup_workers: 1}, optimizer: {clip_grad_norm: 1.0}}\n")
            .find("training.optimizer.clip_grad_norm: cannot be used with "
                  "training.sync.backup_workers") != std::string::npos);
}

TEST_CASE("training.embedding_mode: async tables under sync dense shards, ctr and torch only") {
  const std::string ctr = "model: {type: ctr}\ndata: {train: a.tsv, test: b.tsv}\n";
  absl::StatusOr<ClusterSpec> spec = ParseClusterSpec(
      "cluster: {scheduler: 'h:1', workers: 2}\ntraining: {embedding_mode: async}\n" + ctr,
      "job.yaml");
  REQUIRE(spec.ok());
  CHECK(spec->training.mode == TrainingMode::kSync);
  CHECK(spec->training.async_tables);
  CHECK(ShardTrainingMode(spec->training, /*embedding_shard=*/true) == TrainingMode::kAsync);
  CHECK(ShardTrainingMode(spec->training, /*embedding_shard=*/false) == TrainingMode::kSync);
  // Unset or sync: every shard trains in training.mode.
  for (const std::string& training : {std::string("{}"), std::string("{embedding_mode: sync}")}) {
    absl::StatusOr<ClusterSpec> plain = ParseClusterSpec(
        "cluster: {scheduler: 'h:1'}\ntraining: " + training + "\n" + ctr, "job.yaml");
    REQUIRE(plain.ok());
    CHECK_FALSE(plain->training.async_tables);
    CHECK(ShardTrainingMode(plain->training, true) == TrainingMode::kSync);
  }
  CHECK(ParseClusterSpec("cluster: {scheduler: 'h:1'}\nmodel: {type: torch}\n"
                         "worker: {command: [python3, t.py]}\ntraining: {embedding_mode: async}\n",
                         "job.yaml")
            .ok());
  CHECK(ErrorOf("cluster: {scheduler: 'h:1'}\ntraining: {embedding_mode: async}\n") ==
        "job.yaml:2: training.embedding_mode: is for models with embedding tables (ctr, torch); "
        "this model is an mlp");
  CHECK(ErrorOf("cluster: {scheduler: 'h:1'}\ntraining: {embedding_mode: sometimes}\n" + ctr) ==
        "job.yaml:2: training.embedding_mode: must be sync or async, got 'sometimes'");
  CHECK(ErrorOf("cluster: {scheduler: 'h:1'}\ntraining: {mode: ssp, embedding_mode: async}\n" +
                ctr) ==
        "job.yaml:2: training.embedding_mode: is for training.mode sync (a sync dense part with "
        "async tables); with training.mode ssp the tables train ssp as well");
  // Async tables in an async job: what it does anyway (no hybrid handling).
  absl::StatusOr<ClusterSpec> all_async = ParseClusterSpec(
      "cluster: {scheduler: 'h:1'}\ntraining: {mode: async, embedding_mode: async}\n" + ctr,
      "job.yaml");
  REQUIRE(all_async.ok());
  CHECK_FALSE(all_async->training.async_tables);
  CHECK(TrainingModesText(all_async->training) == "async");
  CHECK(
      ErrorOf("cluster: {scheduler: 'h:1'}\ntraining: {mode: async, embedding_mode: sync}\n" + ctr)
          .find("with training.mode async the tables train async as well") != std::string::npos);
}

TEST_CASE("cluster.servers may be a range: the job starts at its min and grows to its max") {
  absl::StatusOr<ClusterSpec> fixed =
      ParseClusterSpec("cluster: {scheduler: 'h:1', servers: 3}\n", "job.yaml");
  REQUIRE(fixed.ok());
  CHECK(fixed->cluster.servers == 3);
  CHECK(fixed->cluster.max_servers == 3);
  absl::StatusOr<ClusterSpec> ranged =
      ParseClusterSpec("cluster: {scheduler: 'h:1', servers: {min: 2, max: 6}}\n", "job.yaml");
  REQUIRE(ranged.ok());
  CHECK(ranged->cluster.servers == 2);
  CHECK(ranged->cluster.max_servers == 6);
  CHECK(ranged->cluster.replication == 2);  // from min
  CHECK(ErrorOf("cluster: {scheduler: 'h:1', servers: {min: 3, max: 2}}\n") ==
        "job.yaml:1: cluster.servers: max must be between min (3) and 1024, got 2");
  CHECK(ErrorOf("cluster: {scheduler: 'h:1', servers: {max: 4}}\n") ==
        "job.yaml:1: cluster.servers.min: a range needs its min");
  CHECK(ErrorOf("cluster: {scheduler: 'h:1', servers: {min: 2, most: 4}}\n")
            .find("cluster.servers.most: unknown key") != std::string::npos);
  CHECK(ErrorOf("cluster: {scheduler: 'h:1', servers: [2, 4]}\n") ==
        "job.yaml:1: cluster.servers: must be an integer or {min: N, max: M}");
  CHECK(ErrorOf("cluster: {scheduler: 'h:1', servers: {min: 0, max: 4}}\n") ==
        "job.yaml:1: cluster.servers: must be >= 1");
  CHECK(ErrorOf("cluster: {scheduler: 'h:1', servers: {min: 1, max: 4}}\n")
            .find("cluster.servers: a range needs replication >= 2 or checkpoint.dir") !=
        std::string::npos);
  CHECK(ParseClusterSpec(
            "cluster: {scheduler: 'h:1', servers: {min: 1, max: 4}}\ncheckpoint: {dir: /c}\n",
            "job.yaml")
            .ok());
}

TEST_CASE("an unknown key is an error naming the key and its line") {
  std::string yaml = kFullSpec;
  yaml.replace(yaml.find("  batch_size"), 12, "  batch_sise");
  const std::string error = ErrorOf(yaml);
  CHECK(error.find("job.yaml:17: training.batch_sise: unknown key") == 0);
  CHECK(error.find("batch_size") != std::string::npos);  // lists the known keys
}

TEST_CASE("a value of the wrong type names the key, the line and the value") {
  CHECK(ErrorOf("cluster:\n  scheduler: h:1\n  servers: two\n") ==
        "job.yaml:3: cluster.servers: must be an integer or {min: N, max: M}, got 'two'");
  CHECK(ErrorOf("cluster: {scheduler: 'h:1'}\ntraining:\n  shuffle: maybe\n") ==
        "job.yaml:3: training.shuffle: must be true or false, got 'maybe'");
  CHECK(ErrorOf("cluster: {scheduler: 'h:1'}\nmodel:\n  layers: [784, x, 10]\n")
            .find("job.yaml:3: model.layers: must be a list of integers") == 0);
}

TEST_CASE("out-of-range values are rejected with the reason") {
  CHECK(ErrorOf("cluster: {scheduler: 'h:1'}\ntraining:\n  batch_size: 0\n") ==
        "job.yaml:3: training.batch_size: must be >= 1, got 0");
  CHECK(ErrorOf("cluster: {scheduler: 'h:1'}\ntraining:\n  mode: lockstep\n") ==
        "job.yaml:3: training.mode: must be sync, async or ssp, got 'lockstep'");
  CHECK(ErrorOf("cluster: {scheduler: 'h:1'}\ntraining:\n  wire_dtype: fp8\n") ==
        "job.yaml:3: training.wire_dtype: must be float32, bfloat16 or float16, got 'fp8'");
  CHECK(ErrorOf("cluster: {scheduler: 'h:1'}\ntraining:\n  push_bucket_kb: -1\n") ==
        "job.yaml:3: training.push_bucket_kb: must be in [0, 2^30] (0: off), got -1");
  CHECK(
      ErrorOf("cluster: {scheduler: 'h:1', workers: 0}\n").find("cluster.workers: must be >= 1") !=
      std::string::npos);
  CHECK(ErrorOf("cluster: {scheduler: 'nocolon'}\n").find("cluster.scheduler: must be host:port") !=
        std::string::npos);
  CHECK(
      ErrorOf("cluster: {scheduler: 'h:1', heartbeat_interval_ms: 500, failure_timeout_ms: 100}\n")
          .find("failure_timeout_ms: must be greater than heartbeat_interval_ms") !=
      std::string::npos);
  CHECK(ErrorOf("cluster: {scheduler: 'h:1', failure_timeout_ms: 3000, no_worker_timeout_ms: "
                "2000}\n")
            .find("cluster.no_worker_timeout_ms: must be 0 (no limit) or greater than "
                  "failure_timeout_ms") != std::string::npos);
  CHECK(ErrorOf("cluster: {scheduler: 'h:1', no_worker_timeout_ms: -1}\n")
            .find("cluster.no_worker_timeout_ms") != std::string::npos);
  CHECK(ErrorOf("cluster: {scheduler: 'h:1'}\nmodel: {layers: [784]}\n").find("model.layers") !=
        std::string::npos);
  CHECK(ErrorOf("cluster: {scheduler: 'h:1'}\ncheckpoint: {resume: true}\n")
            .find("checkpoint.resume: needs checkpoint.dir") != std::string::npos);
  CHECK(ErrorOf("cluster: {scheduler: 'h:1'}\ncheckpoint: {dir: d, keep: 1}\n")
            .find("checkpoint.keep: must be >= 2") != std::string::npos);
  CHECK(ErrorOf("cluster: {scheduler: 'h:1'}\ncheckpoint: {dir: d, embedding_deltas: -1}\n")
            .find("checkpoint.embedding_deltas: must be in [0, 1000]") != std::string::npos);
  CHECK(ErrorOf("cluster: {scheduler: 'h:1'}\nworker:\n  device: tpu\n") ==
        "job.yaml:3: worker.device: must be auto, cpu, gpu or gpu:N, got 'tpu'");
  CHECK(ErrorOf("cluster: {scheduler: 'h:1'}\nworker: {device: 'gpu:x'}\n").find("worker.device") !=
        std::string::npos);
  CHECK(ErrorOf("cluster: {scheduler: 'h:1'}\ntraining: {optimizer: {type: lamb}}\n") ==
        "job.yaml:2: training.optimizer.type: must be one of sgd, adam, adamw, adagrad, rmsprop, "
        "got 'lamb'");
  CHECK(ErrorOf("cluster: {scheduler: 'h:1'}\ntraining: {optimizer: {beta1: 1.0}}\n")
            .find("training.optimizer.beta1: must be in [0, 1)") != std::string::npos);
}

constexpr char kCtrSpec[] = R"(cluster:
  scheduler: 127.0.0.1:7000
  embedding_shards: 5
model:
  type: ctr
  dense_features: 3
  categorical_features: 2
  embedding_dim: 4
  layers: [11, 8, 1]
  max_rows: 1000
  min_count: 2
training:
  embedding_optimizer: {type: adagrad, learning_rate: 0.05, epsilon: 1.0e-10}
data:
  format: criteo
  train: [day_0.gz, /data/day_1]
  test: test.tsv
)";

TEST_CASE("a ctr model's keys are read") {
  absl::StatusOr<ClusterSpec> spec = ParseClusterSpec(kCtrSpec, "job.yaml", "/jobs");
  REQUIRE(spec.ok());
  CHECK(spec->cluster.embedding_shards == 5);
  CHECK(spec->model.type == ModelType::kCtr);
  CHECK(spec->model.dense_features == 3);
  CHECK(spec->model.categorical_features == 2);
  CHECK(spec->model.embedding_dim == 4);
  CHECK(spec->model.layers == std::vector<int64_t>{11, 8, 1});
  CHECK(spec->model.max_rows == 1000);
  CHECK(spec->model.min_count == 2);
  CHECK(spec->training.embedding_optimizer.type == EmbeddingOptimizerType::kAdagrad);
  CHECK(spec->training.embedding_optimizer.learning_rate == Approx(0.05));
  CHECK(spec->training.embedding_optimizer.epsilon == Approx(1e-10));
  CHECK(spec->data.format == DataFormat::kCriteo);
  CHECK(spec->data.train == std::vector<std::string>{"/jobs/day_0.gz", "/data/day_1"});
  CHECK(spec->data.test == std::vector<std::string>{"/jobs/test.tsv"});
  // "~/" is the home folder, wherever the spec lives.
  setenv("HOME", "/home/tester", 1);
  absl::StatusOr<ClusterSpec> home = ParseClusterSpec(
      "cluster: {scheduler: 'h:1'}\nmodel: {type: ctr}\ndata: {train: ~/d/a.gz, test: b}\n",
      "job.yaml", "/jobs");
  REQUIRE(home.ok());
  CHECK(home->data.train[0] == "/home/tester/d/a.gz");
}

TEST_CASE("a ctr model's defaults: criteo data, 8 embedding shards, an MLP 256-128-1") {
  absl::StatusOr<ClusterSpec> spec = ParseClusterSpec(
      "cluster: {scheduler: 'h:1'}\nmodel: {type: ctr}\ndata: {train: a.tsv, test: b.tsv}\n",
      "job.yaml");
  REQUIRE(spec.ok());
  CHECK(spec->cluster.embedding_shards == kDefaultEmbeddingShards);
  CHECK(spec->model.layers == std::vector<int64_t>{13 + 26 * 16, 256, 128, 1});
  CHECK(spec->data.format == DataFormat::kCriteo);
  CHECK(spec->training.embedding_optimizer.type == EmbeddingOptimizerType::kAdam);
  CHECK(spec->model.min_count == 1);
}

TEST_CASE("ctr keys are checked, and refused where they do not belong") {
  const std::string base = "cluster: {scheduler: 'h:1'}\n";
  const std::string ctr_data = "data: {train: a, test: b}\n";
  CHECK(ErrorOf(base + "model: {type: ctr, layers: [400, 1]}\n" + ctr_data) ==
        "job.yaml:2: model.layers: must start with dense_features + the tables' dims "
        "(embedding_dim, or a table's own in model.tables) = 429 and end with 1 (one logit)");
  CHECK(ErrorOf(base + "model: {type: tree}\n") ==
        "job.yaml:2: model.type: must be mlp, ctr or torch, got 'tree'");
  CHECK(ErrorOf(base + "model: {embedding_dim: 8}\n") ==
        "job.yaml:2: model.embedding_dim: is for model.type ctr; this model is an mlp");
  CHECK(ErrorOf(base + "model: {type: ctr, min_count: 0}\n" + ctr_data)
            .find("model.min_count: must be in [1, 10^6]") != std::string::npos);
  CHECK(ErrorOf(base + "model: {type: ctr}\ndata: {train: a}\n") ==
        "job.yaml:3: data.test: must name at least one file");
  CHECK(ErrorOf(base + "model: {type: ctr}\ndata: {train: a, test: b, train_images: x}\n") ==
        "job.yaml:3: data.train_images: is an idx file; criteo data is given as train and test");
  CHECK(ErrorOf(base + "data: {format: criteo, train: a, test: b}\n") ==
        "job.yaml:2: data.format: criteo data is for model.type ctr");
  CHECK(ErrorOf(base + "data: {train: a}\n") ==
        "job.yaml:2: data.train: is for criteo data; idx data is given as train_images, ...");
  CHECK(ErrorOf(base + "training: {embedding_optimizer: {type: adam}}\n") ==
        "job.yaml:2: training.embedding_optimizer: is for models with embedding tables (ctr, "
        "torch); this model is an mlp");
  CHECK(ErrorOf(base + "model: {type: ctr}\ntraining: {embedding_optimizer: {type: rmsprop}}\n" +
                ctr_data) ==
        "job.yaml:3: training.embedding_optimizer.type: must be adam, adagrad, sgd, "
        "rowwise_adagrad or ftrl, got 'rmsprop'");
  CHECK(
      ErrorOf(base +
              "model: {type: ctr}\ntraining: {embedding_optimizer: {type: ftrl, "
              "learning_rate_power: 0.5}}\n" +
              ctr_data)
          .find("training.embedding_optimizer.learning_rate_power: must be a finite number <= 0") !=
      std::string::npos);
  CHECK(ErrorOf(base +
                "model: {type: ctr}\ntraining: {embedding_optimizer: {type: adam, l1: "
                "0.1}}\n" +
                ctr_data)
            .find("training.embedding_optimizer.l1: is a setting of ftrl only") !=
        std::string::npos);
  CHECK(ErrorOf(base +
                "model: {type: ctr}\ntraining: {embedding_optimizer: {type: "
                "rowwise_adagrad, initial_accumulator_value: -1}}\n" +
                ctr_data)
            .find("initial_accumulator_value: must be a finite number >= 0") != std::string::npos);
  CHECK(ErrorOf("cluster: {scheduler: 'h:1', embedding_shards: 4}\n") ==
        "job.yaml:1: cluster.embedding_shards: is for models with embedding tables (an mlp has "
        "none)");
  CHECK(ErrorOf("cluster: {scheduler: 'h:1', embedding_shards: -1}\n")
            .find("cluster.embedding_shards: must be in [1, 4096]") != std::string::npos);
  CHECK(*ParseEmbeddingOptimizerType("sgd") == EmbeddingOptimizerType::kSgd);
  CHECK(std::string(ParseEmbeddingOptimizerType("rmsprop").status().message()) ==
        "embedding optimizer 'rmsprop': one of adam, adagrad, sgd, rowwise_adagrad, ftrl");
  CHECK(*ParseEmbeddingOptimizerType("ftrl") == EmbeddingOptimizerType::kFtrl);
}

TEST_CASE("model.tables: a ctr table's own dim, capacity and row optimizer") {
  const std::string head =
      "cluster: {scheduler: 'h:1'}\ndata: {train: a, test: b}\n"
      "training: {embedding_optimizer: {type: ftrl, learning_rate: 0.5, l1: 0.01, "
      "initial_accumulator_value: 0.2}}\n";
  absl::StatusOr<ClusterSpec> spec =
      ParseClusterSpec(head +
                           "model:\n  type: ctr\n  dense_features: 1\n  categorical_features: 3\n"
                           "  embedding_dim: 4\n  max_rows: 100\n  tables:\n"
                           "    C2: {dim: 8, max_rows: 50, min_count: 3, optimizer: {l2: 0.5}}\n"
                           "    C3: {optimizer: {type: rowwise_adagrad, learning_rate: 0.1}}\n",
                       "job.yaml");
  REQUIRE(spec.ok());
  const std::vector<CtrTableSpec> tables = CtrTables(spec->model);
  REQUIRE(tables.size() == 3);
  CHECK(CtrTableDims(spec->model) == std::vector<int>{4, 8, 4});
  // The default MLP starts with the dense features and every table's row.
  CHECK(spec->model.layers == std::vector<int64_t>{1 + 4 + 8 + 4, 256, 128, 1});
  // C1 names nothing of its own: the job's settings.
  CHECK(tables[0].name == "C1");
  CHECK_FALSE(tables[0].settings.max_rows.has_value());
  CHECK_FALSE(tables[0].settings.optimizer.has_value());
  // C2 keeps the job's type, so the keys it leaves out are the job's.
  CHECK(*tables[1].settings.max_rows == 50);
  CHECK(*tables[1].settings.min_count == 3);
  REQUIRE(tables[1].settings.optimizer.has_value());
  CHECK(tables[1].settings.optimizer->type == EmbeddingOptimizerType::kFtrl);
  CHECK(tables[1].settings.optimizer->learning_rate == 0.5);
  CHECK(tables[1].settings.optimizer->l1 == 0.01);
  CHECK(tables[1].settings.optimizer->l2 == 0.5);
  CHECK(tables[1].settings.optimizer->initial_accumulator_value == 0.2);
  // C3 names another type: that type's defaults, not the job's ftrl settings.
  REQUIRE(tables[2].settings.optimizer.has_value());
  CHECK(tables[2].settings.optimizer->type == EmbeddingOptimizerType::kRowwiseAdagrad);
  CHECK(tables[2].settings.optimizer->learning_rate == 0.1);
  CHECK(tables[2].settings.optimizer->initial_accumulator_value == 0);
  CHECK(tables[2].settings.optimizer->l1 == 0);

  const std::string ctr = "model:\n  type: ctr\n  categorical_features: 3\n  tables:\n";
  CHECK(ErrorOf(head + ctr + "    C4: {dim: 8}\n") ==
        "job.yaml:8: model.tables.C4: no such table: this ctr model's tables are C1 to C3 "
        "(model.categorical_features)");
  CHECK(ErrorOf(head + ctr + "    C01: {dim: 8}\n").find("model.tables.C01: no such table") !=
        std::string::npos);
  CHECK(ErrorOf(head + ctr + "    C1: {dim: 0}\n") ==
        "job.yaml:8: model.tables.C1.dim: must be in [1, 1024]");
  CHECK(ErrorOf(head + ctr + "    C1: {size: 8}\n").find("model.tables.C1.size: unknown key") !=
        std::string::npos);
  CHECK(ErrorOf(head + ctr + "    C1: {min_count: 0}\n") ==
        "job.yaml:8: model.tables.C1.min_count: must be in [1, 10^6] (1: a row at the first "
        "sighting)");
  CHECK(ErrorOf(head + ctr + "    C1: {max_rows: -1}\n") ==
        "job.yaml:8: model.tables.C1.max_rows: must be in [0, 2^40] (0: no bound)");
  CHECK(
      ErrorOf(head + ctr + "    C1: {optimizer: {learning_rate_power: 0.5}}\n") ==
      "job.yaml:8: model.tables.C1.optimizer.learning_rate_power: must be a finite number <= 0 (as "
      "tf.keras.optimizers.Ftrl's)");
  CHECK(ErrorOf(head + ctr + "    C1: {optimizer: {learning_rate_power: -.inf}}\n")
            .find("learning_rate_power: must be a finite number <= 0") != std::string::npos);
  // Settings are checked as the rows use them, in float32.
  CHECK(ErrorOf(head + ctr + "    C1: {optimizer: {type: adagrad, epsilon: 1.0e-50}}\n") ==
        "job.yaml:8: model.tables.C1.optimizer.epsilon: must be a positive number (in float32's "
        "range)");
  CHECK(ErrorOf(head + ctr + "    C1: {optimizer: {learning_rate: 1.0e+39}}\n")
            .find("learning_rate: must be a positive number (in float32's range)") !=
        std::string::npos);
  CHECK(ErrorOf(head + ctr + "    C1: {max_rows: 9223372036854775807}\n") ==
        "job.yaml:8: model.tables.C1.max_rows: must be in [0, 2^40] (0: no bound)");
  CHECK(ErrorOf(head + ctr + "    C1: {optimizer: {type: sgd, l1: 0.1}}\n") ==
        "job.yaml:8: model.tables.C1.optimizer.l1: is a setting of ftrl only");
  CHECK(ErrorOf(head + ctr + "    C1: {optimizer: {type: lion}}\n") ==
        "job.yaml:8: model.tables.C1.optimizer.type: must be adam, adagrad, sgd, "
        "rowwise_adagrad or ftrl, got 'lion'");
  CHECK(ErrorOf(head + "model: {type: ctr, dense_features: 1, categorical_features: 2, "
                       "embedding_dim: 2, layers: [5, 1], tables: {C1: {dim: 3}}}\n") ==
        "job.yaml:4: model.layers: must start with dense_features + the tables' dims "
        "(embedding_dim, or a table's own in model.tables) = 6 and end with 1 (one logit)");
  // Where there are no ctr tables, the key is refused with what to do instead.
  CHECK(ErrorOf("cluster: {scheduler: 'h:1'}\nmodel: {tables: {C1: {dim: 2}}}\n") ==
        "job.yaml:2: model.tables: is for a ctr model's tables; an mlp has none");
  CHECK(ErrorOf("cluster: {scheduler: 'h:1'}\nmodel: {type: torch, tables: {x: {dim: 2}}}\n"
                "worker: {command: [python3, t.py]}\n")
            .find("model.tables: is for a ctr model's tables; a torch script gives a table its "
                  "own settings as paramserver.Embedding's arguments") != std::string::npos);
}

TEST_CASE("a table's optimizer from a script's text inherits as model.tables does") {
  EmbeddingOptimizerOptions job;
  job.type = EmbeddingOptimizerType::kAdam;
  job.learning_rate = 0.02;
  job.epsilon = 1e-9;
  absl::StatusOr<EmbeddingOptimizerOptions> same = ParseTableOptimizer("{beta1: 0.5}", job);
  REQUIRE(same.ok());
  CHECK(same->type == EmbeddingOptimizerType::kAdam);
  CHECK(same->learning_rate == 0.02);
  CHECK(same->epsilon == 1e-9);
  CHECK(same->beta1 == 0.5);
  absl::StatusOr<EmbeddingOptimizerOptions> ftrl =
      ParseTableOptimizer("{\"type\": \"ftrl\", \"l1\": 0.001}", job);  // JSON, as json.dumps
  REQUIRE(ftrl.ok());
  CHECK(ftrl->type == EmbeddingOptimizerType::kFtrl);
  CHECK(ftrl->learning_rate == 0.001);            // ftrl's default, not the job's
  CHECK(ftrl->initial_accumulator_value == 0.1);  // tf.keras.optimizers.Ftrl's
  CHECK(ftrl->l1 == 0.001);
  CHECK(std::string(ParseTableOptimizer("{learning_rate: -1}", job).status().message()) ==
        "optimizer.learning_rate: must be a positive number (in float32's range)");
  CHECK(std::string(ParseTableOptimizer("{momentum: 0.9}", job).status().message())
            .find("optimizer.momentum: unknown key") == 0);
  CHECK(std::string(ParseTableOptimizer("[1, 2]", job).status().message()) ==
        "optimizer: must be a mapping of keys to values");
  CHECK(std::string(ParseTableOptimizer("{learning_rate: [1]}", job).status().message()) ==
        "optimizer.learning_rate: must be a single value");
}

TEST_CASE("data.sharding: dynamic is for async jobs without max_steps; chunk_batches checked") {
  const std::string base = "cluster: {scheduler: 'h:1'}\n";
  absl::StatusOr<ClusterSpec> spec =
      ParseClusterSpec(base +
                           "training: {mode: async, max_steps: 0}\n"
                           "data: {sharding: dynamic, chunk_batches: 4}\n",
                       "job.yaml");
  REQUIRE(spec.ok());
  CHECK(spec->data.sharding == DataSharding::kDynamic);
  CHECK(spec->data.chunk_batches == 4);
  absl::StatusOr<ClusterSpec> fixed = ParseClusterSpec(base, "job.yaml");
  REQUIRE(fixed.ok());
  CHECK(fixed->data.sharding == DataSharding::kFixed);
  CHECK(ErrorOf(base + "training: {mode: sync}\ndata: {sharding: dynamic}\n") ==
        "job.yaml:3: data.sharding: dynamic needs training.mode async");
  CHECK(ErrorOf(base + "training: {mode: async, max_steps: 10}\ndata: {sharding: dynamic}\n") ==
        "job.yaml:3: data.sharding: dynamic trains every epoch's examples once: remove "
        "training.max_steps (a cap on each worker's steps)");
  CHECK(ErrorOf(base + "data: {sharding: random}\n") ==
        "job.yaml:2: data.sharding: must be fixed or dynamic, got 'random'");
  CHECK(ErrorOf(base + "data: {chunk_batches: 0}\n") ==
        "job.yaml:2: data.chunk_batches: must be 1 to 1048576, got 0");
  // A torch job's data section is its script's, but for chunk_batches (job.batches()).
  absl::StatusOr<ClusterSpec> torch = ParseClusterSpec(
      base + "model: {type: torch}\nworker: {command: [x]}\ndata: {chunk_batches: 3, mine: 1}\n",
      "job.yaml");
  REQUIRE(torch.ok());
  CHECK(torch->data.chunk_batches == 3);
}

TEST_CASE("a torch model: worker.command run from the spec's folder, data left to the script") {
  absl::StatusOr<ClusterSpec> spec = ParseClusterSpec(
      "cluster: {scheduler: 'h:1'}\nmodel: {type: torch, max_rows: 100}\n"
      "worker: {command: [python3, train.py, --lr, '0.1']}\n"
      "data: {images: x.gz, anything: [1, 2]}\n",
      "job.yaml", "/jobs/cnn");
  REQUIRE(spec.ok());
  CHECK(spec->model.type == ModelType::kTorch);
  CHECK(spec->worker.command == std::vector<std::string>{"python3", "train.py", "--lr", "0.1"});
  CHECK(spec->worker.command_dir == "/jobs/cnn");
  CHECK(spec->cluster.embedding_shards == kDefaultEmbeddingShards);
  CHECK(spec->model.max_rows == 100);
  CHECK(std::string(ModelTypeName(spec->model.type)) == "torch");

  const std::string base = "cluster: {scheduler: 'h:1'}\n";
  CHECK(ErrorOf(base + "model: {type: torch}\n") ==
        "job.yaml: worker.command: model.type torch needs the command each worker runs, e.g. "
        "[python3, train.py] (relative paths resolve from the spec's folder)");
  CHECK(ErrorOf(base + "model: {type: torch, layers: [4, 2]}\nworker: {command: [x]}\n") ==
        "job.yaml:2: model.layers: is for the built-in models; a torch model's tensors are its "
        "script's (the first worker's job.register declares them)");
  CHECK(ErrorOf(base + "model: {type: torch, embedding_dim: 4}\nworker: {command: [x]}\n") ==
        "job.yaml:2: model.embedding_dim: is for model.type ctr; this model is a torch model");
  CHECK(ErrorOf(base + "worker: {command: [python3, t.py]}\n") ==
        "job.yaml:2: worker.command: is for model.type torch (a script that trains its own "
        "model); this model is model.type mlp, which ps_worker trains");
  CHECK(ErrorOf(base + "model: {max_rows: 5}\n") ==
        "job.yaml:2: model.max_rows: is for models with embedding tables (ctr, torch); this "
        "model is an mlp");
}

TEST_CASE("malformed YAML and wrong shapes are errors, not crashes") {
  CHECK(ErrorOf("cluster: [unclosed\n").find("job.yaml:") == 0);
  CHECK(ErrorOf("").find("empty file") != std::string::npos);
  CHECK(ErrorOf("- just\n- a list\n").find("(top level): must be a mapping") != std::string::npos);
  CHECK(ErrorOf("cluster: 5\n").find("cluster: must be a mapping") != std::string::npos);
  CHECK(
      ErrorOf("cluster: {scheduler: [a, b]}\n").find("cluster.scheduler: must be a single value") !=
      std::string::npos);
}

TEST_CASE("LoadClusterSpec reports a missing file and resolves paths next to the file") {
  absl::StatusOr<ClusterSpec> missing = LoadClusterSpec("/nonexistent/job.yaml");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK(std::string(missing.status().message()).find("/nonexistent/job.yaml") == 0);
}

TEST_CASE("training.max_gradient_norm is unset by default, read when given, and must be positive") {
  absl::StatusOr<ClusterSpec> unset = ParseClusterSpec("cluster: {scheduler: 'h:1'}\n", "job.yaml");
  REQUIRE(unset.ok());
  CHECK(unset->training.max_gradient_norm == 0);  // no bound
  absl::StatusOr<ClusterSpec> set = ParseClusterSpec(
      "cluster: {scheduler: 'h:1'}\ntraining:\n  max_gradient_norm: 12.5\n", "job.yaml");
  REQUIRE(set.ok());
  CHECK(set->training.max_gradient_norm == 12.5);
  CHECK(ErrorOf("cluster: {scheduler: 'h:1'}\ntraining:\n  max_gradient_norm: 0\n") ==
        "job.yaml:3: training.max_gradient_norm: must be a positive finite number (leave it out "
        "for no bound), got 0");
  CHECK(ErrorOf("cluster: {scheduler: 'h:1'}\ntraining:\n  max_gradient_norm: -1\n") ==
        "job.yaml:3: training.max_gradient_norm: must be a positive finite number (leave it out "
        "for no bound), got -1");
  CHECK(ErrorOf("cluster: {scheduler: 'h:1'}\ntraining:\n  max_gradient_norm: .inf\n")
            .find("job.yaml:3: training.max_gradient_norm: must be a positive finite number") == 0);
  CHECK(ErrorOf("cluster: {scheduler: 'h:1'}\ntraining:\n  max_gradient_norm: .nan\n")
            .find("job.yaml:3: training.max_gradient_norm: must be a positive finite number") == 0);
  CHECK(ErrorOf("cluster: {scheduler: 'h:1'}\ntraining:\n  max_gradient_norm: big\n")
            .find("job.yaml:3: training.max_gradient_norm: must be") == 0);
}

}  // namespace
}  // namespace paramserver

namespace paramserver {
namespace {

DenseOptimizerOptions OptimizerOf(const std::string& section) {
  absl::StatusOr<ClusterSpec> spec = ParseClusterSpec(
      "cluster: {scheduler: 'h:1'}\ntraining:\n  optimizer: " + section + "\n", "job.yaml");
  INFO(spec.status().ToString());
  REQUIRE(spec.ok());
  return spec->training.optimizer;
}

std::string OptimizerErrorOf(const std::string& section) {
  absl::StatusOr<ClusterSpec> spec = ParseClusterSpec(
      "cluster: {scheduler: 'h:1'}\ntraining:\n  optimizer: " + section + "\n", "job.yaml");
  REQUIRE_FALSE(spec.ok());
  return std::string(spec.status().message());
}

TEST_CASE("each optimizer type takes torch.optim's defaults and its own keys") {
  const DenseOptimizerOptions sgd =
      OptimizerOf("{type: sgd, learning_rate: 0.1, momentum: 0.9, nesterov: true}");
  CHECK(sgd.type == DenseOptimizerType::kSgd);
  CHECK(sgd.momentum == 0.9);
  CHECK(sgd.nesterov);
  CHECK(sgd.dampening == 0);
  CHECK(sgd.weight_decay == 0);
  const DenseOptimizerOptions adamw = OptimizerOf("{type: adamw}");
  CHECK(adamw.learning_rate == 1e-3);
  CHECK(adamw.weight_decay == 0.01);
  CHECK(adamw.epsilon == 1e-8);
  CHECK_FALSE(adamw.amsgrad);
  const DenseOptimizerOptions adagrad = OptimizerOf("{type: adagrad, lr_decay: 0.001}");
  CHECK(adagrad.learning_rate == 0.01);
  CHECK(adagrad.epsilon == 1e-10);
  CHECK(adagrad.lr_decay == 0.001);
  CHECK(adagrad.initial_accumulator_value == 0);
  const DenseOptimizerOptions rmsprop = OptimizerOf("{type: rmsprop, centered: true}");
  CHECK(rmsprop.learning_rate == 0.01);
  CHECK(rmsprop.alpha == 0.99);
  CHECK(rmsprop.epsilon == 1e-8);
  CHECK(rmsprop.centered);
  CHECK(OptimizerOf("{type: adam, amsgrad: true, weight_decay: 0.1}").amsgrad);
}

TEST_CASE("optimizer settings torch would refuse are refused, naming the key") {
  CHECK(OptimizerErrorOf("{type: sgd}") ==
        "job.yaml:3: training.optimizer.type: sgd has no default learning rate "
        "(torch.optim.SGD requires lr): set learning_rate");
  CHECK(OptimizerErrorOf("{type: adam, momentum: 0.9}") ==
        "job.yaml:3: training.optimizer.momentum: is not a setting of adam (it is one of sgd, "
        "rmsprop)");
  CHECK(OptimizerErrorOf("{type: sgd, learning_rate: 0.1, nesterov: true}") ==
        "job.yaml:3: training.optimizer.nesterov: needs momentum > 0 and dampening 0 (as "
        "torch.optim.SGD)");
  CHECK(OptimizerErrorOf("{type: sgd, learning_rate: -0.1}")
            .find("training.optimizer.learning_rate: must be a positive number") !=
        std::string::npos);
  CHECK(OptimizerErrorOf("{type: adamw, weight_decay: -1}")
            .find("training.optimizer.weight_decay: must be >= 0") != std::string::npos);
  CHECK(OptimizerErrorOf("{type: rmsprop, alpha: 1}")
            .find("training.optimizer.alpha: must be in [0, 1)") != std::string::npos);
  CHECK(OptimizerErrorOf("{type: adagrad, initial_accumulator_value: -0.5}")
            .find("initial_accumulator_value: must be >= 0") != std::string::npos);
  CHECK(OptimizerErrorOf("{type: adagrad, lr: 0.1}").find("training.optimizer.lr: unknown key") !=
        std::string::npos);
  CHECK(OptimizerErrorOf("{type: adam, epsilon: .nan}")
            .find("training.optimizer.epsilon: must be a finite number") != std::string::npos);
}

TEST_CASE("training.optimizer.clip_grad_norm: none by default, the whole model's, and > 0") {
  CHECK(OptimizerOf("{type: adam}").clip_grad_norm == 0);
  CHECK(OptimizerOf("{type: adamw, clip_grad_norm: 1.5}").clip_grad_norm == 1.5);
  for (const char* bad : {"0", "-1", ".inf", ".nan"}) {
    INFO(bad);
    CHECK(OptimizerErrorOf(std::string("{type: adam, clip_grad_norm: ") + bad + "}")
              .find("job.yaml:3: training.optimizer.clip_grad_norm: must be a finite number > 0 "
                    "(leave it out for no clipping), got ") == 0);
  }
  CHECK(OptimizerErrorOf("{type: sgd, learning_rate: 0.1, groups: [{params: ['*.bias'], "
                         "clip_grad_norm: 1.0}]}")
            .find("training.optimizer.groups[0].clip_grad_norm: is the whole model's (torch's "
                  "clip_grad_norm_ takes every parameter's gradient), not a group's") !=
        std::string::npos);
  absl::StatusOr<ClusterSpec> ctr = ParseClusterSpec(
      "cluster: {scheduler: 'h:1'}\nmodel: {type: ctr}\ndata: {train: t, test: v}\ntraining:\n"
      "  optimizer: {type: adam, clip_grad_norm: 1.0}\n",
      "job.yaml");
  REQUIRE_FALSE(ctr.ok());
  CHECK(std::string(ctr.status().message())
            .find("training.optimizer.clip_grad_norm: is not offered for a ctr model") !=
        std::string::npos);
}

}  // namespace
}  // namespace paramserver
