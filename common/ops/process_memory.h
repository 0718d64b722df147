// A process's memory as the kernel and its allocator see it, to tell a leak from an
// allocator keeping freed memory for reuse: a leak grows the bytes the program holds
// (heap_allocated_bytes); caching grows the allocator's free bytes while those stay flat.
// The daemons link tcmalloc (gperftools' tcmalloc_minimal), whose thread caches alone may
// hold up to 32 MB by default, spread over the threads that free memory; without it,
// glibc's malloc is read instead (also where a sanitizer's runtime serves malloc, whose
// heap neither reports).
#ifndef PARAMSERVER_COMMON_OPS_PROCESS_MEMORY_H_
#define PARAMSERVER_COMMON_OPS_PROCESS_MEMORY_H_

#include <cstdint>
#include <string>

#include "common/ops/metrics.h"

namespace paramserver {

// -1 where a figure cannot be read.
struct ProcessMemory {
  int64_t resident_bytes = -1;  // VmRSS, /proc/self/status
  // "tcmalloc" or "glibc": whose figures the rest are.
  std::string allocator;
  int64_t heap_allocated_bytes = -1;  // held by the program: malloc'd and not yet freed
  // Free, still mapped, in the allocator's page heap (tcmalloc) or arenas (glibc).
  int64_t heap_free_bytes = -1;
  // tcmalloc only: free in its per-thread caches, and in its central and transfer caches.
  int64_t thread_cache_bytes = -1;
  int64_t central_cache_bytes = -1;
  int64_t unmapped_bytes = -1;  // tcmalloc only: released to the kernel, still reserved
};

// Reads the figures now; safe from any thread. Cheap with tcmalloc (counters it keeps);
// glibc's mallinfo2 walks each arena's free lists.
ProcessMemory ReadProcessMemory();

// Registers, read at each scrape:
//   process_resident_memory_bytes  (Prometheus' own name for it)
//   process_heap_bytes{state="allocated"|"free"|"thread_caches"|"central_caches"|"unmapped"}
// the states that can be read (ProcessMemory's fields, -1 ones left out).
void AddProcessMemoryMetrics(MetricsRegistry* registry);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_OPS_PROCESS_MEMORY_H_
