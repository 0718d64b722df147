// What the benchmarks share: a median of rounds, a rate, and leaving on an error.
#ifndef PARAMSERVER_BENCH_BENCH_FIGURES_H_
#define PARAMSERVER_BENCH_BENCH_FIGURES_H_

#include <errno.h>  // program_invocation_short_name (glibc)

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "absl/status/status.h"

namespace paramserver {

// The middle value of a round's figures (the upper one of an even count). REQUIRES: some.
inline double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Millions of `items` a second that `work` gets through.
template <typename Work>
double MillionsPerSecond(int64_t items, const Work& work) {
  const auto start = std::chrono::steady_clock::now();
  work();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(items) / seconds / 1e6;
}

// Leaves the benchmark (exit 1) with "PROGRAM: WHAT: STATUS" unless `status` is OK.
inline void CheckOrExit(const absl::Status& status, const char* what) {
  if (status.ok()) return;
  std::fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, what,
               status.ToString().c_str());
  std::exit(1);
}

}  // namespace paramserver

#endif  // PARAMSERVER_BENCH_BENCH_FIGURES_H_
