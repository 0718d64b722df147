// Asking for memory ahead of its use: a loop over rows scattered across a large table
// names the rows it will reach a few iterations later, so that their cache misses
// overlap instead of stalling one at a time. Hints only: they change no result.
#ifndef PARAMSERVER_PS_MEMORY_PREFETCH_H_
#define PARAMSERVER_PS_MEMORY_PREFETCH_H_

#include <algorithm>
#include <array>
#include <cstddef>

#include "absl/types/span.h"

namespace paramserver {

// How many rows ahead of their use the row loops ask for them: enough to cover a DRAM
// access at a few tens of nanoseconds per row, few enough to stay in L1.
inline constexpr size_t kRowsAhead = 8;

// Every cache line of the `bytes` (> 0) at `at`, for reading or for writing.
inline void PrefetchForRead(const void* at, size_t bytes) {
  const char* begin = static_cast<const char*>(at);
  for (size_t line = 0; line < bytes; line += 64) __builtin_prefetch(begin + line, 0, 3);
  __builtin_prefetch(begin + bytes - 1, 0, 3);  // the last line, when `at` is not aligned
}
inline void PrefetchForWrite(const void* at, size_t bytes) {
  const char* begin = static_cast<const char*>(at);
  for (size_t line = 0; line < bytes; line += 64) __builtin_prefetch(begin + line, 1, 3);
  __builtin_prefetch(begin + bytes - 1, 1, 3);
}

// Looks each of `keys` up in `map` (an absl hash map) in order and calls
// visit(i, value), value the key's mapped value or `missing` where the map lacks it,
// until visit returns false. Three stages, kRowsAhead keys apart: a key's bucket is
// asked of memory (the map's prefetch), then the key is looked up and
// prefetch_value(value) asks for what its value leads to (a row), then it is visited;
// so each access finds its line on the way instead of waiting for it.
template <typename Map, typename PrefetchValue, typename Visit>
void LookUpAhead(const Map& map, absl::Span<const typename Map::key_type> keys,
                 typename Map::mapped_type missing, const PrefetchValue& prefetch_value,
                 const Visit& visit) {
  std::array<typename Map::mapped_type, kRowsAhead> ahead;  // by key index % kRowsAhead
  const auto look_up = [&](size_t i) {
    auto found = map.find(keys[i]);
    if (found == map.end()) {
      ahead[i % kRowsAhead] = missing;
      return;
    }
    ahead[i % kRowsAhead] = found->second;
    prefetch_value(found->second);
  };
  const size_t count = keys.size();
  for (size_t i = 0; i < std::min(count, 2 * kRowsAhead); ++i) map.prefetch(keys[i]);
  for (size_t i = 0; i < std::min(count, kRowsAhead); ++i) look_up(i);
  for (size_t i = 0; i < count; ++i) {
    const typename Map::mapped_type value = ahead[i % kRowsAhead];
    if (i + 2 * kRowsAhead < count) map.prefetch(keys[i + 2 * kRowsAhead]);
    if (i + kRowsAhead < count) look_up(i + kRowsAhead);
    if (!visit(i, value)) return;
  }
}

}  // namespace paramserver

#endif  // PARAMSERVER_PS_MEMORY_PREFETCH_H_
