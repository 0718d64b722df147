// Where a shard's parameters live and how one update changes them: a dense range
// (ps/dense_storage.h) or an embedding shard's rows of every table
// (ps/embedding_storage.h), behind one interface. The storage knows nothing of workers,
// the consistency rule or the log: its shard decides when an update applies, and with
// which gradient, and calls it under its lock.
#ifndef PARAMSERVER_PS_SHARD_STORAGE_H_
#define PARAMSERVER_PS_SHARD_STORAGE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/checkpoint/shard_checkpoint.h"
#include "common/model/step_optimizer.h"
#include "common/wire/sparse_rows.h"
#include "common/wire/tensor_codec.h"

namespace paramserver {

// Thread-compatible. `rows` arguments are an embedding shard's (CheckedFor its shape)
// and empty for a dense range; a gradient holds their rows, table after table.
// The order of an embedding shard's rows in a saved state (ShardStorage::Save).
enum class RowOrder {
  // As the table stores them, no order to rely on, copied fastest: a checkpoint's,
  // which its writer puts in id order (SortRowsById) after the shard's lock is let go.
  kAsStored,
  // As stored, with the links that give the order least recently updated first
  // (EmbeddingShardState::next_more_recent): a replica's copy under the shard's lock,
  // which OrderRowsByRecency puts in order later, without the lock (a new backup does).
  kAsStoredWithRecency,
};

class ShardStorage {
 public:
  virtual ~ShardStorage() = default;

  // OK when `gradient` fits: a dense range's size and no ids; an embedding shard's ids,
  // checked for it, and their rows' floats. INVALID_ARGUMENT naming what does not.
  virtual absl::Status CheckGradientShape(const CheckedRowIds& rows,
                                          absl::Span<const float> gradient) const = 0;
  // The first element of a fitting `gradient` that update number `step`, applied now,
  // would let take the optimizer's state out of the accepted range
  // (ps/optimizer_state_limit.h), or gradient.size() if none would. Changes no value or
  // state (an embedding shard keeps the initial values it drew, which the next Apply
  // takes: hence not const). `settings`: a script's hyperparameters for that update (a
  // dense range's, accepted by PrepareFor; empty: the spec's).
  virtual size_t FirstUnsafeElement(int64_t step, RowIdsView rows,
                                    const StepHyperparameters& settings,
                                    absl::Span<const float> gradient) = 0;
  // Where element `i` of a fitting gradient lies, for an error message: "" for a dense
  // range, " (table C2, id 7, element 3)" for an embedding shard.
  virtual std::string DescribeElement(RowIdsView rows, size_t i) const = 0;
  // Applies update number `step` (one more than the last) with a fitting `gradient`.
  // INTERNAL when a table refuses it: the storage may then hold part of the update, and
  // its shard must not go on as if it had applied.
  virtual absl::Status Apply(int64_t step, RowIdsView rows, const StepHyperparameters& settings,
                             absl::Span<const float> gradient) = 0;
  // OK if updates may run with a script's `settings` (DenseUpdateRule::PrepareFor); an
  // embedding shard refuses any (INVALID_ARGUMENT): its tables train with
  // training.embedding_optimizer.
  virtual absl::Status PrepareFor(const StepHyperparameters& settings) = 0;
  // The mean of several workers' fitting gradients, summed in the order given, times
  // 1 / gradients.size(); *mean_rows gets the ids it covers (an embedding shard's: the
  // union of theirs). REQUIRES: at least one gradient.
  virtual void Mean(const std::vector<const CheckedRowIds*>& rows,
                    const std::vector<absl::Span<const float>>& gradients, CheckedRowIds* mean_rows,
                    std::vector<float>* mean) const = 0;
  // Appends the values a pull of `rows` reads (a dense range's all) in `encoding`.
  virtual void AppendValues(RowIdsView rows, WireDtype encoding, std::string* bytes) const = 0;
  // Writes the values and the optimizer's state into *state, as of update `step`: a
  // dense range's values and moments; an embedding shard's tables, their rows in `order`.
  virtual void Save(int64_t step, RowOrder order, ShardState* state) const = 0;
};

}  // namespace paramserver

#endif  // PARAMSERVER_PS_SHARD_STORAGE_H_
