// The rows of an embedding shard that one pull reads or one push updates: for each
// table in order, its ids, strictly increasing, all falling to the shard
// (EmbeddingShardOf). Workers build them, servers check them before trusting them, and
// a sync step's mean over workers is computed here, in one deterministic order.
//
// On the wire (PullRequest/PushRequest `ids`, `id_counts`): the ids of every table one
// after another as packed little-endian int64, and the count of each table's ids.
#ifndef PARAMSERVER_COMMON_SPARSE_ROWS_H_
#define PARAMSERVER_COMMON_SPARSE_ROWS_H_

#include <cstdint>
#include <string>
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

// The wire form of ids: packed little-endian int64. Decoding checks the size is a
// multiple of 8 and at most kMaxIdsPerShardCall ids (INVALID_ARGUMENT otherwise).
// DecodeIds's bound on the count is `max_ids`.
std::string EncodeIds(absl::Span<const int64_t> ids);
absl::StatusOr<std::vector<int64_t>> DecodeIds(absl::string_view bytes,
                                               int64_t max_ids = kMaxIdsPerShardCall);

// The ids of a request from its wire fields, checked against `shape` (DecodeIds's and
// CheckRowIds's errors).
absl::StatusOr<RowIds> RowIdsFromWire(absl::string_view ids, absl::Span<const int32_t> counts,
                                      const EmbeddingShardShape& shape);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_SPARSE_ROWS_H_
