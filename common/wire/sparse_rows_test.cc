#include "common/wire/sparse_rows.h"

#include <cstring>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/wire/shard_layout.h"

namespace paramserver {
namespace {

// The first `n` ids of table `table` that fall to `bucket` of `count`, ascending.
std::vector<int64_t> IdsOf(int table, int bucket, int count, int n) {
  std::vector<int64_t> ids;
  for (int64_t id = 0; static_cast<int>(ids.size()) < n; ++id) {
    if (EmbeddingShardOf(table, id, count) == bucket) ids.push_back(id);
  }
  return ids;
}

TEST_CASE("row ids are checked: counts, order, repeats and the shard they fall to") {
  const EmbeddingShardShape shape{{4, 2}, 1, 3};
  const std::vector<int64_t> a = IdsOf(0, 1, 3, 3), b = IdsOf(1, 1, 3, 2);
  RowIds rows{{3, 2}, a};
  rows.ids.insert(rows.ids.end(), b.begin(), b.end());
  REQUIRE(CheckRowIds(rows.view(), shape).ok());
  CHECK(RowFloats(rows.view(), shape.dims) == 3 * 4 + 2 * 2);
  CHECK(CheckRowIds({}, shape).message() == "ids for 0 tables; the model has 2");
  RowIds swapped = rows;
  std::swap(swapped.ids[0], swapped.ids[1]);
  CHECK(CheckRowIds(swapped.view(), shape).message() ==
        absl::StrCat("table C1: ids must be strictly increasing (sorted, no repeats); id ",
                     swapped.ids[1], " follows ", swapped.ids[0]));
  RowIds repeated = rows;
  repeated.ids[4] = repeated.ids[3];
  CHECK(std::string(CheckRowIds(repeated.view(), shape).message()).find("table C2: ids must") == 0);
  const int64_t elsewhere = IdsOf(1, 2, 3, 1)[0];
  RowIds misrouted{{0, 1}, {elsewhere}};
  CHECK(CheckRowIds(misrouted.view(), shape).message() ==
        absl::StrCat("table C2: id ", elsewhere, " belongs to embedding shard 2 of 3, not 1"));
  CHECK(CheckRowIds(RowIds{{6, 0}, a}.view(), shape).message() ==
        "table C1: a count of 6 ids, but 3 ids are left");
  CHECK(CheckRowIds(RowIds{{-1, 0}, a}.view(), shape).message() ==
        "table C1: a count of -1 ids, but 3 ids are left");
  CHECK(CheckRowIds(RowIds{{1, 0}, a}.view(), shape).message() ==
        "the counts add up to 1 ids, but 3 were sent");
}

TEST_CASE("the sync mean: the union of ids, rows summed in worker order, divided by workers") {
  const std::vector<int> dims = {2, 1};
  // Worker 0: table 0 ids {1, 5}, table 1 id {7}; worker 1: table 0 {5, 9}, table 1 none.
  const RowIds w0{{2, 1}, {1, 5, 7}}, w1{{2, 0}, {5, 9}};
  const std::vector<float> g0 = {1, 2, 3, 4, 10}, g1 = {0.5f, 0.25f, -8, 6};
  RowIds ids;
  std::vector<float> mean;
  MeanSparseGradients({&w0, &w1}, {&g0, &g1}, dims, 2, &ids, &mean);
  CHECK(ids.counts == std::vector<int32_t>{3, 1});
  CHECK(ids.ids == std::vector<int64_t>{1, 5, 9, 7});
  CHECK(mean == std::vector<float>{0.5f, 1, (3 + 0.5f) / 2, (4 + 0.25f) / 2, -4, 3, 5});
  // A worker that sent nothing adds nothing; the divisor is still the workers counted.
  const RowIds none{{0, 0}, {}};
  const std::vector<float> nothing;
  MeanSparseGradients({&none, &w1}, {&nothing, &g1}, dims, 2, &ids, &mean);
  CHECK(ids.ids == std::vector<int64_t>{5, 9});
  CHECK(mean == std::vector<float>{0.25f, 0.125f, -4, 3});
}

TEST_CASE("the sync mean of many workers' ids equals a sum by id, to the bit") {
  std::mt19937 random(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::vector<int> dims = {3, 1, 8};
  // Up to 20 workers: past the 16 whose cursors the merge keeps without allocating.
  for (int workers : {1, 2, 3, 7, 16, 20}) {
    INFO(workers << " workers");
    std::vector<RowIds> ids(workers);
    std::vector<std::vector<float>> gradients(workers);
    // Independently: per table, id -> the row summed in worker order.
    std::vector<std::map<int64_t, std::vector<float>>> sums(dims.size());
    for (int w = 0; w < workers; ++w) {
      for (size_t t = 0; t < dims.size(); ++t) {
        int32_t count = 0;
        for (int64_t id = -50; id < 200; ++id) {
          if (random() % 5 != 0) continue;  // each worker a fifth of the ids, some shared
          ids[w].ids.push_back(id);
          ++count;
          std::vector<float>& sum = sums[t].try_emplace(id, dims[t], 0.0f).first->second;
          for (int e = 0; e < dims[t]; ++e) {
            const float g = normal(random);
            gradients[w].push_back(g);
            sum[e] += g;
          }
        }
        ids[w].counts.push_back(count);
      }
    }
    RowIds expected_ids;
    std::vector<float> expected;
    const float scale = 1.0f / static_cast<float>(workers);
    for (const auto& table : sums) {
      expected_ids.counts.push_back(static_cast<int32_t>(table.size()));
      for (const auto& [id, sum] : table) {
        expected_ids.ids.push_back(id);
        for (float x : sum) expected.push_back(x * scale);
      }
    }
    std::vector<const RowIds*> their_ids;
    std::vector<const std::vector<float>*> their_gradients;
    for (int w = 0; w < workers; ++w) {
      their_ids.push_back(&ids[w]);
      their_gradients.push_back(&gradients[w]);
    }
    RowIds mean_ids{{9}, {1, 2, 3}};  // whatever a reused buffer held
    std::vector<float> mean(5, 7.0f);
    MeanSparseGradients(their_ids, their_gradients, dims, workers, &mean_ids, &mean);
    CHECK(mean_ids.counts == expected_ids.counts);
    CHECK(mean_ids.ids == expected_ids.ids);
    REQUIRE(mean.size() == expected.size());
    CHECK(std::memcmp(mean.data(), expected.data(), mean.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("checked ids say which shard they were checked for; moved-from ones say none") {
  const EmbeddingShardShape shape{{2}, 0, 1};  // one bucket: every id is this shard's
  absl::StatusOr<CheckedRowIds> refused = CheckedRowIds::Check(RowIds{{2}, {5, 3}}, shape);
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);  // not ascending
  CheckedRowIds checked = CheckedRowIds::Check(RowIds{{2}, {3, 5}}, shape).value();
  CHECK(checked.CheckedFor(shape));
  EmbeddingShardShape other = shape;
  other.bucket_count = 2;
  CHECK_FALSE(checked.CheckedFor(other));
  CHECK_FALSE(CheckedRowIds().CheckedFor(shape));
  CheckedRowIds moved = std::move(checked);
  CHECK(moved.CheckedFor(shape));
  CHECK(moved.rows().ids == std::vector<int64_t>{3, 5});
  CHECK_FALSE(checked.CheckedFor(shape));  // NOLINT(bugprone-use-after-move): what is left
  CHECK(checked.empty());
  RowIds taken = std::move(moved).TakeRows();
  CHECK(taken.ids == std::vector<int64_t>{3, 5});
  CHECK_FALSE(moved.CheckedFor(shape));  // NOLINT(bugprone-use-after-move)
}

TEST_CASE("ids travel as packed little-endian int64, and bad sizes are refused") {
  const std::vector<int64_t> ids = {0, 1, -1, int64_t{1} << 40};
  const std::string bytes = EncodeIds(ids);
  REQUIRE(bytes.size() == 32);
  CHECK(bytes.substr(8, 8) == std::string("\x01\0\0\0\0\0\0\0", 8));
  CHECK(*DecodeIds(bytes) == ids);
  CHECK(DecodeIds(bytes.substr(0, 31)).status().message() ==
        "ids: 31 bytes is not a whole number of int64 ids (8 bytes each)");
  CHECK(DecodeIds("").value().empty());
  CHECK(DecodeIds(bytes, 3).status().message() == "4 ids; at most 3 are accepted here");
  CHECK(DecodeIds(bytes, 4).ok());
}

}  // namespace
}  // namespace paramserver
