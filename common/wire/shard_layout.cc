#include "common/wire/shard_layout.h"

#include "common/base/deterministic_random.h"

namespace paramserver {

std::vector<ParameterRange> SplitIntoShards(int64_t total, int shards) {
  std::vector<ParameterRange> ranges;
  ranges.reserve(shards);
  const int64_t base = total / shards;
  const int64_t larger = total % shards;
  int64_t begin = 0;
  for (int i = 0; i < shards; ++i) {
    const int64_t size = base + (i < larger ? 1 : 0);
    ranges.push_back({begin, begin + size});
    begin += size;
  }
  return ranges;
}

ParameterRange ContiguousPart(int64_t total, int parts, int rank) {
  return {rank * total / parts, (rank + 1) * total / parts};
}

int EmbeddingShardOf(int table_index, int64_t id, int shard_count) {
  const uint64_t hash =
      SplitMix64(SplitMix64(static_cast<uint64_t>(table_index)) ^ static_cast<uint64_t>(id));
  return static_cast<int>(hash % static_cast<uint64_t>(shard_count));
}

}  // namespace paramserver
