// The rows of an embedding shard that one pull reads or one push updates: for each
// table in order, its ids, strictly increasing, all falling to the shard
// (EmbeddingShardOf). Workers build them, servers check them before trusting them, and
// a sync step's mean over workers is computed here, in one deterministic order.
//
// On the wire (PullRequest/PushRequest `ids`, `id_counts`): the ids of every table one
// after another as packed little-endian int64, and the count of each table's ids.
#ifndef PARAMSERVER_COMMON_WIRE_SPARSE_ROWS_H_
#define PARAMSERVER_COMMON_WIRE_SPARSE_ROWS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace paramserver {

// counts[t] ids of table t, then table t + 1's, ... in `ids`.
struct RowIdsView {
  absl::Span<const int32_t> counts;
  absl::Span<const int64_t> ids;
};

struct RowIds {
  std::vector<int32_t> counts;
  std::vector<int64_t> ids;
  RowIdsView view() const { return {counts, ids}; }
};

// Where the rows of an embedding shard lie: the tables' row widths, and which hash
// bucket of how many the shard is.
struct EmbeddingShardShape {
  std::vector<int> dims;  // per table
  int bucket = 0;
  int bucket_count = 1;
};

// The most ids one shard's part of a call may carry (a batch's unique ids for one
// shard are far fewer): a peer's request is refused past it before anything is
// allocated for it.
inline constexpr int64_t kMaxIdsPerShardCall = int64_t{1} << 22;

// OK when `rows` suits `shape`: one count per table, none negative, summing to
// ids.size() <= kMaxIdsPerShardCall, each table's ids strictly increasing and every id
// on this shard. INVALID_ARGUMENT otherwise, naming the table (as C<t+1>) and the id.
absl::Status CheckRowIds(RowIdsView rows, const EmbeddingShardShape& shape);

// Row ids that passed CheckRowIds for one shard's shape. Only Check (and the sync mean
// of checked ids, MeanSparseGradients below) makes one with rows, so whoever holds one
// need not check it again: it asks CheckedFor(shape) (constant time) instead.
// Default-constructed: no rows, checked for no shard (what a dense shard's push holds).
class CheckedRowIds {
 public:
  CheckedRowIds() = default;
  CheckedRowIds(const CheckedRowIds&) = default;
  CheckedRowIds& operator=(const CheckedRowIds&) = default;
  // A moved-from one holds no rows and is checked for no shard (never a stale mark
  // over emptied ids).
  CheckedRowIds(CheckedRowIds&& other) noexcept { *this = std::move(other); }
  CheckedRowIds& operator=(CheckedRowIds&& other) noexcept {
    if (this == &other) return *this;
    rows_ = std::exchange(other.rows_, RowIds());
    tables_ = std::exchange(other.tables_, 0);
    bucket_ = std::exchange(other.bucket_, -1);
    bucket_count_ = std::exchange(other.bucket_count_, 0);
    return *this;
  }
  // CheckRowIds's error if `rows` do not suit `shape`.
  static absl::StatusOr<CheckedRowIds> Check(RowIds rows, const EmbeddingShardShape& shape);
  // Whether these were checked for `shape`'s shard (its bucket, of as many, with as
  // many tables). False for default-constructed ones.
  bool CheckedFor(const EmbeddingShardShape& shape) const {
    return tables_ > 0 && tables_ == shape.dims.size() && bucket_ == shape.bucket &&
           bucket_count_ == shape.bucket_count;
  }
  const RowIds& rows() const { return rows_; }
  RowIdsView view() const { return rows_.view(); }
  bool empty() const { return rows_.ids.empty() && rows_.counts.empty(); }
  // The rows, for whoever keeps them past the checked form (a log entry).
  RowIds TakeRows() && {
    tables_ = 0;
    bucket_ = -1;
    bucket_count_ = 0;
    return std::exchange(rows_, RowIds());
  }

 private:
  friend void MeanSparseGradients(const std::vector<const CheckedRowIds*>& ids,
                                  const std::vector<absl::Span<const float>>& gradients,
                                  const EmbeddingShardShape& shape, int divisor,
                                  CheckedRowIds* mean_ids, std::vector<float>* mean);
  void MarkCheckedFor(const EmbeddingShardShape& shape);

  RowIds rows_;
  size_t tables_ = 0;
  int bucket_ = -1;
  int bucket_count_ = 0;
};

// The floats of the rows of `rows`: sum of counts[t] * dims[t]. REQUIRES: counts fit dims.
int64_t RowFloats(RowIdsView rows, absl::Span<const int> dims);

// The mean of several workers' sparse gradients: every table's ids are the union of
// theirs (ascending), and each row is the sum of the workers' rows for that id, added
// in the order given (a worker without the id adds nothing), times 1 / divisor.
// REQUIRES: ids[i] and gradients[i] fit `dims` (CheckRowIds, RowFloats).
void MeanSparseGradients(const std::vector<const RowIds*>& ids,
                         const std::vector<const std::vector<float>*>& gradients,
                         absl::Span<const int> dims, int divisor, RowIds* mean_ids,
                         std::vector<float>* mean);

// The same over ids checked for `shape`'s shard: the mean's ids, a union of theirs, are
// checked for it too. REQUIRES: every ids[i] CheckedFor(shape), gradients[i] of its rows.
void MeanSparseGradients(const std::vector<const CheckedRowIds*>& ids,
                         const std::vector<absl::Span<const float>>& gradients,
                         const EmbeddingShardShape& shape, int divisor, CheckedRowIds* mean_ids,
                         std::vector<float>* mean);

// The wire form of ids: packed little-endian int64. Decoding checks the size is a
// multiple of 8 and at most kMaxIdsPerShardCall ids (INVALID_ARGUMENT otherwise).
// DecodeIds's bound on the count is `max_ids`.
std::string EncodeIds(absl::Span<const int64_t> ids);
// Appends ids to *out in that wire form.
void AppendIds(absl::Span<const int64_t> ids, std::string* out);
absl::StatusOr<std::vector<int64_t>> DecodeIds(absl::string_view bytes,
                                               int64_t max_ids = kMaxIdsPerShardCall);

// The ids of a request from its wire fields, checked against `shape` (DecodeIds's and
// CheckRowIds's errors).
absl::StatusOr<RowIds> RowIdsFromWire(absl::string_view ids, absl::Span<const int32_t> counts,
                                      const EmbeddingShardShape& shape);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_WIRE_SPARSE_ROWS_H_
