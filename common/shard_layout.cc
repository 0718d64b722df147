#include "common/shard_layout.h"

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

}  // namespace paramserver
