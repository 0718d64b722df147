// The CTR model trained in one process from our parts, against PyTorch training the same
// model (tests/ctr_pytorch_reference.py: one nn.EmbeddingBag(mode='sum', sparse=True) per
// field, nn.Linear layers, BCEWithLogitsLoss, SparseAdam for the tables and Adam for the
// MLP) on the same batches from the same weights. Ours: worker/ctr_model's step, the
// tables in ps/embedding_table (rows made at first pull, SparseAdam per row) and the MLP
// in ps/adam_optimizer. The cluster-level agreement (servers, workers, shards) builds on
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
#include "ps/adam_optimizer.h"
#include "ps/embedding_table.h"
#include "worker/ctr_model.h"

namespace paramserver {
namespace {

constexpr int kBatch = 16;
constexpr int kBatches = 8;

std::string Hex(double value) { return absl::StrFormat("%a", value); }

TEST_CASE("the CTR model trains as PyTorch trains it: MLP and every row within 1e-5") {
  TempDir dir;
  CtrModelShape shape;
  shape.dense_features = 3;
  shape.categorical_features = 4;
  shape.embedding_dim = 4;
  shape.layers = {3 + 4 * 4, 8, 1};
  REQUIRE(ValidateCtrModelShape(shape).ok());
  const int fields = shape.categorical_features, dim = shape.embedding_dim;
  const int64_t examples = kBatch * kBatches;

  // Data: small vocabularies (ids repeat within a batch), 10% missing ids.
  std::mt19937 random(11);
  std::uniform_real_distribution<float> uniform(0, 1);
  std::vector<float> dense, labels;
  std::vector<int64_t> ids;
  for (int64_t n = 0; n < examples; ++n) {
    for (int j = 0; j < shape.dense_features; ++j) dense.push_back(3 * uniform(random));
    for (int k = 0; k < fields; ++k) {
      ids.push_back(uniform(random) < 0.1f ? -1
                                           : static_cast<int64_t>(random() % 9) * 1000003 + k * 7);
    }
    labels.push_back(uniform(random) < 0.3f ? 1.0f : 0.0f);
  }
  const MlpLayout layout(shape.layers);
  std::vector<float> mlp = InitializeMlpParameters(layout, 3);
  const std::vector<float> initial_mlp = mlp;
  AdamOptions adam;
  adam.learning_rate = 0.01;
  EmbeddingTableOptions table_options;
  table_options.dim = dim;
  table_options.optimizer.type = EmbeddingOptimizerType::kAdam;
  table_options.optimizer.learning_rate = 0.05;
  table_options.optimizer.beta1 = adam.beta1;
  table_options.optimizer.beta2 = adam.beta2;
  table_options.optimizer.epsilon = 1e-8;
  std::vector<EmbeddingTable> tables;
  std::vector<std::vector<int64_t>> table_ids(fields);
  std::vector<std::vector<float>> initial_rows(fields);
  for (int k = 0; k < fields; ++k) {
    table_options.table_index = k;
    tables.emplace_back(table_options);
    for (int64_t n = 0; n < examples; ++n) {
      if (ids[n * fields + k] >= 0) table_ids[k].push_back(ids[n * fields + k]);
    }
    std::sort(table_ids[k].begin(), table_ids[k].end());
    table_ids[k].erase(std::unique(table_ids[k].begin(), table_ids[k].end()), table_ids[k].end());
    initial_rows[k].resize(table_ids[k].size() * dim);
    std::vector<bool> present;
    tables[k].Pull(table_ids[k], absl::MakeSpan(initial_rows[k]), &present);
  }

  // Ours: the sync step's parts, batch after batch.
  AdamOptimizer dense_optimizer(adam, layout.total_parameters());
  for (int b = 0; b < kBatches; ++b) {
    const CtrBatchView batch{kBatch, dense.data() + b * kBatch * shape.dense_features,
                             ids.data() + b * kBatch * fields, labels.data() + b * kBatch};
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

  // PyTorch's, from the same start.
  std::string text = absl::StrCat(shape.dense_features, " ", fields, " ", dim, " ", kBatch, " ",
                                  kBatches, " ", shape.layers.size());
  for (int64_t width : shape.layers) absl::StrAppend(&text, " ", width);
  for (double v : {adam.learning_rate, adam.beta1, adam.beta2, adam.epsilon,
                   table_options.optimizer.learning_rate, table_options.optimizer.epsilon}) {
    absl::StrAppend(&text, " ", Hex(v));
  }
  for (float v : dense) absl::StrAppend(&text, " ", Hex(v));
  for (int64_t id : ids) absl::StrAppend(&text, " ", id);
  for (float v : labels) absl::StrAppend(&text, " ", Hex(v));
  for (float v : initial_mlp) absl::StrAppend(&text, " ", Hex(v));
  for (int k = 0; k < fields; ++k) {
    absl::StrAppend(&text, " ", table_ids[k].size());
    for (int64_t id : table_ids[k]) absl::StrAppend(&text, " ", id);
    for (float v : initial_rows[k]) absl::StrAppend(&text, " ", Hex(v));
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
