#include "ps/embedding_table.h"

#include <vector>

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

EmbeddingTableOptions Options(int dim = 4) {
  EmbeddingTableOptions options;
  options.dim = dim;
  options.optimizer.type = EmbeddingOptimizerType::kAdam;
  options.optimizer.learning_rate = 0.01;
  options.init_seed = 5;
  options.table_index = 2;
  return options;
}

std::vector<float> Pull(EmbeddingTable& table, std::vector<int64_t> ids,
                        std::vector<bool>* present = nullptr) {
  std::vector<float> rows(ids.size() * table.dim());
  std::vector<bool> flags;
  table.Pull(ids, absl::MakeSpan(rows), &flags);
  if (present != nullptr) *present = flags;
  return rows;
}

TEST_CASE("a row is made at its first pull from (seed, table, id) alone") {
  EmbeddingTable table(Options());
  std::vector<bool> present;
  const std::vector<float> rows = Pull(table, {42, 0xfffffffeLL}, &present);
  CHECK(present == std::vector<bool>{true, true});
  CHECK(table.rows() == 2);
  for (int e = 0; e < 4; ++e) {
    CHECK(rows[e] == InitialEmbeddingValue(5, 2, 42, e));
    CHECK(rows[4 + e] == InitialEmbeddingValue(5, 2, 0xfffffffeLL, e));
  }
  EmbeddingTable elsewhere(Options());  // another server, a replay, a restore
  std::vector<float> swapped(rows.begin() + 4, rows.end());
  swapped.insert(swapped.end(), rows.begin(), rows.begin() + 4);
  CHECK(Pull(elsewhere, {0xfffffffeLL, 42}) == swapped);
  CHECK(InitialEmbeddingValue(5, 3, 42, 0) != InitialEmbeddingValue(5, 2, 42, 0));
  // N(0, 1): over many values, mean about 0 and variance about 1.
  double sum = 0, squares = 0;
  for (int64_t id = 0; id < 20000; ++id) {
    const double x = InitialEmbeddingValue(1, 0, id, 0);
    sum += x;
    squares += x * x;
  }
  CHECK(std::abs(sum / 20000) < 0.03);
  CHECK(std::abs(squares / 20000 - 1) < 0.05);
}

TEST_CASE("pushes update only their rows, with the row optimizer; bad pushes change nothing") {
  EmbeddingTable table(Options());
  const std::vector<float> before = Pull(table, {3, 9});
  const std::vector<float> gradient = {0.5f, -0.25f, 1, 0};
  REQUIRE(table.Apply(1, {9}, gradient).ok());
  // What the optimizer does to a copy of row 9 with fresh state.
  std::vector<float> expected(before.begin() + 4, before.end());
  std::vector<float> state(8, 0.0f);
  ApplyRowUpdate(Options().optimizer, 1, gradient, absl::MakeSpan(expected), absl::MakeSpan(state));
  const std::vector<float> after = Pull(table, {3, 9});
  CHECK(std::vector<float>(after.begin(), after.begin() + 4) ==
        std::vector<float>(before.begin(), before.begin() + 4));
  CHECK(std::vector<float>(after.begin() + 4, after.end()) == expected);
  const std::vector<float> two(8, 1.0f);
  CHECK(table.Apply(2, {9, 3}, two).message() ==
        "embedding push: ids must be strictly increasing; id 3 at position 1 follows 9");
  CHECK(table.Apply(2, {3, 3}, two).code() == absl::StatusCode::kInvalidArgument);
  CHECK(table.Apply(2, {3}, two).message() ==
        "embedding push: 1 ids but 8 gradient floats (dim 4)");
  CHECK(Pull(table, {3, 9}) == after);         // unchanged by the refused pushes
  REQUIRE(table.Apply(2, {3, 77}, two).ok());  // 77 has no row: dropped, counted
  CHECK(table.dropped_gradients() == 1);
  CHECK(table.rows() == 2);
}

TEST_CASE("past max_rows the least recently used row is evicted, and comes back fresh") {
  EmbeddingTableOptions options = Options();
  options.max_rows = 3;
  EmbeddingTable table(options);
  const std::vector<float> first_two = Pull(table, {2});           // used: 2
  Pull(table, {1, 3});                                             // 2 1 3
  REQUIRE(table.Apply(1, {2}, std::vector<float>(4, 1.0f)).ok());  // 1 3 2
  Pull(table, {1});                                                // 3 2 1
  Pull(table, {4});  // full: evicts 3, the least recently used     // 2 1 4
  CHECK(table.rows() == 3);
  CHECK(table.evicted_rows() == 1);
  Pull(table, {5});  // evicts 2                                     // 1 4 5
  CHECK(table.evicted_rows() == 2);
  // Pulled again, 2 is its initial value: its trained value and moments are gone.
  CHECK(Pull(table, {2}) == first_two);
  CHECK(table.rows() == 3);
}

TEST_CASE("with min_count an id reads as absent until its min_count-th sighting") {
  EmbeddingTableOptions options = Options();
  options.min_count = 3;
  EmbeddingTable table(options);
  std::vector<bool> present;
  CHECK(Pull(table, {7}, &present) == std::vector<float>(4, 0.0f));
  CHECK(present == std::vector<bool>{false});
  Pull(table, {7}, &present);
  CHECK(present == std::vector<bool>{false});
  CHECK(table.pending_ids() == 1);
  REQUIRE(table.Apply(1, {7}, std::vector<float>(4, 1.0f)).ok());
  CHECK(table.dropped_gradients() == 1);
  const std::vector<float> row = Pull(table, {7}, &present);
  CHECK(present == std::vector<bool>{true});
  CHECK(row[0] == InitialEmbeddingValue(5, 2, 7, 0));
  CHECK(table.rows() == 1);
  CHECK(table.pending_ids() == 0);
}

TEST_CASE("rows and their optimizer state round-trip through ForEachRow and Restore") {
  EmbeddingTable table(Options());
  Pull(table, {1, 2, 3});
  REQUIRE(table.Apply(1, {1, 3}, std::vector<float>(8, 0.5f)).ok());
  EmbeddingTable copy(Options());
  table.ForEachRow([&](int64_t id, absl::Span<const float> row, absl::Span<const float> state) {
    REQUIRE(copy.Restore(id, row, state).ok());
  });
  CHECK(copy.rows() == 3);
  CHECK(Pull(copy, {1, 2, 3}) == Pull(table, {1, 2, 3}));
  // The moments came too: the same next update gives the same rows.
  REQUIRE(table.Apply(2, {1}, std::vector<float>(4, -1.0f)).ok());
  REQUIRE(copy.Apply(2, {1}, std::vector<float>(4, -1.0f)).ok());
  CHECK(Pull(copy, {1}) == Pull(table, {1}));
  CHECK(copy.Restore(9, std::vector<float>(3), std::vector<float>(8)).code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("a row costs little more than its floats") {
  EmbeddingTable table(Options(16));  // adam: 16 * 4 * 3 = 192 bytes at least
  CHECK(table.minimum_bytes_per_row() == 192);
  std::vector<int64_t> ids;
  for (int64_t id = 0; id < 120000; ++id) ids.push_back(id * 2654435761LL % 4294967291LL);
  std::vector<float> rows(ids.size() * 16);
  std::vector<bool> present;
  table.Pull(ids, absl::MakeSpan(rows), &present);
  CHECK(table.rows() == 120000);
  INFO("bytes per row: " << table.bytes_per_row());
  CHECK(table.bytes_per_row() >= 192);
  CHECK(table.bytes_per_row() < 1.5 * 192);
}

}  // namespace
}  // namespace paramserver
