#include "common/checkpoint/embedding_checkpoint_files.h"

#include <algorithm>

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

}  // namespace
}  // namespace paramserver
