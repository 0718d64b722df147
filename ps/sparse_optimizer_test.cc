#include "ps/sparse_optimizer.h"

#include <cfloat>
#include <cmath>
#include <vector>

#include "catch2/catch.hpp"
#include "ps/embedding_table.h"

namespace paramserver {
namespace {

// sqrt(FLT_MAX) = 1.8446744e19; the accepted limit is FLT_MAX * (1 - 2^-10) = 3.39950e38.
// 3.5e19^2 = 1.225e39 and 1e20^2 = 1e40 overflow float32; 1.8e19^2 = 3.24e38 does not.

RowUpdate UpdateOf(EmbeddingOptimizerType type, double learning_rate = 0.01) {
  EmbeddingOptimizerOptions options;
  options.type = type;
  options.learning_rate = learning_rate;
  return PrepareRowUpdate(options, /*step=*/1);
}

TEST_CASE("adam and adagrad rows refuse a gradient whose square overflows float32") {
  for (EmbeddingOptimizerType type :
       {EmbeddingOptimizerType::kAdam, EmbeddingOptimizerType::kAdagrad}) {
    const RowUpdate update = UpdateOf(type);
    const int state_floats = StateFloatsPerRow(type, 3);
    std::vector<float> row = {0.5f, -0.5f, 0.25f};
    std::vector<float> state(state_floats, 0.0f);
    CHECK(FirstUnsafeElement(update, std::vector<float>{1, 1e20f, 1}, row, state) == 1);
    CHECK(FirstUnsafeElement(update, std::vector<float>{1, 1, -3.5e19f}, row, state) == 2);
    CHECK(FirstUnsafeElement(update, std::vector<float>{3.5e19f, 1e20f, 1}, row, state) == 0);
    const std::vector<float> large = {1.8e19f, -1.8e19f, 1};
    REQUIRE(FirstUnsafeElement(update, large, row, state) == 3);
    ApplyRowUpdate(update, large, absl::MakeSpan(row), absl::MakeSpan(state));
    for (float x : state) CHECK(std::isfinite(x));
    for (float x : row) CHECK(std::isfinite(x));
    if (type == EmbeddingOptimizerType::kAdagrad) {
      CHECK(state[0] == 1.8e19f * 1.8e19f);  // the sum of squares: 3.24e38
    } else {
      CHECK(state[0] == Approx(1.8e18));   // SparseAdam's m = 0.1 * g
      CHECK(state[3] == Approx(3.24e35));  // v = 0.001 * g^2
    }
  }
}

TEST_CASE("adagrad's sum of squares must stay in range against its present value") {
  // From a sum of 3.0e38: g = 1.8e19 (g^2 = 3.24e38, accepted alone) makes 6.24e38, +Inf
  // in float32; g = 6e18 makes 3.36e38 and g = 6.3e18 makes 3.3969e38, both below the
  // limit 3.39950e38; g = 6.4e18 makes 3.4096e38, past FLT_MAX: +Inf.
  const RowUpdate update = UpdateOf(EmbeddingOptimizerType::kAdagrad);
  const std::vector<float> row = {0, 0, 0, 0};
  const std::vector<float> sum = {3.0e38f, 3.0e38f, 3.0e38f, 3.0e38f};
  CHECK(FirstUnsafeElement(update, std::vector<float>{1, 6.3e18f, 1.8e19f, 0}, row, sum) == 2);
  CHECK(FirstUnsafeElement(update, std::vector<float>{6e18f, 6.3e18f, 6.4e18f, 0}, row, sum) == 2);
  CHECK(FirstUnsafeElement(update, std::vector<float>{6e18f, -6.3e18f, 1, 0}, row, sum) == 4);
  // The same gradient a fresh row (sum 0) takes.
  CHECK(FirstUnsafeElement(update, std::vector<float>{1, 6.3e18f, 1.8e19f, 0}, row,
                           std::vector<float>(4, 0.0f)) == 4);
}

TEST_CASE("sgd squares nothing but refuses a step that would make the parameter Inf") {
  // lr 0.01: even FLT_MAX moves a row by 3.4e36, in range; lr 10: 1e38 moves it by 1e39.
  const std::vector<float> row = {1, 1};
  CHECK(FirstUnsafeElement(UpdateOf(EmbeddingOptimizerType::kSgd),
                           std::vector<float>{1e20f, FLT_MAX}, row, {}) == 2);
  CHECK(FirstUnsafeElement(UpdateOf(EmbeddingOptimizerType::kSgd, 10.0),
                           std::vector<float>{1e20f, 1e38f}, row, {}) == 1);
}

TEST_CASE("a table checks the rows it holds and the rows it would make") {
  EmbeddingTableOptions options;
  options.dim = 2;
  options.optimizer.type = EmbeddingOptimizerType::kAdagrad;
  EmbeddingTable table(options);
  // Row 5 gets a sum of squares of 3.24e38 in element 1 (1.8e19 accepted).
  REQUIRE(table.FirstUnsafeElement(1, std::vector<int64_t>{5}, std::vector<float>{0, 1.8e19f}) ==
          2);
  REQUIRE(table.Apply(1, std::vector<int64_t>{5}, std::vector<float>{0, 1.8e19f}).ok());
  // On row 5's element 1, 1e18 more (1e36) makes 3.25e38, in range; 6e18 (3.6e37) makes
  // 3.6e38, past FLT_MAX. Row 7 is new: its sum starts at 0, and 1.8e19 is accepted.
  const std::vector<int64_t> ids = {5, 7};
  CHECK(table.FirstUnsafeElement(2, ids, std::vector<float>{1, 1e18f, 1.8e19f, 1}) == 4);
  CHECK(table.FirstUnsafeElement(2, ids, std::vector<float>{1, 6e18f, 1, 1}) == 1);
  CHECK(table.FirstUnsafeElement(2, ids, std::vector<float>{1, 1, 1, 3.5e19f}) == 3);
  CHECK(table.rows() == 1);  // nothing made by the checks
}

}  // namespace
}  // namespace paramserver
