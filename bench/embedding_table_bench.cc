// An embedding table on a server (ps/embedding_table), measured: the bytes a row costs
// against the minimum (its floats and its Adam moments), and how fast rows are pulled and
// updated when a batch touches rows drawn from a Zipf-like law over the table.
//   embedding_table_bench ROWS [DIM] [REPEATS] [OPTIMIZER]
// (OPTIMIZER: training.embedding_optimizer's type, default adam)
// Prints lines bench/run_all.py reads:
//   rows N dim D bytes_per_row B minimum_bytes_per_row M
//   pull M rows/s  apply M rows/s   (medians of REPEATS rounds of 256 batches of 4096 ids)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "ps/embedding_table.h"

namespace {

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: embedding_table_bench ROWS [DIM] [REPEATS] [OPTIMIZER]\n");
    return 2;
  }
  const int64_t rows = std::atoll(argv[1]);
  const int dim = argc > 2 ? std::atoi(argv[2]) : 16;
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 3;
  paramserver::EmbeddingTableOptions options;
  options.dim = dim;
  if (argc > 4) {
    absl::StatusOr<paramserver::EmbeddingOptimizerType> type =
        paramserver::ParseEmbeddingOptimizerType(argv[4]);
    if (!type.ok()) {
      std::fprintf(stderr, "embedding_table_bench: %s\n",
                   std::string(type.status().message()).c_str());
      return 2;
    }
    options.optimizer.type = *type;
  }
  paramserver::EmbeddingTable table(options);
  // Fill the table: every id once, spread over the 32-bit space.
  const auto id_of = [](int64_t rank) { return (rank * 2654435761LL) % 4294967291LL; };
  {
    // Rows are made by their first update: a zero gradient, in sorted batches.
    std::vector<int64_t> ids;
    std::vector<float> zeros;
    for (int64_t start = 0; start < rows; start += 65536) {
      ids.clear();
      for (int64_t r = start; r < std::min(rows, start + 65536); ++r) ids.push_back(id_of(r));
      std::sort(ids.begin(), ids.end());
      zeros.assign(ids.size() * dim, 0.0f);
      if (!table.Apply(1, ids, zeros).ok()) return 1;
    }
  }
  std::printf("rows %lld dim %d bytes_per_row %.1f minimum_bytes_per_row %lld\n",
              static_cast<long long>(table.rows()), dim, table.bytes_per_row(),
              static_cast<long long>(table.minimum_bytes_per_row()));
  // Batches of 4096 distinct ids, ranks drawn log-uniformly (a heavy head, a long tail),
  // sorted as a push sends them.
  std::mt19937_64 random(1);
  std::uniform_real_distribution<double> uniform(0, std::log(static_cast<double>(rows)));
  const int batches = 256, batch_ids = 4096;
  std::vector<std::vector<int64_t>> batch(batches);
  for (auto& ids : batch) {
    while (static_cast<int>(ids.size()) < batch_ids) {
      ids.push_back(id_of(static_cast<int64_t>(std::exp(uniform(random))) % rows));
      if (static_cast<int>(ids.size()) == batch_ids) {
        std::sort(ids.begin(), ids.end());
        ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
      }
    }
  }
  std::vector<float> out(batch_ids * dim), gradient(batch_ids * dim, 0.01f);
  std::vector<bool> present;
  std::vector<double> pull_rates, apply_rates;
  int64_t step = 1;
  for (int round = 0; round < repeats; ++round) {
    auto start = std::chrono::steady_clock::now();
    for (const auto& ids : batch) table.Pull(ids, absl::MakeSpan(out), &present);
    double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    pull_rates.push_back(batches * batch_ids / seconds / 1e6);
    start = std::chrono::steady_clock::now();
    for (const auto& ids : batch) {
      if (!table.Apply(step++, ids, absl::MakeConstSpan(gradient.data(), ids.size() * dim)).ok()) {
        return 1;
      }
    }
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    apply_rates.push_back(batches * batch_ids / seconds / 1e6);
  }
  std::printf("pull %.2f M rows/s  apply %.2f M rows/s\n", Median(pull_rates), Median(apply_rates));
  return 0;
}
