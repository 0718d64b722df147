#include "common/checkpoint/embedding_checkpoint_files.h"

#include <algorithm>
#include <map>

#include "catch2/catch.hpp"
#include "common/testing/temp_dir.h"
#include "common/wire/shard_layout.h"

namespace paramserver {
namespace {

// Table `table`'s rows 0..rows-1 (row id i holds i, i + 0.5; state 2i), cut into `count`.
std::vector<EmbeddingShardState> Cut(int table, int rows, int count, int64_t step) {
  EmbeddingShardState all;
  all.table_index = table;
  all.dim = 2;
  all.state_floats = 1;
  all.shard_count = 1;
  all.step = step;
  for (int64_t id = 0; id < rows; ++id) {
    all.ids.push_back(id * 7919);
    all.rows.insert(all.rows.end(), {static_cast<float>(id), id + 0.5f});
    all.state.push_back(2.0f * id);
  }
  return RehashEmbeddingShards({all}, count);
}

TEST_CASE("a step's rows load onto any cut of the key space, and only complete steps do") {
  TempDir dir;
  FileSystem& fs = LocalFileSystem();
  for (int table = 0; table < 2; ++table) {
    REQUIRE(WriteEmbeddingCheckpoints(fs, dir.path(), Cut(table, 50, 3, 10), /*epoch=*/4).ok());
  }
  CHECK(ListEmbeddingCheckpoints(fs, dir.path()).size() == 6);
  REQUIRE(CheckEmbeddingCheckpointAtStep(fs, dir.path(), 2, 10).ok());
  // Onto 3 buckets (the same cut) and onto 5: each bucket holds exactly its rows.
  for (int count : {3, 5}) {
    int64_t rows = 0;
    for (int bucket = 0; bucket < count; ++bucket) {
      absl::StatusOr<std::vector<EmbeddingShardState>> loaded =
          LoadEmbeddingBucketAtStep(fs, dir.path(), 2, bucket, count, 10);
      REQUIRE(loaded.ok());
      REQUIRE(loaded->size() == 2);
      for (const EmbeddingShardState& table : *loaded) {
        CHECK(table.epoch == 4);
        CHECK(std::is_sorted(table.ids.begin(), table.ids.end()));
        for (size_t i = 0; i < table.ids.size(); ++i) {
          CHECK(EmbeddingShardOf(table.table_index, table.ids[i], count) == bucket);
          CHECK(table.rows[2 * i] * 7919 == static_cast<float>(table.ids[i]));
          CHECK(table.state[i] == 2 * table.rows[2 * i]);
        }
        rows += static_cast<int64_t>(table.ids.size());
      }
    }
    CHECK(rows == 100);  // every row of both tables, once
  }
  // A missing file makes the step incomplete for that table.
  REQUIRE(fs.DeleteFile(dir.path() + "/emb-1-shard-2-of-3-step-10.ckpt").ok());
  CHECK(CheckEmbeddingCheckpointAtStep(fs, dir.path(), 2, 10).message() ==
        "no complete checkpoint of embedding table C2 in " + dir.path() + " at step 10");
  // A corrupt one is data loss, named.
  dir.WriteFile("emb-0-shard-1-of-3-step-10.ckpt", "PSEMB001 but not really");
  CHECK(LoadEmbeddingBucketAtStep(fs, dir.path(), 1, 1, 3, 10).status().code() ==
        absl::StatusCode::kDataLoss);
}

TEST_CASE("the newest checkpoint of a bucket, by epoch then step; old ones are pruned") {
  TempDir dir;
  FileSystem& fs = LocalFileSystem();
  auto write = [&](int64_t step, int64_t epoch) {
    for (int table = 0; table < 2; ++table) {
      std::vector<EmbeddingShardState> cut = Cut(table, 20, 2, step);
      REQUIRE(WriteEmbeddingCheckpoints(fs, dir.path(), {cut[1]}, epoch).ok());
    }
  };
  write(4, 1);
  write(8, 1);
  write(6, 2);  // after a rollback: the newer epoch wins over the higher step
  absl::StatusOr<std::vector<EmbeddingShardState>> newest =
      LoadNewestEmbeddingBucket(fs, dir.path(), 2, 1, 2);
  REQUIRE(newest.ok());
  CHECK(newest->front().step == 6);
  CHECK(newest->size() == 2);
  CHECK(LoadNewestEmbeddingBucket(fs, dir.path(), 2, 0, 2).status().code() ==
        absl::StatusCode::kNotFound);
  // Keep the newest 2 steps, and anything at or after step 6.
  CHECK(RemoveOldEmbeddingCheckpoints(fs, dir.path(), 1, 2, 2, 6) == 2);  // step 4's two files
  CHECK(ListEmbeddingCheckpoints(fs, dir.path()).size() == 4);
  CHECK(RemoveOldEmbeddingCheckpoints(fs, dir.path(), 1, 2, 0, -1) == 0);
}

// The rows of `full` with `changes` (id -> its new first value; the second and the state
// follow as Cut's do) put in and `removed` taken out: a table's rows after some steps.
EmbeddingShardState Changed(EmbeddingShardState full, const std::map<int64_t, float>& changes,
                            const std::vector<int64_t>& removed, int64_t step) {
  std::map<int64_t, std::pair<std::vector<float>, float>> rows;
  for (size_t i = 0; i < full.ids.size(); ++i)
    rows[full.ids[i]] = {{full.rows[2 * i], full.rows[2 * i + 1]}, full.state[i]};
  for (int64_t id : removed) rows.erase(id);
  for (const auto& [id, value] : changes) rows[id] = {{value, value + 0.5f}, 2 * value};
  full.ids.clear();
  full.rows.clear();
  full.state.clear();
  for (const auto& [id, row] : rows) {
    full.ids.push_back(id);
    full.rows.insert(full.rows.end(), row.first.begin(), row.first.end());
    full.state.push_back(row.second);
  }
  full.step = step;
  return full;
}

// The delta from `before` to `after` (one shard's), as a shard writes it.
EmbeddingShardState DeltaOf(const EmbeddingShardState& before, const EmbeddingShardState& after) {
  EmbeddingShardState delta = after;
  delta.previous_step = before.step;
  delta.ids.clear();
  delta.rows.clear();
  delta.state.clear();
  for (size_t i = 0; i < after.ids.size(); ++i) {
    const auto at = std::lower_bound(before.ids.begin(), before.ids.end(), after.ids[i]);
    const size_t j = static_cast<size_t>(at - before.ids.begin());
    if (at != before.ids.end() && *at == after.ids[i] && before.rows[2 * j] == after.rows[2 * i] &&
        before.state[j] == after.state[i])
      continue;
    delta.ids.push_back(after.ids[i]);
    delta.rows.insert(delta.rows.end(), {after.rows[2 * i], after.rows[2 * i + 1]});
    delta.state.push_back(after.state[i]);
  }
  for (int64_t id : before.ids) {
    if (!std::binary_search(after.ids.begin(), after.ids.end(), id))
      delta.removed_ids.push_back(id);
  }
  return delta;
}

TEST_CASE("a step of deltas loads as its full rows, onto any cut; a broken chain is named") {
  TempDir dir;
  FileSystem& fs = LocalFileSystem();
  // One table cut in 2: full at step 10, deltas at 20 (of 10) and 30 (of 20).
  const std::vector<EmbeddingShardState> at10 = Cut(0, 60, 2, 10);
  std::vector<EmbeddingShardState> at20, at30;
  for (const EmbeddingShardState& shard : at10) {
    // Step 20 changes two rows and evicts one; step 30 evicts a row changed at 20 and
    // makes the evicted one of 20 again.
    const int64_t a = shard.ids[0], b = shard.ids[1], c = shard.ids[2];
    EmbeddingShardState twenty = Changed(shard, {{a, 100.0f}, {b, 200.0f}}, {c}, 20);
    at20.push_back(twenty);
    at30.push_back(Changed(twenty, {{c, 300.0f}}, {a}, 30));
  }
  for (size_t k = 0; k < at10.size(); ++k) {
    REQUIRE(WriteEmbeddingCheckpoints(fs, dir.path(), {at10[k]}, 1).ok());
    REQUIRE(WriteEmbeddingCheckpoints(fs, dir.path(), {DeltaOf(at10[k], at20[k])}, 1).ok());
    REQUIRE(WriteEmbeddingCheckpoints(fs, dir.path(), {DeltaOf(at20[k], at30[k])}, 1).ok());
  }
  CHECK(fs.FileExists(dir.path() + "/emb-0-shard-1-of-2-step-30-after-20.ckpt"));
  for (int count : {2, 3}) {
    // The rows at 30 through the chain, re-cut, equal the rows at 30 cut the same way.
    const std::vector<EmbeddingShardState> want = RehashEmbeddingShards(at30, count);
    for (int bucket = 0; bucket < count; ++bucket) {
      absl::StatusOr<std::vector<EmbeddingShardState>> loaded =
          LoadEmbeddingBucketAtStep(fs, dir.path(), 1, bucket, count, 30);
      REQUIRE(loaded.ok());
      CHECK((*loaded)[0].ids == want[bucket].ids);
      CHECK((*loaded)[0].rows == want[bucket].rows);
      CHECK((*loaded)[0].state == want[bucket].state);
      CHECK_FALSE((*loaded)[0].is_delta());
    }
  }
  absl::StatusOr<std::vector<EmbeddingShardState>> newest =
      LoadNewestEmbeddingBucket(fs, dir.path(), 1, 1, 2);
  REQUIRE(newest.ok());
  CHECK((*newest)[0].step == 30);
  CHECK((*newest)[0].ids == at30[1].ids);

  // Shard 0's chain with its middle file gone: step 30 is incomplete, naming the file.
  REQUIRE(fs.DeleteFile(dir.path() + "/emb-0-shard-0-of-2-step-20-after-10.ckpt").ok());
  const absl::Status broken = CheckEmbeddingCheckpointAtStep(fs, dir.path(), 1, 30);
  CHECK(broken.code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(broken.message()),
             Catch::Contains("emb-0-shard-0-of-2-step-30-after-20.ckpt changes the checkpoint at "
                             "step 20, whose file (emb-0-shard-0-of-2-step-20...) is missing"));
  // Retention keeps what the kept steps read: keeping only step 30 keeps 20 and 10.
  CHECK(RemoveOldEmbeddingCheckpoints(fs, dir.path(), 1, 2, 1, 30) == 0);
  // A full file at 40 ends the chain: then 10, 20 and 30 may go.
  std::vector<EmbeddingShardState> at40 = at30;
  for (EmbeddingShardState& shard : at40) shard.step = 40;
  REQUIRE(WriteEmbeddingCheckpoints(fs, dir.path(), {at40[1]}, 1).ok());
  CHECK(RemoveOldEmbeddingCheckpoints(fs, dir.path(), 1, 2, 1, 40) == 3);
  // A delta whose base is gone is no restore target: it does not push step 40 out, and
  // goes itself once the retain-from step is past it.
  EmbeddingShardState orphan = DeltaOf(at30[1], at40[1]);
  orphan.step = 50;
  orphan.previous_step = 45;
  REQUIRE(WriteEmbeddingCheckpoints(fs, dir.path(), {orphan}, 1).ok());
  CHECK(RemoveOldEmbeddingCheckpoints(fs, dir.path(), 1, 2, 1, 50) == 0);
  CHECK(RemoveOldEmbeddingCheckpoints(fs, dir.path(), 1, 2, 1, 60) == 1);
  CHECK(LoadNewestEmbeddingBucket(fs, dir.path(), 1, 1, 2)->front().step == 40);

  // A delta applied to another table's rows is refused.
  EmbeddingShardState other = at10[0];
  other.table_index = 1;
  CHECK(ApplyEmbeddingDelta(other, DeltaOf(at10[0], at20[0]), "x").status().code() ==
        absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace paramserver
