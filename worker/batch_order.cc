#include "worker/batch_order.h"

#include <algorithm>
#include <numeric>

namespace paramserver {
namespace {

// SplitMix64: a small, well-mixed generator whose output is the same everywhere.
uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

std::vector<int64_t> EpochExampleOrder(ParameterRange range, int epoch, uint64_t seed,
                                       bool shuffle) {
  std::vector<int64_t> order(range.size());
  std::iota(order.begin(), order.end(), range.begin);
  if (!shuffle) return order;
  uint64_t state = seed;
  state = SplitMix64(&state) ^ static_cast<uint64_t>(epoch);
  state = SplitMix64(&state) ^ static_cast<uint64_t>(range.begin);
  for (int64_t i = static_cast<int64_t>(order.size()) - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(SplitMix64(&state) % static_cast<uint64_t>(i + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

int64_t StepsPerEpoch(int64_t example_count, int num_workers, int batch_size) {
  int64_t fewest = example_count;
  for (int r = 0; r < num_workers; ++r) {
    fewest = std::min(fewest, ContiguousPart(example_count, num_workers, r).size());
  }
  return fewest / batch_size;
}

}  // namespace paramserver
