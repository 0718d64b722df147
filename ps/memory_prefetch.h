// Asking for memory ahead of its use: a loop over rows scattered across a large table
// names the rows it will reach a few iterations later, so that their cache misses
// overlap instead of stalling one at a time. Hints only: they change no result.
#ifndef PARAMSERVER_PS_MEMORY_PREFETCH_H_
#define PARAMSERVER_PS_MEMORY_PREFETCH_H_

#include <cstddef>

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

}  // namespace paramserver

#endif  // PARAMSERVER_PS_MEMORY_PREFETCH_H_
