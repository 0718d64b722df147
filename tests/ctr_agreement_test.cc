// The CTR model trained in one process from our parts, against PyTorch training the same
// model (tests/ctr_pytorch_reference.py: one nn.EmbeddingBag(mode='sum', sparse=True) per
// field, nn.Linear layers, BCEWithLogitsLoss, SparseAdam for the tables and Adam for the
// MLP) on the same batches from the same weights. Ours: worker/ctr_model's step, the
// tables in ps/embedding_table (rows made at first pull, SparseAdam per row) and the MLP
// in ps/dense_optimizer. The cluster-level agreement (servers, workers, shards) builds on
// these parts.
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "catch2/catch.hpp"
#include "common/model/mlp_parameters.h"
#include "common/testing/local_cluster.h"
#include "common/testing/temp_dir.h"
#include "ps/dense_optimizer.h"
#include "ps/embedding_table.h"
#include "worker/ctr_model.h"

namespace paramserver {
namespace {

constexpr int kBatch = 16;
constexpr int kBatches = 8;

std::string Hex(double value) { return absl::StrFormat("%a", value); }

// The examples, one after another: their dense features, one id per field (-1: missing),
// and their labels.
struct Examples {
  std::vector<float> dense, labels;
  std::vector<int64_t> ids;
};

// Makes kBatch * kBatches seeded examples for `shape`.
Examples MakeExamples(const CtrModelShape& shape) {
  const int fields = shape.categorical_features;
  const int64_t examples = kBatch * kBatches;
  // Data: small vocabularies (ids repeat within a batch), 10% missing ids.
  std::mt19937 random(11);
  std::uniform_real_distribution<float> uniform(0, 1);
  Examples data;
  for (int64_t n = 0; n < examples; ++n) {
    for (int j = 0; j < shape.dense_features; ++j) data.dense.push_back(3 * uniform(random));
    for (int k = 0; k < fields; ++k) {
      data.ids.push_back(
          uniform(random) < 0.1f ? -1 : static_cast<int64_t>(random() % 9) * 1000003 + k * 7);
    }
    data.labels.push_back(uniform(random) < 0.3f ? 1.0f : 0.0f);
  }
  return data;
}

// One embedding table per field, each table's ids in the data (sorted, no repeats) and
// the rows those ids start from.
struct Tables {
  std::vector<EmbeddingTable> tables;
  std::vector<std::vector<int64_t>> table_ids;
  std::vector<std::vector<float>> initial_rows;
};

// Makes the `fields` tables with `table_options` and reads the initial rows of the ids.
Tables MakeTables(EmbeddingTableOptions table_options, int fields,
                  const std::vector<int64_t>& ids) {
  const int64_t examples = kBatch * kBatches;
  const int dim = table_options.dim;
  Tables made;
  made.table_ids.resize(fields);
  made.initial_rows.resize(fields);
  for (int k = 0; k < fields; ++k) {
    table_options.table_index = k;
    made.tables.emplace_back(table_options);
    std::vector<int64_t>& table_ids = made.table_ids[k];
    for (int64_t n = 0; n < examples; ++n) {
      if (ids[n * fields + k] >= 0) table_ids.push_back(ids[n * fields + k]);
    }
    std::sort(table_ids.begin(), table_ids.end());
    table_ids.erase(std::unique(table_ids.begin(), table_ids.end()), table_ids.end());
    made.initial_rows[k].resize(table_ids.size() * dim);
    std::vector<bool> present;
    made.tables[k].Pull(table_ids, absl::MakeSpan(made.initial_rows[k]), &present);
  }
  return made;
}

// Ours: trains `mlp` and `tables` on `data` with the sync step's parts, batch after
// batch; returns the trained MLP, then every table's rows of `table_ids`.
std::vector<float> TrainOurs(const CtrModelShape& shape, const MlpLayout& layout,
                             const DenseOptimizerOptions& adam, const Examples& data,
                             std::vector<float> mlp, std::vector<EmbeddingTable>& tables,
                             const std::vector<std::vector<int64_t>>& table_ids) {
  const int fields = shape.categorical_features, dim = shape.embedding_dim;
  DenseOptimizer dense_optimizer(adam, layout.total_parameters());
  for (int b = 0; b < kBatches; ++b) {
    const CtrBatchView batch{kBatch, data.dense.data() + b * kBatch * shape.dense_features,
                             data.ids.data() + b * kBatch * fields,
                             data.labels.data() + b * kBatch};
    const BatchRows batch_rows = DeduplicateIds(shape, batch);
    std::vector<std::vector<float>> rows(fields);
    for (int k = 0; k < fields; ++k) {
      rows[k].resize(batch_rows.unique_ids[k].size() * dim);
      std::vector<bool> present;
      tables[k].Pull(batch_rows.unique_ids[k], absl::MakeSpan(rows[k]), &present);
    }
    const CtrStepResult step = CtrForwardBackward(shape, mlp, batch, batch_rows, rows, true);
    dense_optimizer.Apply(step.dense_gradient, absl::MakeSpan(mlp));
    for (int k = 0; k < fields; ++k) {
      REQUIRE(tables[k].Apply(b + 1, batch_rows.unique_ids[k], step.row_gradients[k]).ok());
    }
  }
  std::vector<float> ours = mlp;
  for (int k = 0; k < fields; ++k) {
    std::vector<float> rows(table_ids[k].size() * dim);
    std::vector<bool> present;
    tables[k].Pull(table_ids[k], absl::MakeSpan(rows), &present);
    ours.insert(ours.end(), rows.begin(), rows.end());
  }
  return ours;
}

// PyTorch's, from the same start: writes the case for tests/ctr_pytorch_reference.py,
// runs it and returns what it prints (the MLP, then every table's rows).
std::vector<float> TrainWithPyTorch(const TempDir& dir, const CtrModelShape& shape,
                                    const DenseOptimizerOptions& adam,
                                    const EmbeddingTableOptions& table_options,
                                    const Examples& data, const std::vector<float>& initial_mlp,
                                    const Tables& start) {
  const int fields = shape.categorical_features, dim = shape.embedding_dim;
  std::string text = absl::StrCat(shape.dense_features, " ", fields, " ", dim, " ", kBatch, " ",
                                  kBatches, " ", shape.layers.size());
  for (int64_t width : shape.layers) absl::StrAppend(&text, " ", width);
  for (double v : {adam.learning_rate, adam.beta1, adam.beta2, adam.epsilon,
                   table_options.optimizer.learning_rate, table_options.optimizer.epsilon}) {
    absl::StrAppend(&text, " ", Hex(v));
  }
  for (float v : data.dense) absl::StrAppend(&text, " ", Hex(v));
  for (int64_t id : data.ids) absl::StrAppend(&text, " ", id);
  for (float v : data.labels) absl::StrAppend(&text, " ", Hex(v));
  for (float v : initial_mlp) absl::StrAppend(&text, " ", Hex(v));
  for (int k = 0; k < fields; ++k) {
    absl::StrAppend(&text, " ", start.table_ids[k].size());
    for (int64_t id : start.table_ids[k]) absl::StrAppend(&text, " ", id);
    for (float v : start.initial_rows[k]) absl::StrAppend(&text, " ", Hex(v));
  }
  const std::string input = dir.WriteFile("case.txt", text + "\n");
  const std::string output = dir.File("torch.txt");
  REQUIRE(
      std::system(absl::StrCat("/usr/bin/python3 '", RunfilePath("tests/ctr_pytorch_reference.py"),
                               "' '", input, "' > '", output, "'")
                      .c_str()) == 0);
  std::vector<float> torch;
  FILE* file = std::fopen(output.c_str(), "r");
  REQUIRE(file != nullptr);
  char word[64];
  while (std::fscanf(file, "%63s", word) == 1) torch.push_back(std::strtof(word, nullptr));
  std::fclose(file);
  return torch;
}

TEST_CASE("the CTR model trains as PyTorch trains it: MLP and every row within 1e-5") {
  TempDir dir;
  CtrModelShape shape;
  shape.dense_features = 3;
  shape.categorical_features = 4;
  shape.embedding_dim = 4;
  shape.layers = {3 + 4 * 4, 8, 1};
  REQUIRE(ValidateCtrModelShape(shape).ok());
  const int fields = shape.categorical_features, dim = shape.embedding_dim;

  const Examples data = MakeExamples(shape);
  const MlpLayout layout(shape.layers);
  const std::vector<float> initial_mlp = InitializeMlpParameters(layout, 3);
  DenseOptimizerOptions adam;
  adam.learning_rate = 0.01;
  EmbeddingTableOptions table_options;
  table_options.dim = dim;
  table_options.optimizer.type = EmbeddingOptimizerType::kAdam;
  table_options.optimizer.learning_rate = 0.05;
  table_options.optimizer.beta1 = adam.beta1;
  table_options.optimizer.beta2 = adam.beta2;
  table_options.optimizer.epsilon = 1e-8;
  Tables start = MakeTables(table_options, fields, data.ids);
  const std::vector<std::vector<float>>& initial_rows = start.initial_rows;

  const std::vector<float> ours =
      TrainOurs(shape, layout, adam, data, initial_mlp, start.tables, start.table_ids);
  const std::vector<float> torch =
      TrainWithPyTorch(dir, shape, adam, table_options, data, initial_mlp, start);
  REQUIRE(torch.size() == ours.size());
  double largest = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    largest = std::max(largest, static_cast<double>(std::abs(ours[i] - torch[i])));
  }
  INFO("largest difference " << largest);
  CHECK(largest <= 1e-5);
  // And training moved things: the MLP and the rows are not where they started.
  CHECK(ours[0] != initial_mlp[0]);
  CHECK(ours[layout.total_parameters()] != initial_rows[0][0]);
}

}  // namespace
}  // namespace paramserver
