// Proves that tests/sanitize.sh's ThreadSanitizer run can fail: two threads bump a
// counter, `guarded` under an absl::Mutex (TSan must stay quiet: the Mutex is visible to
// it through tsan_absl_mutex.cc), `unguarded` with no lock (TSan must report a race).
#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/synchronization/mutex.h"

int main(int argc, char** argv) {
  if (argc != 2 ||
      (std::strcmp(argv[1], "guarded") != 0 && std::strcmp(argv[1], "unguarded") != 0)) {
    std::fprintf(stderr, "usage: tsan_self_check guarded|unguarded\n");
    return 2;
  }
  const bool guarded = std::strcmp(argv[1], "guarded") == 0;
  absl::Mutex mu;
  long counter = 0;
  auto bump = [&] {
    for (int i = 0; i < 1000; ++i) {
      if (guarded) {
        absl::MutexLock lock(&mu);
        ++counter;
      } else {
        ++counter;
      }
    }
  };
  std::thread first(bump), second(bump);
  first.join();
  second.join();
  std::printf("%ld\n", counter);
  return 0;
}
