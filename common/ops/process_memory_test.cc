#include "common/ops/process_memory.h"

#include <memory>
#include <string>

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

constexpr int64_t kMiB = 1 << 20;

// A sanitizer's runtime serves malloc in place of tcmalloc (tests/sanitize.sh).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

}  // namespace
}  // namespace paramserver

// LeakSanitizer (tests/sanitize.sh): tcmalloc, linked here as the daemons link it but
// not serving malloc under the sanitizer, keeps the 8 bytes of its MallocExtension for
// the life of the process.
extern "C" const char* __lsan_default_suppressions() { return "leak:libtcmalloc_minimal\n"; }

namespace paramserver {
namespace {

TEST_CASE("under a sanitizer, tcmalloc is not taken for the allocator though it is linked") {
  if (kSanitized) CHECK(ReadProcessMemory().allocator == "glibc");
}

TEST_CASE("the heap's allocated bytes follow what the program holds; resident memory too") {
  if (kSanitized) return;  // neither allocator's figures count the sanitizer's heap
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
  if (kSanitized) return;
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
