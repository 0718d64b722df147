// The embedding optimizers (ps/sparse_optimizer) against PyTorch's own on the same sparse
// gradients (tests/sparse_optimizer_reference.py, Debian's python3-torch): SparseAdam,
// Adagrad and SGD over 12 steps in which each row appears in some steps and not others
// (one row never), so the step count, the untouched rows and the moments' decay are all
// exercised.
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "catch2/catch.hpp"
#include "common/testing/local_cluster.h"
#include "common/testing/temp_dir.h"
#include "ps/sparse_optimizer.h"

namespace paramserver {
namespace {

constexpr int kRows = 6;
constexpr int kDim = 4;
constexpr int kSteps = 12;

std::string Hex(float value) { return absl::StrFormat("%a", static_cast<double>(value)); }

struct Case {
  std::vector<float> table;
  std::vector<std::vector<std::pair<int, std::vector<float>>>> steps;  // per step: rows
};

Case MakeCase(uint32_t seed) {
  std::mt19937 random(seed);
  std::normal_distribution<float> normal(0, 1);
  Case c;
  for (int i = 0; i < kRows * kDim; ++i) c.table.push_back(normal(random));
  for (int step = 0; step < kSteps; ++step) {
    std::vector<std::pair<int, std::vector<float>>> rows;
    // Rows 0..4 appear at random; row 5 never; step 6 has no row at all.
    for (int row = 0; row < kRows - 1 && step != 6; ++row) {
      if (random() % 3 == 0) continue;
      std::vector<float> gradient;
      for (int i = 0; i < kDim; ++i) gradient.push_back(normal(random) * 0.5f);
      rows.emplace_back(row, std::move(gradient));
    }
    c.steps.push_back(std::move(rows));
  }
  return c;
}

std::vector<float> RunOurs(const EmbeddingOptimizerOptions& options, const Case& c) {
  std::vector<float> table = c.table;
  const int state_floats = StateFloatsPerRow(options.type, kDim);
  std::vector<float> state(kRows * state_floats, 0.0f);
  for (int row = 0; row < kRows; ++row) {
    InitializeRowState(options, kDim,
                       absl::MakeSpan(state.data() + row * state_floats, state_floats));
  }
  for (int step = 0; step < kSteps; ++step) {
    for (const auto& [row, gradient] : c.steps[step]) {
      ApplyRowUpdate(options, step + 1, gradient, absl::MakeSpan(table.data() + row * kDim, kDim),
                     absl::MakeSpan(state.data() + row * state_floats, state_floats));
    }
  }
  return table;
}

std::vector<float> RunTorch(const TempDir& dir, const std::string& kind,
                            const EmbeddingOptimizerOptions& options, const Case& c) {
  std::string text = absl::StrCat(
      kind, " ", options.learning_rate, " ", options.beta1, " ", options.beta2, " ",
      options.epsilon, " ", kRows, " ", kDim, " ", kSteps, " ", options.initial_accumulator_value,
      " ", options.learning_rate_power, " ", options.l1, " ", options.l2, " ", options.beta, "\n");
  for (int row = 0; row < kRows; ++row) {
    for (int i = 0; i < kDim; ++i) absl::StrAppend(&text, Hex(c.table[row * kDim + i]), " ");
    absl::StrAppend(&text, "\n");
  }
  for (const auto& rows : c.steps) {
    absl::StrAppend(&text, rows.size(), "\n");
    for (const auto& [row, gradient] : rows) {
      absl::StrAppend(&text, row);
      for (float g : gradient) absl::StrAppend(&text, " ", Hex(g));
      absl::StrAppend(&text, "\n");
    }
  }
  const std::string input = dir.WriteFile(kind + ".case", text);
  const std::string output = dir.File(kind + ".out");
  const std::string command =
      absl::StrCat("/usr/bin/python3 '",
                   RunfilePath(kind == "rowwise_adagrad" || kind == "ftrl"
                                   ? "tests/row_optimizer_reference.py"
                                   : "tests/sparse_optimizer_reference.py"),
                   "' '", input, "' > '", output, "' 2> '", output, ".err'");
  REQUIRE(std::system(command.c_str()) == 0);
  std::vector<float> table;
  FILE* file = std::fopen(output.c_str(), "r");
  REQUIRE(file != nullptr);
  char word[64];
  while (std::fscanf(file, "%63s", word) == 1) table.push_back(std::strtof(word, nullptr));
  std::fclose(file);
  return table;
}

void CheckAgreement(const std::string& kind, const EmbeddingOptimizerOptions& options) {
  TempDir dir;
  const Case c = MakeCase(7);
  const std::vector<float> ours = RunOurs(options, c);
  const std::vector<float> torch = RunTorch(dir, kind, options, c);
  REQUIRE(torch.size() == ours.size());
  // Every operation is the same float32 operation in the same order; torch's vectorised
  // kernels may fuse a multiply-add (FMA) where we round twice, a difference of at most
  // an ulp of each step's update, so a few ulps of the values after 12 steps.
  for (size_t i = 0; i < ours.size(); ++i) {
    INFO(kind << " element " << i << ": ours " << ours[i] << ", torch " << torch[i]);
    CHECK(std::abs(ours[i] - torch[i]) <=
          8 * std::numeric_limits<float>::epsilon() * std::max(1.0f, std::abs(torch[i])));
  }
  // The row no step touched is exactly as it was, in both.
  for (int i = 0; i < kDim; ++i) {
    CHECK(ours[(kRows - 1) * kDim + i] == c.table[(kRows - 1) * kDim + i]);
    CHECK(torch[(kRows - 1) * kDim + i] == c.table[(kRows - 1) * kDim + i]);
  }
  // And the others moved (the test tests something).
  CHECK(ours[0] != c.table[0]);
}

TEST_CASE("SparseAdam: ours equals torch.optim.SparseAdam, row by row") {
  EmbeddingOptimizerOptions options;
  options.type = EmbeddingOptimizerType::kAdam;
  options.learning_rate = 0.01;
  options.epsilon = 1e-7;
  CheckAgreement("adam", options);
}

TEST_CASE("Adagrad on a sparse gradient: ours equals torch.optim.Adagrad") {
  EmbeddingOptimizerOptions options;
  options.type = EmbeddingOptimizerType::kAdagrad;
  options.learning_rate = 0.05;
  options.epsilon = 1e-10;
  CheckAgreement("adagrad", options);
}

TEST_CASE("SGD on a sparse gradient: ours equals torch.optim.SGD") {
  EmbeddingOptimizerOptions options;
  options.type = EmbeddingOptimizerType::kSgd;
  options.learning_rate = 0.1;
  CheckAgreement("sgd", options);
}

TEST_CASE("row-wise Adagrad: ours equals the published rule (FBGEMM's), row by row") {
  EmbeddingOptimizerOptions options;
  options.type = EmbeddingOptimizerType::kRowwiseAdagrad;
  options.learning_rate = 0.05;
  options.epsilon = 1e-8;
  options.initial_accumulator_value = 0.01;
  CheckAgreement("rowwise_adagrad", options);
}

TEST_CASE("FTRL-Proximal: ours equals the published rule (TensorFlow's ApplyFtrl)") {
  EmbeddingOptimizerOptions options;
  options.type = EmbeddingOptimizerType::kFtrl;
  options.learning_rate = 0.1;
  options.initial_accumulator_value = 0.1;
  options.l1 = 0.05;  // some elements' |z| stays below it: those are exactly 0
  options.l2 = 0.01;
  options.beta = 0.5;
  CheckAgreement("ftrl", options);
  options.learning_rate_power = -0.3;  // not the square root: powf itself
  options.l1 = 0;
  CheckAgreement("ftrl", options);
}

TEST_CASE("each optimizer keeps its own amount of state") {
  CHECK(StateFloatsPerRow(EmbeddingOptimizerType::kAdagrad, kDim) == kDim);
  CHECK(StateFloatsPerRow(EmbeddingOptimizerType::kAdam, kDim) == 2 * kDim);
  CHECK(StateFloatsPerRow(EmbeddingOptimizerType::kSgd, kDim) == 0);
  CHECK(StateFloatsPerRow(EmbeddingOptimizerType::kRowwiseAdagrad, kDim) == 1);
  CHECK(StateFloatsPerRow(EmbeddingOptimizerType::kFtrl, kDim) == 2 * kDim);
}

}  // namespace
}  // namespace paramserver
