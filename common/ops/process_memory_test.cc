#include "common/ops/process_memory.h"

#include <memory>
#include <string>

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

constexpr int64_t kMiB = 1 << 20;

TEST_CASE("the heap's allocated bytes follow what the program holds; resident memory too") {
  const ProcessMemory before = ReadProcessMemory();
  REQUIRE(before.allocator == "tcmalloc");  // this test links it, as the daemons do
  REQUIRE(before.heap_allocated_bytes >= 0);
  REQUIRE(before.resident_bytes > 0);
  CHECK(before.heap_free_bytes >= 0);
  CHECK(before.thread_cache_bytes >= 0);
  CHECK(before.central_cache_bytes >= 0);
  CHECK(before.unmapped_bytes >= 0);

  constexpr int64_t kHeld = 64 * kMiB;
  auto held = std::make_unique<char[]>(kHeld);
  for (int64_t i = 0; i < kHeld; i += 4096) held[i] = static_cast<char>(i);  // made resident
  const ProcessMemory holding = ReadProcessMemory();
  CHECK(holding.heap_allocated_bytes - before.heap_allocated_bytes >= kHeld);
  CHECK(holding.heap_allocated_bytes - before.heap_allocated_bytes < kHeld + 4 * kMiB);
  CHECK(holding.resident_bytes - before.resident_bytes >= kHeld - 4 * kMiB);

  held.reset();
  const ProcessMemory after = ReadProcessMemory();
  // Freed: no longer held by the program, whatever the allocator keeps of it.
  CHECK(holding.heap_allocated_bytes - after.heap_allocated_bytes >= kHeld);
}

TEST_CASE("the registry shows resident memory and the heap by state") {
  MetricsRegistry registry;
  AddProcessMemoryMetrics(&registry);
  const std::string text = registry.Render();
  CHECK(text.find("# TYPE process_resident_memory_bytes gauge") != std::string::npos);
  CHECK(text.find("# TYPE process_heap_bytes gauge") != std::string::npos);
  for (const char* state : {"allocated", "free", "thread_caches", "central_caches", "unmapped"}) {
    INFO(state);
    CHECK(text.find(std::string("process_heap_bytes{allocator=\"tcmalloc\",state=\"") + state +
                    "\"}") != std::string::npos);
  }
}

}  // namespace
}  // namespace paramserver
