#include "common/ops/process_memory.h"

#include <dlfcn.h>
#include <malloc.h>

#include <cstddef>
#include <fstream>
#include <utility>
#include <vector>

namespace paramserver {
namespace {

// gperftools' C interface (gperftools/malloc_extension_c.h), looked up in the running
// process: present only where tcmalloc is linked, so that this library need not link it.
using GetNumericProperty = int (*)(const char* property, size_t* value);

// Null unless tcmalloc is linked and serves malloc: a sanitizer's runtime takes malloc
// over although the library is loaded, and its figures would then count nothing.
GetNumericProperty TcmallocProperty() {
  static const GetNumericProperty property = []() -> GetNumericProperty {
    void* const tcmalloc_malloc = dlsym(RTLD_DEFAULT, "tc_malloc");
    if (tcmalloc_malloc == nullptr || dlsym(RTLD_DEFAULT, "malloc") != tcmalloc_malloc) {
      return nullptr;
    }
    return reinterpret_cast<GetNumericProperty>(
        dlsym(RTLD_DEFAULT, "MallocExtension_GetNumericProperty"));
  }();
  return property;
}

int64_t ReadTcmalloc(GetNumericProperty property, const char* name) {
  size_t value = 0;
  return property(name, &value) ? static_cast<int64_t>(value) : -1;
}

int64_t ResidentBytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmRSS:") {
      int64_t kilobytes = -1;
      status >> kilobytes;
      return kilobytes < 0 ? -1 : kilobytes * 1024;
    }
    status.ignore(1 << 12, '\n');
  }
  return -1;
}

}  // namespace

ProcessMemory ReadProcessMemory() {
  ProcessMemory memory;
  memory.resident_bytes = ResidentBytes();
  if (const GetNumericProperty property = TcmallocProperty(); property != nullptr) {
    memory.allocator = "tcmalloc";
    memory.heap_allocated_bytes = ReadTcmalloc(property, "generic.current_allocated_bytes");
    memory.heap_free_bytes = ReadTcmalloc(property, "tcmalloc.pageheap_free_bytes");
    memory.thread_cache_bytes = ReadTcmalloc(property, "tcmalloc.current_total_thread_cache_bytes");
    const int64_t central = ReadTcmalloc(property, "tcmalloc.central_cache_free_bytes");
    const int64_t transfer = ReadTcmalloc(property, "tcmalloc.transfer_cache_free_bytes");
    memory.central_cache_bytes = central < 0 || transfer < 0 ? -1 : central + transfer;
    memory.unmapped_bytes = ReadTcmalloc(property, "tcmalloc.pageheap_unmapped_bytes");
    return memory;
  }
  memory.allocator = "glibc";
  const struct mallinfo2 info = mallinfo2();
  // uordblks: in use in the arenas; hblkhd: in use in blocks mmap'ed one each.
  memory.heap_allocated_bytes = static_cast<int64_t>(info.uordblks + info.hblkhd);
  memory.heap_free_bytes = static_cast<int64_t>(info.fordblks);
  return memory;
}

void AddProcessMemoryMetrics(MetricsRegistry* registry) {
  registry->AddScrapedFamilies([] {
    const ProcessMemory memory = ReadProcessMemory();
    std::vector<ScrapedFamily> families;
    if (memory.resident_bytes >= 0) {
      families.push_back({"process_resident_memory_bytes",
                          "Resident memory of the process (VmRSS), bytes.",
                          false,
                          {{{}, static_cast<double>(memory.resident_bytes)}}});
    }
    ScrapedFamily heap{"process_heap_bytes",
                       "The allocator's (label allocator) bytes by state: allocated (held by the "
                       "program), free (mapped, in its page heap or arenas), thread_caches and "
                       "central_caches (free, kept for reuse), unmapped (released to the kernel).",
                       false,
                       {}};
    for (const auto& [state, bytes] : std::vector<std::pair<const char*, int64_t>>{
             {"allocated", memory.heap_allocated_bytes},
             {"free", memory.heap_free_bytes},
             {"thread_caches", memory.thread_cache_bytes},
             {"central_caches", memory.central_cache_bytes},
             {"unmapped", memory.unmapped_bytes}}) {
      if (bytes < 0) continue;
      heap.samples.push_back(
          {{{"allocator", memory.allocator}, {"state", state}}, static_cast<double>(bytes)});
    }
    if (!heap.samples.empty()) families.push_back(std::move(heap));
    return families;
  });
}

}  // namespace paramserver
