#include "common/wire/shard_layout.h"

#include <cstdlib>

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

TEST_CASE("shards cover the vector contiguously with sizes differing by at most one") {
  for (int64_t total : {1, 7, 8, 101770}) {
    for (int shards : {1, 3, 8}) {
      if (shards > total) continue;
      std::vector<ParameterRange> ranges = SplitIntoShards(total, shards);
      REQUIRE(ranges.size() == static_cast<size_t>(shards));
      CHECK(ranges.front().begin == 0);
      CHECK(ranges.back().end == total);
      int64_t smallest = total, largest = 0;
      for (size_t i = 0; i < ranges.size(); ++i) {
        if (i > 0) CHECK(ranges[i].begin == ranges[i - 1].end);
        smallest = std::min(smallest, ranges[i].size());
        largest = std::max(largest, ranges[i].size());
      }
      CHECK(largest - smallest <= 1);
    }
  }
  CHECK(SplitIntoShards(10, 4) == std::vector<ParameterRange>{{0, 3}, {3, 6}, {6, 8}, {8, 10}});
}

TEST_CASE("worker data ranges are [r*n/W, (r+1)*n/W)") {
  CHECK(ContiguousPart(60000, 2, 0) == ParameterRange{0, 30000});
  CHECK(ContiguousPart(60000, 2, 1) == ParameterRange{30000, 60000});
  CHECK(ContiguousPart(10, 3, 0) == ParameterRange{0, 3});
  CHECK(ContiguousPart(10, 3, 1) == ParameterRange{3, 6});
  CHECK(ContiguousPart(10, 3, 2) == ParameterRange{6, 10});
}

TEST_CASE("rows are spread over shards by a hash of (table, id)") {
  std::vector<int> counts(4, 0);
  for (int64_t id = 0; id < 40000; ++id) ++counts[EmbeddingShardOf(1, id, 4)];
  for (int count : counts) CHECK(std::abs(count - 10000) < 400);
  // The table takes part: the same id lands elsewhere in another table, sometimes.
  int differ = 0;
  for (int64_t id = 0; id < 100; ++id)
    differ += EmbeddingShardOf(1, id, 4) != EmbeddingShardOf(2, id, 4);
  CHECK(differ > 50);
}

}  // namespace
}  // namespace paramserver
