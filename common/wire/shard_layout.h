// The key space, in one place: how the flattened dense parameter vector is cut into
// shards (ranges), and which shard holds each embedding row (a hash). Every server,
// worker, checkpoint and restore uses these functions and no other.
#ifndef PARAMSERVER_COMMON_WIRE_SHARD_LAYOUT_H_
#define PARAMSERVER_COMMON_WIRE_SHARD_LAYOUT_H_

#include <cstdint>
#include <vector>

namespace paramserver {

// The half-open range [begin, end) of the flattened parameter vector.
struct ParameterRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const ParameterRange& other) const {
    return begin == other.begin && end == other.end;
  }
};

// Cuts [0, total) into `shards` contiguous ranges whose sizes differ by at most one,
// the larger ones first. REQUIRES: 1 <= shards <= total.
std::vector<ParameterRange> SplitIntoShards(int64_t total, int shards);

// The range of the `rank`-th of `parts` near-equal contiguous parts of [0, total):
// [rank*total/parts, (rank+1)*total/parts). Used for the workers' data ranges.
// REQUIRES: 0 <= rank < parts.
ParameterRange ContiguousPart(int64_t total, int parts, int rank);

// The embedding shard (of `shard_count`) that holds row `id` of table `table_index`: a
// SplitMix64 hash of both, modulo the count. REQUIRES: shard_count >= 1.
int EmbeddingShardOf(int table_index, int64_t id, int shard_count);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_WIRE_SHARD_LAYOUT_H_
