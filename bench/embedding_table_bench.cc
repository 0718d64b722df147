// An embedding table on a server (ps/embedding_table), measured against its own memory
// bound: the bytes a row costs against the minimum (its floats and its optimizer state),
// and how fast rows are pulled and updated when a batch touches rows drawn from a
// Zipf-like law over the table.
//   embedding_table_bench ROWS [DIM] [REPEATS] [OPTIMIZER|all]
// (OPTIMIZER: training.embedding_optimizer's type, default adam; all: each in turn)
//
// The bound is a kernel with the same memory traffic and no arithmetic, over the same
// rows: an index of the same kind (ps/row_index.h) from the same ids to slots of the
// same size (the id, the row and its state, 64-byte aligned), and the same batches. Its
// pull finds each id's slot (confirmed by the id in it) and copies the row out; its
// update finds each id's slot, reads the gradient and reads and writes the row and its
// state. It asks for memory ahead as the table does, keeps no
// LRU list and makes no rows: what any id-keyed table must move, at this machine's
// memory speed. Rounds interleave the table's and the bound's runs.
//
// Prints, per optimizer, lines bench/run_all.py reads:
//   optimizer O rows N dim D bytes_per_row B minimum_bytes_per_row M
//   O pull P M rows/s bound PB M rows/s apply A M rows/s bound AB M rows/s check C M rows/s
// (check: the push's check before its update, EmbeddingTable::FirstUnsafeElement, which
// reads every row and its state as the update does and writes nothing)
// (medians of REPEATS rounds of 256 batches of 4096 ids)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_figures.h"
#include "ps/embedding_table.h"
#include "ps/memory_prefetch.h"
#include "ps/row_index.h"

namespace {

using paramserver::kRowsAhead;
using paramserver::Median;
using paramserver::MillionsPerSecond;

// Ids spread over the 32-bit space, one per rank.
int64_t IdOf(int64_t rank) { return (rank * 2654435761LL) % 4294967291LL; }

// The order rows are made in: every id once, in sorted batches of 65536 ranks.
template <typename Visit>
void ForEachFillBatch(int64_t rows, const Visit& visit) {
  std::vector<int64_t> ids;
  for (int64_t start = 0; start < rows; start += 65536) {
    ids.clear();
    for (int64_t r = start; r < std::min(rows, start + 65536); ++r) ids.push_back(IdOf(r));
    std::sort(ids.begin(), ids.end());
    if (!visit(ids)) return;
  }
}

// The bound's table: ids to slots of an id and `slot_floats` floats, nothing else.
class BoundTable {
 public:
  BoundTable(int64_t rows, int dim, int slot_floats)
      : dim_(dim), slot_floats_(slot_floats), zero_(ReadZero()) {
    index_.Reserve(rows);
    const size_t bytes = static_cast<size_t>(rows) * StrideFloats() * sizeof(float);
    slots_.reset(static_cast<float*>(::operator new[](bytes, std::align_val_t(64))));
    std::memset(slots_.get(), 0, bytes);
    // Slots in the order the table makes its rows, so that both lay the rows out alike.
    uint32_t next = 0;
    ForEachFillBatch(rows, [&](const std::vector<int64_t>& ids) {
      for (int64_t id : ids) {
        std::memcpy(Slot(next) - kIdFloats, &id, sizeof(id));
        index_.Insert(id, next++);
      }
      return true;
    });
  }

  void Pull(const std::vector<int64_t>& ids, float* out) const {
    index_.LookUpAhead(
        absl::MakeConstSpan(ids), [this](uint32_t slot) { return IdOfSlot(slot); },
        [&](uint32_t slot) {
          paramserver::PrefetchForRead(Slot(slot) - kIdFloats, sizeof(float) * (kIdFloats + dim_));
        },
        [&](size_t i, uint32_t slot) {
          if (slot == paramserver::RowIndex::kMissing) std::abort();  // every id was made
          std::memcpy(out + i * dim_, Slot(slot), sizeof(float) * dim_);
          return true;
        });
  }

  // Reads each gradient into a checksum and rewrites each slot's words unchanged (XOR
  // with a zero the compiler cannot see).
  uint32_t Touch(const std::vector<int64_t>& ids, const float* gradients) {
    const size_t count = ids.size();
    found_.resize(count);
    index_.LookUpAhead(
        absl::MakeConstSpan(ids), [this](uint32_t slot) { return IdOfSlot(slot); },
        [&](uint32_t slot) {
          paramserver::PrefetchForRead(Slot(slot) - kIdFloats, sizeof(int64_t));
        },
        [&](size_t i, uint32_t slot) {
          if (slot == paramserver::RowIndex::kMissing) std::abort();  // every id was made
          found_[i] = slot;
          return true;
        });
    uint32_t checksum = 0;
    const size_t slot_bytes = sizeof(float) * slot_floats_;
    for (size_t i = 0; i < count; ++i) {
      if (i + kRowsAhead < count)
        paramserver::PrefetchForWrite(Slot(found_[i + kRowsAhead]), slot_bytes);
      float* slot = Slot(found_[i]);
      for (int e = 0; e < dim_; ++e) {
        uint32_t word;
        std::memcpy(&word, gradients + i * dim_ + e, sizeof(word));
        checksum ^= word;
      }
      for (int e = 0; e < slot_floats_; ++e) {
        uint32_t word;
        std::memcpy(&word, slot + e, sizeof(word));
        word ^= zero_;
        std::memcpy(slot + e, &word, sizeof(word));
      }
    }
    return checksum;
  }

 private:
  struct SlabDelete {
    void operator()(float* slab) const { ::operator delete[](slab, std::align_val_t(64)); }
  };
  static uint32_t ReadZero() {
    static volatile uint32_t zero = 0;
    return zero;
  }
  static constexpr int kIdFloats = sizeof(int64_t) / sizeof(float);
  int StrideFloats() const { return kIdFloats + slot_floats_; }
  // Where slot `slot`'s row starts, after its id.
  float* Slot(uint32_t slot) const {
    return slots_.get() + static_cast<size_t>(slot) * StrideFloats() + kIdFloats;
  }
  int64_t IdOfSlot(uint32_t slot) const {
    int64_t id;
    std::memcpy(&id, Slot(slot) - kIdFloats, sizeof(id));
    return id;
  }

  const int dim_;
  const int slot_floats_;
  const uint32_t zero_;
  paramserver::RowIndex index_;
  std::unique_ptr<float[], SlabDelete> slots_;
  std::vector<uint32_t> found_;
};

int Measure(int64_t rows, int dim, int repeats, paramserver::EmbeddingOptimizerType type) {
  const std::string name(paramserver::EmbeddingOptimizerName(type));
  paramserver::EmbeddingTableOptions options;
  options.dim = dim;
  options.optimizer.type = type;
  paramserver::EmbeddingTable table(options);
  // Rows are made by their first update: a zero gradient.
  std::vector<float> zeros;
  bool filled = true;
  ForEachFillBatch(rows, [&](const std::vector<int64_t>& ids) {
    zeros.assign(ids.size() * dim, 0.0f);
    filled = table.Apply(1, ids, zeros).ok();
    return filled;
  });
  if (!filled) return 1;
  std::printf("optimizer %s rows %lld dim %d bytes_per_row %.1f minimum_bytes_per_row %lld\n",
              name.c_str(), static_cast<long long>(table.rows()), dim, table.bytes_per_row(),
              static_cast<long long>(table.minimum_bytes_per_row()));
  BoundTable bound(rows, dim, static_cast<int>(table.minimum_bytes_per_row() / sizeof(float)));
  // Batches of 4096 distinct ids, ranks drawn log-uniformly (a heavy head, a long tail),
  // sorted as a push sends them.
  std::mt19937_64 random(1);
  std::uniform_real_distribution<double> uniform(0, std::log(static_cast<double>(rows)));
  const int batches = 256, batch_ids = 4096;
  std::vector<std::vector<int64_t>> batch(batches);
  int64_t batch_rows = 0;
  for (auto& ids : batch) {
    while (static_cast<int>(ids.size()) < batch_ids) {
      ids.push_back(IdOf(static_cast<int64_t>(std::exp(uniform(random))) % rows));
      if (static_cast<int>(ids.size()) == batch_ids) {
        std::sort(ids.begin(), ids.end());
        ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
      }
    }
    batch_rows += static_cast<int64_t>(ids.size());
  }
  std::vector<float> out(batch_ids * dim), gradient(batch_ids * dim, 0.01f);
  std::vector<bool> present;
  std::vector<double> pulls, bound_pulls, applies, bound_applies, checks;
  int64_t step = 1;
  uint32_t checksum = 0;
  for (int round = 0; round < repeats; ++round) {
    pulls.push_back(MillionsPerSecond(batch_rows, [&] {
      for (const auto& ids : batch) table.Pull(ids, absl::MakeSpan(out), &present);
    }));
    bound_pulls.push_back(MillionsPerSecond(batch_rows, [&] {
      for (const auto& ids : batch) bound.Pull(ids, out.data());
    }));
    bool applied = true;
    applies.push_back(MillionsPerSecond(batch_rows, [&] {
      for (const auto& ids : batch) {
        applied &=
            table.Apply(step++, ids, absl::MakeConstSpan(gradient.data(), ids.size() * dim)).ok();
      }
    }));
    if (!applied) return 1;
    bool accepted = true;
    checks.push_back(MillionsPerSecond(batch_rows, [&] {
      for (const auto& ids : batch) {
        const size_t floats = ids.size() * dim;
        accepted &= table.FirstUnsafeElement(
                        step, ids, absl::MakeConstSpan(gradient.data(), floats)) == floats;
      }
    }));
    if (!accepted) return 1;
    bound_applies.push_back(MillionsPerSecond(batch_rows, [&] {
      for (const auto& ids : batch) checksum ^= bound.Touch(ids, gradient.data());
    }));
  }
  std::printf(
      "%s pull %.2f M rows/s bound %.2f M rows/s apply %.2f M rows/s bound %.2f M rows/s"
      " check %.2f M rows/s (checksum %x)\n",
      name.c_str(), Median(pulls), Median(bound_pulls), Median(applies), Median(bound_applies),
      Median(checks), checksum);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: embedding_table_bench ROWS [DIM] [REPEATS] [OPTIMIZER|all]\n");
    return 2;
  }
  const int64_t rows = std::atoll(argv[1]);
  const int dim = argc > 2 ? std::atoi(argv[2]) : 16;
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 3;
  if (rows <= 0 || rows > (int64_t{1} << 31) || dim <= 0 || repeats <= 0) {
    std::fprintf(stderr, "embedding_table_bench: ROWS in [1, 2^31], DIM and REPEATS > 0\n");
    return 2;
  }
  std::vector<paramserver::EmbeddingOptimizerType> types;
  const std::string which = argc > 4 ? argv[4] : "adam";
  if (which == "all") {
    types = {paramserver::EmbeddingOptimizerType::kAdam,
             paramserver::EmbeddingOptimizerType::kAdagrad,
             paramserver::EmbeddingOptimizerType::kRowwiseAdagrad,
             paramserver::EmbeddingOptimizerType::kFtrl, paramserver::EmbeddingOptimizerType::kSgd};
  } else {
    absl::StatusOr<paramserver::EmbeddingOptimizerType> type =
        paramserver::ParseEmbeddingOptimizerType(which);
    if (!type.ok()) {
      std::fprintf(stderr, "embedding_table_bench: %s\n",
                   std::string(type.status().message()).c_str());
      return 2;
    }
    types.push_back(*type);
  }
  for (paramserver::EmbeddingOptimizerType type : types) {
    if (Measure(rows, dim, repeats, type) != 0) return 1;
  }
  return 0;
}
