// The CTR job on a real cluster against PyTorch: from the same init_from, sync training
// for K steps (1 server x 1 worker, and 2 x 2 with 3 embedding shards; shuffle off) ends
// with the weights one PyTorch process reaches training on all the workers' batches
// together (tests/ctr_cluster_reference.py), every table row included, within 1e-5;
// for SparseAdam, for Adagrad, and for tables of their own dims and optimizers
// (model.tables, row-wise Adagrad among them). And a table the model lacks in init_from, or ids of
// the wrong dtype, stop the job at start with an error naming it.
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "catch2/catch.hpp"
#include "common/checkpoint/safetensors.h"
#include "common/model/embedding_init.h"
#include "common/testing/local_cluster.h"
#include "common/testing/temp_dir.h"
#include "tools/ctr_data.h"

namespace paramserver {
namespace {

constexpr int kDense = 3, kFields = 4, kDim = 4, kBatch = 16, kSteps = 12;

struct Case {
  std::string optimizer;  // adam | adagrad
  int servers = 1;
  int workers = 1;
  int embedding_shards = 1;
  // Tables of their own (model.tables): every table's dim and optimizer, or none.
  std::vector<int> table_dims;
  std::vector<std::string> table_optimizers;
};

// model.tables for `c`: each table whose dim or optimizer is not the job's.
std::string TablesYaml(const Case& c) {
  if (c.table_dims.empty()) return "";
  std::string yaml = "  tables:\n";
  for (size_t t = 0; t < c.table_dims.size(); ++t) {
    std::string settings;
    if (c.table_dims[t] != kDim) absl::StrAppend(&settings, "dim: ", c.table_dims[t]);
    if (c.table_optimizers[t] != c.optimizer) {
      absl::StrAppend(&settings, settings.empty() ? "" : ", ",
                      "optimizer: {type: ", c.table_optimizers[t],
                      ", learning_rate: 0.05, epsilon: 1.0e-7}");
    }
    if (!settings.empty()) absl::StrAppend(&yaml, "    C", t + 1, ": {", settings, "}\n");
  }
  return yaml;
}

// model.layers: the dense features and every table's row, 8, 1.
std::vector<int> Layers(const Case& c) {
  int input = kDense;
  for (int t = 0; t < kFields; ++t) input += c.table_dims.empty() ? kDim : c.table_dims[t];
  return {input, 8, 1};
}

std::string JobYaml(const Case& c, const TempDir& dir) {
  return absl::StrCat(R"(cluster:
  scheduler: 127.0.0.1:0
  servers: )",
                      c.servers, R"(
  workers: )",
                      c.workers, R"(
  shards: 2
  embedding_shards: )",
                      c.embedding_shards, R"(
  heartbeat_interval_ms: 200
  failure_timeout_ms: 2000
model:
  type: ctr
  dense_features: )",
                      kDense, R"(
  categorical_features: )",
                      kFields, R"(
  embedding_dim: )",
                      kDim, R"(
  layers: [)",
                      absl::StrJoin(Layers(c), ", "), R"(]
  init_from: )",
                      dir.File("init.safetensors"), "\n", TablesYaml(c), R"(training:
  mode: sync
  batch_size: )",
                      kBatch, R"(
  max_steps: )",
                      kSteps, R"(
  shuffle: false
  optimizer: {type: adam, learning_rate: 0.01, epsilon: 1.0e-7}
  embedding_optimizer: {type: )",
                      c.optimizer, R"(, learning_rate: 0.05, epsilon: 1.0e-7}
data:
  format: criteo
  train: )",
                      dir.File("train.tsv"), R"(
  test: )",
                      dir.File("test.tsv"), R"(
output:
  weights: )",
                      dir.File("weights.safetensors"), "\n");
}

// Small vocabularies, so that ids repeat within and across the workers' batches.
void WriteData(const TempDir& dir) {
  CtrDataOptions options;
  options.seed = 7;
  options.train_examples = 600;
  options.test_examples = 200;
  options.dense_features = kDense;
  options.categorical_features = kFields;
  options.vocabulary = 40;
  options.missing_rate = 0.1;
  REQUIRE(WriteCtrData(options, dir.File("train.tsv"), dir.File("test.tsv")).ok());
}

void RunPyTorch(const Case& c, const TempDir& dir) {
  std::vector<std::string> argv = {"/usr/bin/python3",
                                   RunfilePath("tests/ctr_cluster_reference.py"),
                                   "--data",
                                   dir.File("train.tsv"),
                                   "--init",
                                   dir.File("init.safetensors"),
                                   "--out",
                                   dir.File("reference.safetensors"),
                                   "--optimizer",
                                   c.optimizer,
                                   "--dense",
                                   std::to_string(kDense),
                                   "--fields",
                                   std::to_string(kFields),
                                   "--dim",
                                   std::to_string(kDim),
                                   "--workers",
                                   std::to_string(c.workers),
                                   "--batch",
                                   std::to_string(kBatch),
                                   "--steps",
                                   std::to_string(kSteps),
                                   "--seed",
                                   "3",
                                   "--lr",
                                   "0.01",
                                   "--table_lr",
                                   "0.05",
                                   "--eps",
                                   "1e-7",
                                   "--table_eps",
                                   "1e-7",
                                   "--layers"};
  for (int width : Layers(c)) argv.push_back(std::to_string(width));
  if (!c.table_dims.empty()) {
    argv.push_back("--table-dims");
    for (int dim : c.table_dims) argv.push_back(std::to_string(dim));
    argv.push_back("--table-optimizers");
    for (const std::string& kind : c.table_optimizers) argv.push_back(kind);
  }
  absl::StatusOr<ChildProcess> python = ChildProcess::Start(argv, dir.File("pytorch.log"));
  REQUIRE(python.ok());
  absl::StatusOr<int> code = python->WaitForExit(absl::Now() + absl::Seconds(120));
  INFO(python->ReadLog());
  REQUIRE(code.ok());
  REQUIRE(*code == 0);
}

std::map<std::string, NamedTensor> ByName(const std::string& path) {
  absl::StatusOr<std::vector<NamedTensor>> tensors = ReadSafetensorsFile(path);
  REQUIRE(tensors.ok());
  std::map<std::string, NamedTensor> by_name;
  for (NamedTensor& t : *tensors) by_name[t.name] = std::move(t);
  return by_name;
}

void CheckAgreement(const Case& c) {
  TempDir dir;
  WriteData(dir);
  RunPyTorch(c, dir);
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(
      dir.WriteFile("job.yaml", JobYaml(c, dir)), dir.path(), c.servers, c.workers);
  REQUIRE(cluster.ok());
  const absl::Status finished = (*cluster)->WaitForAll(absl::Seconds(120));
  INFO(finished.ToString());
  REQUIRE(finished.ok());

  std::map<std::string, NamedTensor> ours = ByName(dir.File("weights.safetensors"));
  std::map<std::string, NamedTensor> theirs = ByName(dir.File("reference.safetensors"));
  std::map<std::string, NamedTensor> initial = ByName(dir.File("init.safetensors"));
  double max_difference = 0, max_movement = 0;
  int64_t rows_compared = 0;
  for (const auto& [name, reference] : theirs) {
    if (reference.dtype == TensorDtype::kI64) {
      INFO(name);
      REQUIRE(ours.count(name) == 1);
      CHECK(ours[name].int_values == reference.int_values);  // every row, once, by id
      rows_compared += static_cast<int64_t>(reference.int_values.size());
      continue;
    }
    INFO(name);
    REQUIRE(ours.count(name) == 1);
    REQUIRE(ours[name].values.size() == reference.values.size());
    for (size_t i = 0; i < reference.values.size(); ++i) {
      max_difference =
          std::max<double>(max_difference, std::fabs(ours[name].values[i] - reference.values[i]));
      max_movement =
          std::max<double>(max_movement, std::fabs(reference.values[i] - initial[name].values[i]));
    }
  }
  WARN(c.optimizer << " " << c.servers << "x" << c.workers << ", " << c.embedding_shards
                   << " embedding shards, " << kSteps << " steps, " << rows_compared
                   << " rows: max |ours - pytorch| = " << max_difference << ", max movement "
                   << max_movement);
  CHECK(rows_compared > 100);
  // The weights moved far more than the tolerance, so agreement is not trivial.
  CHECK(max_movement > 0.05);
  // float32 sums in other orders (the sync mean per row; OpenBLAS's GEMMs against
  // PyTorch's) over 12 steps of lr <= 0.05: a few ulps of values near 1.
  CHECK(max_difference < 1e-5);
}

TEST_CASE("1 server x 1 worker, SparseAdam: the weights and every row equal PyTorch's") {
  CheckAgreement({"adam", 1, 1, 1});
}

TEST_CASE("2 servers x 2 workers, 3 embedding shards, SparseAdam: equal to one PyTorch process") {
  CheckAgreement({"adam", 2, 2, 3});
}

TEST_CASE("2 servers x 2 workers, 3 embedding shards, Adagrad: equal to one PyTorch process") {
  CheckAgreement({"adagrad", 2, 2, 3});
}

TEST_CASE(
    "2 x 2, tables of their own (model.tables): C2 6 wide under row-wise Adagrad, C3 under "
    "Adagrad, the rest SparseAdam: equal to one PyTorch process") {
  CheckAgreement({"adam", 2, 2, 3, {4, 6, 4, 4}, {"adam", "rowwise_adagrad", "adagrad", "adam"}});
}

TEST_CASE("init_from with a table the model lacks, or ids of the wrong dtype, stops the job") {
  TempDir dir;
  WriteData(dir);
  for (const auto& [tensors, error] : std::vector<std::pair<std::vector<NamedTensor>, std::string>>{
           {{{"C9.ids", {1}, {}, TensorDtype::kI64, {5}}, {"C9.weight", {1, kDim}, {1, 2, 3, 4}}},
            "tensor 'C9.ids' is for table C9, which the model lacks (its tables are C1..C4)"},
           {{{"C2.ids", {1}, {5.0f}}, {"C2.weight", {1, kDim}, {1, 2, 3, 4}}},
            "C2.ids must be I64 of shape [n], it is F32 [1]"}}) {
    std::vector<NamedTensor> all = tensors;
    // The MLP's tensors, so that only the table is wrong.
    for (const auto& [name, shape] :
         std::vector<std::pair<std::string, std::vector<int64_t>>>{{"fc1.weight", {8, 19}},
                                                                   {"fc1.bias", {8}},
                                                                   {"fc2.weight", {1, 8}},
                                                                   {"fc2.bias", {1}}}) {
      int64_t size = 1;
      for (int64_t d : shape) size *= d;
      all.push_back({name, shape, std::vector<float>(size, 0.1f)});
    }
    REQUIRE(WriteSafetensorsFile(dir.File("init.safetensors"), all).ok());
    // A server reads init_from before it joins: it stops at once, saying why.
    absl::StatusOr<ChildProcess> server =
        ChildProcess::Start({RunfilePath("ps/ps_server"), "--config",
                             dir.WriteFile("job.yaml", JobYaml({"adam", 1, 1, 1}, dir)),
                             "--scheduler", "127.0.0.1:1", "--listen", "127.0.0.1:0"},
                            dir.File("server.log"));
    REQUIRE(server.ok());
    absl::StatusOr<int> code = server->WaitForExit(absl::Now() + absl::Seconds(30));
    const std::string log = server->ReadLog();
    INFO(log);
    REQUIRE(code.ok());
    CHECK(*code != 0);
    CHECK(log.find(error) != std::string::npos);
  }
}

}  // namespace
}  // namespace paramserver
