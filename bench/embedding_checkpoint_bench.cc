// Full against delta checkpoints of an embedding shard (checkpoint.embedding_deltas): the
// bytes and the time a checkpoint of ROWS rows takes, written as a server writes it
// (EmbeddingStorage's snapshot, sorted by id, encoded, written to a file in DIR and renamed
// into place; the rows restored in no order of id, as a live table holds them),
// when TOUCHED_PERCENT of the rows changed since the last one; and a restore of the base
// plus that delta (LoadEmbeddingBucketAtStep through the chain) against the full file's.
//   embedding_checkpoint_bench ROWS [TOUCHED_PERCENT] [DIM] [REPEATS] [DIR]
// One table of DIM-wide rows (default 16) under row-wise Adagrad (one state float per
// row), REPEATS rounds (default 3) interleaved, medians. Prints the line ctr_bench.py reads:
//   rows=N touched=T full_bytes=F delta_bytes=D full_write_s=A full_snapshot_s=S
//   full_sort_s=O delta_write_s=B full_restore_s=C chain_restore_s=E table_build_s=T
// full_write_s is the whole of a full checkpoint; of it, full_snapshot_s the copy a server
// takes under its shard's lock (pushes wait for it), full_sort_s the sort by id after.
// table_build_s is the table made from the restored rows (EmbeddingStorage::Restore),
// once, before the rounds.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_figures.h"
#include "common/checkpoint/embedding_checkpoint_files.h"
#include "common/files/file_system.h"
#include "ps/embedding_storage.h"

namespace paramserver {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int64_t FileBytes(const std::string& dir, int64_t step, int64_t previous_step) {
  EmbeddingShardState name;
  name.step = step;
  name.previous_step = previous_step;
  absl::StatusOr<std::string> bytes =
      LocalFileSystem().ReadFile(EmbeddingCheckpointPath(dir, name));
  return bytes.ok() ? static_cast<int64_t>(bytes->size()) : -1;
}

int Run(int64_t rows, double touched_percent, int dim, int repeats, const std::string& dir) {
  auto options = std::make_shared<EmbeddingShardOptions>();
  options->shape = {{dim}, 0, 1};
  EmbeddingTableOptions table;
  table.dim = dim;
  table.optimizer.type = EmbeddingOptimizerType::kRowwiseAdagrad;
  table.optimizer.learning_rate = 0.05;
  table.track_removals = true;
  options->tables.push_back(table);
  EmbeddingStorage storage(0, options);
  double table_build_s = 0;  // the restore into the table (once: the set-up)
  {  // Every row, with its state, as a restore makes them (ids spread over 2^32).
    EmbeddingShardState all;
    all.dim = dim;
    all.state_floats = StateFloatsPerRow(table.optimizer.type, dim);
    all.optimizer = std::string(EmbeddingOptimizerName(table.optimizer.type));
    std::mt19937_64 random(7);
    std::normal_distribution<float> normal;
    all.ids.resize(rows);
    for (int64_t i = 0; i < rows; ++i) all.ids[i] = i * 4099 + 17;
    // Restored in no order of id, as a live table holds its rows (in update order).
    std::shuffle(all.ids.begin(), all.ids.end(), random);
    all.rows.resize(rows * dim);
    for (float& value : all.rows) value = normal(random);
    all.state.assign(rows * all.state_floats, 0.5f);
    std::vector<EmbeddingShardState> tables;
    tables.push_back(std::move(all));
    const auto start = std::chrono::steady_clock::now();
    const absl::Status restored = storage.Restore(tables);
    table_build_s = SecondsSince(start);
    if (!restored.ok()) {
      std::fprintf(stderr, "%s\n", restored.ToString().c_str());
      return 1;
    }
  }
  {
    // Then every row updated once (a zero gradient: no value changes), in another order,
    // a few thousand at a time: the rows' update order no longer follows where they are
    // stored, as in a table that has trained.
    std::vector<int64_t> order(rows);
    for (int64_t i = 0; i < rows; ++i) order[i] = i * 4099 + 17;
    std::shuffle(order.begin(), order.end(), std::mt19937_64(13));
    constexpr int64_t kBatch = 4096;
    for (int64_t from = 0; from < rows; from += kBatch) {
      std::vector<int64_t> ids(order.begin() + from, order.begin() + std::min(rows, from + kBatch));
      std::sort(ids.begin(), ids.end());
      RowIds batch;
      batch.counts = {static_cast<int32_t>(ids.size())};
      batch.ids = ids;
      const std::vector<float> zero(ids.size() * dim, 0.0f);
      const absl::Status updated = storage.Apply(0, batch.view(), {}, zero);
      if (!updated.ok()) {
        std::fprintf(stderr, "%s\n", updated.ToString().c_str());
        return 1;
      }
    }
  }
  const int64_t touched = std::max<int64_t>(1, static_cast<int64_t>(rows * touched_percent / 100));
  std::vector<double> full_write, full_snapshot, full_sort, delta_write, full_restore,
      chain_restore;
  int64_t full_bytes = 0, delta_bytes = 0;
  std::mt19937_64 random(11);
  FileSystem& fs = LocalFileSystem();
  int64_t step = 0;
  for (int round = 0; round < repeats; ++round) {
    // A full checkpoint at `base`.
    const int64_t base = ++step;
    ShardState state;
    auto start = std::chrono::steady_clock::now();
    storage.Save(base, RowOrder::kAsStored, &state);
    full_snapshot.push_back(SecondsSince(start));
    const auto sort_start = std::chrono::steady_clock::now();
    SortRowsById(&state);
    full_sort.push_back(SecondsSince(sort_start));
    absl::Status written = WriteEmbeddingCheckpoints(fs, dir, state.tables, 1);
    full_write.push_back(SecondsSince(start));
    storage.ClearChanges();
    // Updates to `touched` distinct rows, then the delta at the next step.
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < touched; ++i) {
      ids.push_back(static_cast<int64_t>(random() % static_cast<uint64_t>(rows)) * 4099 + 17);
    }
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    RowIds pushed;
    pushed.counts = {static_cast<int32_t>(ids.size())};
    pushed.ids = ids;
    std::vector<float> gradient(ids.size() * dim, 0.01f);
    const absl::Status applied = storage.Apply(base + 1, pushed.view(), {}, gradient);
    const int64_t next = ++step;
    start = std::chrono::steady_clock::now();
    state = ShardState();
    storage.SaveChanges(next, base, &state);
    SortRowsById(&state);
    if (written.ok()) written = WriteEmbeddingCheckpoints(fs, dir, state.tables, 1);
    delta_write.push_back(SecondsSince(start));
    storage.ClearChanges();
    if (!written.ok() || !applied.ok()) {
      std::fprintf(stderr, "%s %s\n", written.ToString().c_str(), applied.ToString().c_str());
      return 1;
    }
    full_bytes = FileBytes(dir, base, -1);
    delta_bytes = FileBytes(dir, next, base);
    // Restores: the full file alone, and the full file plus the delta.
    start = std::chrono::steady_clock::now();
    absl::StatusOr<std::vector<EmbeddingShardState>> loaded =
        LoadEmbeddingBucketAtStep(fs, dir, 1, 0, 1, base);
    full_restore.push_back(SecondsSince(start));
    start = std::chrono::steady_clock::now();
    absl::StatusOr<std::vector<EmbeddingShardState>> chained =
        LoadEmbeddingBucketAtStep(fs, dir, 1, 0, 1, next);
    chain_restore.push_back(SecondsSince(start));
    if (!loaded.ok() || !chained.ok() || (*chained)[0].ids.size() != static_cast<size_t>(rows)) {
      std::fprintf(stderr, "restore failed: %s %s\n", loaded.status().ToString().c_str(),
                   chained.status().ToString().c_str());
      return 1;
    }
    RemoveOldEmbeddingCheckpoints(fs, dir, 0, 1, /*keep=*/0, /*retain_from=*/step + 1);
  }
  std::printf(
      "rows=%lld touched=%lld full_bytes=%lld delta_bytes=%lld full_write_s=%.4f "
      "full_snapshot_s=%.4f full_sort_s=%.4f delta_write_s=%.4f full_restore_s=%.4f "
      "chain_restore_s=%.4f table_build_s=%.4f\n",
      static_cast<long long>(rows), static_cast<long long>(touched),
      static_cast<long long>(full_bytes), static_cast<long long>(delta_bytes), Median(full_write),
      Median(full_snapshot), Median(full_sort), Median(delta_write), Median(full_restore),
      Median(chain_restore), table_build_s);
  return 0;
}

}  // namespace
}  // namespace paramserver

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(
        stderr, "usage: embedding_checkpoint_bench ROWS [TOUCHED_PERCENT] [DIM] [REPEATS] [DIR]\n");
    return 2;
  }
  const int64_t rows = std::atoll(argv[1]);
  const double touched = argc > 2 ? std::atof(argv[2]) : 1.0;
  const int dim = argc > 3 ? std::atoi(argv[3]) : 16;
  const int repeats = argc > 4 ? std::atoi(argv[4]) : 3;
  std::string dir = argc > 5 ? argv[5] : "";
  char made[] = "/tmp/embedding_checkpoint_bench.XXXXXX";
  if (dir.empty()) {
    if (mkdtemp(made) == nullptr) return 1;
    dir = made;
  }
  if (rows < 1 || dim < 1 || repeats < 1 || touched <= 0 || touched > 100) {
    std::fprintf(stderr, "embedding_checkpoint_bench: bad arguments\n");
    return 2;
  }
  const int code = paramserver::Run(rows, touched, dim, repeats, dir);
  if (argc <= 5) {
    paramserver::RemoveOldEmbeddingCheckpoints(paramserver::LocalFileSystem(), dir, 0, 1, 0,
                                               int64_t{1} << 60);
    rmdir(dir.c_str());
  }
  return code;
}
