// An embedding shard's rows: hash bucket shape.bucket (of shape.bucket_count) of every
// table, each row with its optimizer's state (ps/embedding_table.h).
#ifndef PARAMSERVER_PS_EMBEDDING_STORAGE_H_
#define PARAMSERVER_PS_EMBEDDING_STORAGE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/checkpoint/embedding_checkpoint.h"
#include "ps/embedding_table.h"
#include "ps/shard_storage.h"

namespace paramserver {

struct EmbeddingShardOptions {
  EmbeddingShardShape shape;
  std::vector<EmbeddingTableOptions> tables;  // per table, in order; dims as in shape
};

// An embedding shard's tables, summed.
struct EmbeddingCounters {
  int64_t rows = 0;
  int64_t evicted_rows = 0;
  int64_t dropped_gradients = 0;  // for ids short of min_count
  int64_t pending_ids = 0;        // ids short of min_count
  double bytes = 0;               // held for the rows
  int64_t minimum_bytes = 0;      // what the rows need at least
};

// Per table, the ids seen fewer than min_count times, with their sightings.
using TableSightings = std::vector<std::vector<std::pair<int64_t, int32_t>>>;

// Thread-compatible, as ShardStorage.
class EmbeddingStorage final : public ShardStorage {
 public:
  // No rows yet. REQUIRES: options not null.
  EmbeddingStorage(int shard_id, std::shared_ptr<const EmbeddingShardOptions> options);

  // OK when `tables` fit an embedding shard of `options` (one per table, in order, of its
  // dim and optimizer state, sizes consistent); INVALID_ARGUMENT naming what does not.
  static absl::Status CheckTablesFit(int shard_id, const EmbeddingShardOptions& options,
                                     const std::vector<EmbeddingShardState>& tables);
  // Puts `tables`' rows in, in the order given (which becomes their recency order).
  // CheckTablesFit's error if they do not fit (nothing restored then).
  absl::Status Restore(const std::vector<EmbeddingShardState>& tables);
  // The ids short of min_count, per table, and restoring them.
  TableSightings Sightings() const;
  void RestoreSightings(const TableSightings& sightings);

  absl::Status CheckGradientShape(const CheckedRowIds& rows,
                                  absl::Span<const float> gradient) const override;
  size_t FirstUnsafeElement(int64_t step, RowIdsView rows, const StepHyperparameters& settings,
                            absl::Span<const float> gradient) override;
  std::string DescribeElement(RowIdsView rows, size_t i) const override;
  absl::Status Apply(int64_t step, RowIdsView rows, const StepHyperparameters& settings,
                     absl::Span<const float> gradient) override;
  absl::Status PrepareFor(const StepHyperparameters& settings) override;
  // Each id's row gradients summed in the order given and divided by their number of
  // workers (a worker without the id adds zero), as one process's mean loss over all of
  // their batches together gives.
  void Mean(const std::vector<const CheckedRowIds*>& rows,
            const std::vector<absl::Span<const float>>& gradients, CheckedRowIds* mean_rows,
            std::vector<float>* mean) const override;
  // The rows as the tables read them: a row not made yet reads as its initial value, an
  // id short of min_count as zeros.
  void AppendValues(RowIdsView rows, WireDtype encoding, std::string* bytes) const override;
  void Save(int64_t step, RowOrder order, ShardState* state) const override;
  // A delta checkpoint at `step` of the one at `previous_step` (< step): per table, the
  // rows changed since ClearChanges, in no order (its writer sorts them: SortRowsById),
  // and the ids evicted since, ascending (EmbeddingShardState::previous_step,
  // removed_ids).
  void SaveChanges(int64_t step, int64_t previous_step, ShardState* state) const;
  // Starts counting changes afresh (after a checkpoint's snapshot).
  void ClearChanges();
  // Whether every table kept all its changes since ClearChanges (a table drops its
  // evicted ids past a bound: then only a full checkpoint is right).
  bool ChangesComplete() const;

  // An export of table `table`, in two parts. AppendRowIds appends the ids of its rows
  // after `after_id` (all with from_start) in the order they are stored (a sequential
  // read; the caller sorts them). CopyHeldRows then reads the rows of a page of them
  // (EmbeddingTable::CopyHeldRows: ids without a row now are skipped). Both refuse a
  // table the model lacks (INVALID_ARGUMENT), as CheckTableIndex does.
  absl::Status CheckTableIndex(int table) const;
  absl::Status AppendRowIds(int table, bool from_start, int64_t after_id,
                            std::vector<int64_t>* ids) const;
  absl::Status CopyHeldRows(int table, absl::Span<const int64_t> ids,
                            std::vector<int64_t>* held_ids, std::vector<float>* rows) const;
  EmbeddingCounters counters() const;
  const EmbeddingShardShape& shape() const { return options_->shape; }

 private:
  // Save's work: every row (previous_step < 0) or the changed ones.
  void SaveRows(int64_t step, RowOrder order, int64_t previous_step, ShardState* state) const;

  const int shard_id_;
  const std::shared_ptr<const EmbeddingShardOptions> options_;
  std::vector<EmbeddingTable> tables_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_PS_EMBEDDING_STORAGE_H_
