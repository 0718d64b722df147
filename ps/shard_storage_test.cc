// The two storages behind ShardStorage, without a shard: shapes, updates checked against
// hand-computed ones, copy on write, the sync mean and what a checkpoint holds.
#include <cmath>
#include <cstring>
#include <memory>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "common/checkpoint/embedding_checkpoint.h"
#include "common/wire/shard_layout.h"
#include "ps/dense_storage.h"
#include "ps/embedding_storage.h"

namespace paramserver {
namespace {

std::vector<float> Decoded(const std::string& bytes) {
  std::vector<float> values(bytes.size() / sizeof(float));
  std::memcpy(values.data(), bytes.data(), bytes.size());
  return values;
}

DenseStorage Dense(std::vector<float> values, double learning_rate = 0.1) {
  DenseOptimizerOptions adam;
  adam.learning_rate = learning_rate;
  const int64_t size = values.size();
  return DenseStorage(3, ParameterRange{10, 10 + size}, std::move(values),
                      MakeDenseUpdateRule(adam, size));
}

TEST_CASE("dense storage refuses a gradient of another size, and ids") {
  DenseStorage storage = Dense({1, 2, 3});
  CHECK(storage.CheckGradientShape(CheckedRowIds(), std::vector<float>{1, 2, 3}).ok());
  absl::Status wrong = storage.CheckGradientShape(CheckedRowIds(), std::vector<float>{1, 2});
  CHECK(wrong.message() == "shard 3 has 3 parameters; the gradient has 2");
  EmbeddingShardShape shape{{1}, 0, 1};
  CheckedRowIds ids = CheckedRowIds::Check(RowIds{{1}, {5}}, shape).value();
  CHECK(absl::StrContains(storage.CheckGradientShape(ids, std::vector<float>{1, 2, 3}).message(),
                          "holds dense parameters"));
}

TEST_CASE("dense storage applies Adam's first step as the formula gives it") {
  // Step 1: m = (1-b1) g, v = (1-b2) g^2, so m / (1-b1) = g and sqrt(v / (1-b2)) = |g|:
  // p -= lr * g / (|g| + eps), which is lr * sign(g) to within eps / |g|.
  DenseStorage storage = Dense({1, 2, 3}, 0.1);
  const std::vector<float> gradient = {0.5f, -2.0f, 4.0f};
  REQUIRE(storage.Apply(1, {}, {}, gradient).ok());
  const std::vector<float> expected = {0.9f, 2.1f, 2.9f};
  for (size_t i = 0; i < expected.size(); ++i) {
    // float32 rounding of a handful of operations on values near 1, plus eps / |g|.
    CHECK(std::fabs(storage.values()[i] - expected[i]) < 1e-6f + 1e-6f);
  }
  ShardState state;
  storage.Save(1, RowOrder::kAsStored, &state);
  CHECK(state.step == 1);
  CHECK(state.values == storage.values());
  REQUIRE(state.slots.size() == 2);
  REQUIRE(state.slots[0].size() == 3);
  CHECK(state.slots[0][1] == static_cast<float>(1 - 0.9) * -2.0f);
  CHECK(state.optimizer == "adam(exp_avg,exp_avg_sq)");
}

TEST_CASE("dense storage writes a new version while a pull shares the old one") {
  DenseStorage storage = Dense({1, 2});
  std::shared_ptr<const std::vector<float>> shared = storage.Share();
  REQUIRE(storage.Apply(1, {}, {}, std::vector<float>{1, 1}).ok());
  CHECK(*shared == std::vector<float>{1, 2});  // unchanged for its reader
  CHECK(storage.values() != *shared);
  const float* second = storage.values().data();
  shared.reset();
  REQUIRE(storage.Apply(2, {}, {}, std::vector<float>{1, 1}).ok());
  CHECK(storage.values().data() == second);  // unshared: written in place
}

TEST_CASE("dense storage's mean sums in the order given and divides by the count") {
  DenseStorage storage = Dense({0, 0});
  const std::vector<float> a = {1, 2}, b = {3, 6}, c = {5, 1};
  std::vector<float> mean;
  CheckedRowIds none;
  storage.Mean({&none, &none, &none}, {a, b, c}, &none, &mean);
  CHECK(mean == std::vector<float>{(1.0f + 3 + 5) * (1.0f / 3), (2.0f + 6 + 1) * (1.0f / 3)});
}

TEST_CASE(
    "dense storage's mean of 1 to 4 gradients across its blocks is, element by element, the sum "
    "from zero in the order given times 1 / n") {
  const size_t size = 10'001;  // two whole blocks of the mean's and a part
  DenseStorage storage = Dense(std::vector<float>(size, 0.0f));
  std::vector<std::vector<float>> workers(4, std::vector<float>(size));
  uint32_t state = 12345;
  for (std::vector<float>& g : workers) {
    for (float& x : g) {
      state = state * 1664525u + 1013904223u;
      // Magnitudes apart by 2^20, so that the order of the sum shows in its last bits.
      x = static_cast<float>(static_cast<int32_t>(state >> 8) - (1 << 23)) *
          ((state & 1) ? 1.0f : 1.0f / (1 << 20));
    }
  }
  for (std::vector<float>& g : workers) g[7] = -0.0f;  // a sum of -0s from 0 is +0
  CheckedRowIds none;
  for (size_t n = 1; n <= workers.size(); ++n) {
    INFO(n << " gradient(s)");
    std::vector<const CheckedRowIds*> rows(n, &none);
    std::vector<absl::Span<const float>> gradients(workers.begin(), workers.begin() + n);
    std::vector<float> mean = {42.0f};  // the old contents do not matter
    storage.Mean(rows, gradients, &none, &mean);
    REQUIRE(mean.size() == size);
    size_t differing = 0;
    for (size_t i = 0; i < size; ++i) {
      float sum = 0.0f;
      for (size_t w = 0; w < n; ++w) sum += workers[w][i];
      const float expected = sum * (1.0f / static_cast<float>(n));
      differing += std::memcmp(&expected, &mean[i], sizeof(float)) != 0;
    }
    CHECK(differing == 0);
    CHECK(mean[7] == 0.0f);
    CHECK_FALSE(std::signbit(mean[7]));
  }
}

constexpr int kBucket = 0, kBuckets = 2;

std::shared_ptr<EmbeddingShardOptions> SgdTables() {
  auto options = std::make_shared<EmbeddingShardOptions>();
  options->shape = {{2, 1}, kBucket, kBuckets};
  for (int t = 0; t < 2; ++t) {
    EmbeddingTableOptions table;
    table.dim = options->shape.dims[t];
    table.optimizer.type = EmbeddingOptimizerType::kSgd;
    table.optimizer.learning_rate = 0.5;
    table.table_index = t;
    options->tables.push_back(table);
  }
  return options;
}

// The first `n` ids of `table` on bucket kBucket.
std::vector<int64_t> OurIds(int table, int n) {
  std::vector<int64_t> ids;
  for (int64_t id = 1; static_cast<int>(ids.size()) < n; ++id) {
    if (EmbeddingShardOf(table, id, kBuckets) == kBucket) ids.push_back(id);
  }
  return ids;
}

TEST_CASE("embedding storage applies SGD to the rows named, and only to them") {
  auto options = SgdTables();
  EmbeddingStorage storage(8, options);
  const std::vector<int64_t> t0 = OurIds(0, 2), t1 = OurIds(1, 1);
  const CheckedRowIds rows =
      CheckedRowIds::Check(RowIds{{2, 1}, {t0[0], t0[1], t1[0]}}, options->shape).value();
  std::string before;
  storage.AppendValues(rows.view(), WireDtype::kFloat32, &before);
  const std::vector<float> initial = Decoded(before);
  // A row not made yet reads as its initial value.
  REQUIRE(initial.size() == 5);
  CHECK(initial[0] == InitialEmbeddingValue(1, 0, t0[0], 0));
  CHECK(initial[4] == InitialEmbeddingValue(1, 1, t1[0], 0));
  const std::vector<float> gradient = {1, 2, 3, 4, 5};
  REQUIRE(storage.CheckGradientShape(rows, gradient).ok());
  REQUIRE(storage.Apply(1, rows.view(), {}, gradient).ok());
  std::string after;
  storage.AppendValues(rows.view(), WireDtype::kFloat32, &after);
  const std::vector<float> updated = Decoded(after);
  for (size_t i = 0; i < gradient.size(); ++i) CHECK(updated[i] == initial[i] - 0.5f * gradient[i]);
  CHECK(storage.counters().rows == 3);
  ShardState state;
  storage.Save(1, RowOrder::kAsStored, &state);
  SortRowsById(&state);
  REQUIRE(state.tables.size() == 2);
  CHECK(state.tables[0].ids == std::vector<int64_t>{t0[0], t0[1]});
  CHECK(state.tables[1].step == 1);
  CHECK(state.slots.empty());
}

TEST_CASE(
    "embedding storage saves rows made out of id order, sorted by id after, each with its own "
    "state; a replica's least recently updated first") {
  auto options = SgdTables();
  options->tables[0].optimizer.type = EmbeddingOptimizerType::kAdagrad;  // a state per element
  options->tables[0].max_rows = 1000;  // a bound keeps the rows' recency order
  EmbeddingStorage storage(8, options);
  const std::vector<int64_t> ids = OurIds(0, 3);
  // Made newest id first, each by a push of its own with its own gradient.
  for (int k = 2; k >= 0; --k) {
    const CheckedRowIds rows =
        CheckedRowIds::Check(RowIds{{1, 0}, {ids[k]}}, options->shape).value();
    const std::vector<float> gradient = {1.0f + k, 10.0f + k};
    REQUIRE(storage.Apply(1, rows.view(), {}, gradient).ok());
  }
  // A replica's copy under the shard's lock: as stored, with the links that order it.
  ShardState linked;
  storage.Save(1, RowOrder::kAsStoredWithRecency, &linked);
  REQUIRE(linked.tables[0].next_more_recent.size() == 3);
  CHECK_THAT(std::string(EncodeEmbeddingCheckpoint(linked.tables[0]).status().message()),
             Catch::Contains("rows still to be put in order of recency"));
  REQUIRE(OrderRowsByRecency(&linked.tables[0]).ok());
  CHECK(linked.tables[0].ids == std::vector<int64_t>{ids[2], ids[1], ids[0]});
  ShardState full;
  storage.Save(1, RowOrder::kAsStored, &full);
  ShardState changes;
  storage.SaveChanges(2, 1, &changes);
  for (ShardState* state : {&full, &changes, &linked}) {
    SortRowsById(state);
    const EmbeddingShardState& table = state->tables[0];
    REQUIRE(table.ids == ids);
    REQUIRE(table.state_floats == 2);
    for (int k = 0; k < 3; ++k) {
      const CheckedRowIds rows =
          CheckedRowIds::Check(RowIds{{1, 0}, {ids[k]}}, options->shape).value();
      std::string values;
      storage.AppendValues(rows.view(), WireDtype::kFloat32, &values);
      const std::vector<float> row = Decoded(values);
      CHECK(table.rows[2 * k] == row[0]);
      CHECK(table.rows[2 * k + 1] == row[1]);
      // Adagrad's sum of squares after one step is the gradient's square.
      CHECK(table.state[2 * k] == (1.0f + k) * (1.0f + k));
      CHECK(table.state[2 * k + 1] == (10.0f + k) * (10.0f + k));
    }
  }
}

TEST_CASE("embedding storage refuses unchecked rows and a gradient of other rows") {
  auto options = SgdTables();
  EmbeddingStorage storage(8, options);
  CHECK(storage.CheckGradientShape(CheckedRowIds(), {}).message() ==
        "shard 8 is an embedding shard: a push names its rows' ids");
  EmbeddingShardShape other = options->shape;
  other.bucket = 1;
  const std::vector<int64_t> theirs = {[] {
    for (int64_t id = 1;; ++id)
      if (EmbeddingShardOf(0, id, kBuckets) == 1) return id;
  }()};
  CheckedRowIds elsewhere = CheckedRowIds::Check(RowIds{{1, 0}, theirs}, other).value();
  CHECK(absl::StrContains(storage.CheckGradientShape(elsewhere, {1, 2}).message(),
                          "not checked for it"));
  CheckedRowIds ours = CheckedRowIds::Check(RowIds{{1, 0}, OurIds(0, 1)}, options->shape).value();
  CHECK(storage.CheckGradientShape(ours, {1, 2, 3}).message() ==
        "embedding shard 8: the gradient has 3 floats; the rows of the 1 ids sent have 2");
  CHECK(storage.DescribeElement(ours.view(), 1) ==
        absl::StrCat(" (table C1, id ", OurIds(0, 1)[0], ", element 1)"));
}

TEST_CASE("embedding storage says so when a table refuses an update (INTERNAL)") {
  auto options = SgdTables();
  EmbeddingStorage storage(8, options);
  CheckedRowIds ours = CheckedRowIds::Check(RowIds{{1, 0}, OurIds(0, 1)}, options->shape).value();
  // A gradient that does not fit, which a shard never passes (it checks the shape first).
  absl::Status applied = storage.Apply(1, ours.view(), {}, std::vector<float>{1});
  CHECK(applied.code() == absl::StatusCode::kInternal);
  CHECK(absl::StrContains(applied.message(), "embedding shard 8: update 1 failed part way"));
}

TEST_CASE("embedding storage's mean covers the union of the workers' ids") {
  auto options = SgdTables();
  EmbeddingStorage storage(8, options);
  const std::vector<int64_t> ids = OurIds(0, 2);
  CheckedRowIds first = CheckedRowIds::Check(RowIds{{1, 0}, {ids[0]}}, options->shape).value();
  CheckedRowIds second =
      CheckedRowIds::Check(RowIds{{2, 0}, {ids[0], ids[1]}}, options->shape).value();
  CheckedRowIds mean_rows;
  std::vector<float> mean;
  storage.Mean({&first, &second}, {std::vector<float>{1, 2}, std::vector<float>{3, 4, 5, 6}},
               &mean_rows, &mean);
  CHECK(mean_rows.rows().ids == ids);
  CHECK(mean_rows.CheckedFor(options->shape));
  CHECK(mean == std::vector<float>{(1.0f + 3) * 0.5f, (2.0f + 4) * 0.5f, 5 * 0.5f, 6 * 0.5f});
}

}  // namespace
}  // namespace paramserver
