// The servers' Adam against the machine's memory bandwidth, measured in the same run.
// An Adam update of n fp32 parameters reads the parameter, the gradient and both moments
// and writes the parameter and both moments: 28 bytes per parameter. The bound is the
// bandwidth of a kernel with exactly that access pattern and no arithmetic to speak of;
// memcpy's is printed beside it. Adam runs as a server runs it (vectorised; large updates
// split over every core); the bound is the faster of that kernel on one core and on all.
// Rounds are interleaved, and medians reported.
//   bazel run //bench:adam_bench [-- PARAMETERS [ROUNDS]]   (default 16777216 and 7)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "ps/dense_optimizer.h"

namespace paramserver {
namespace {

double Seconds(const std::chrono::steady_clock::time_point& start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Reads p, g, m, v and writes p, m, v, as Adam does, with trivial arithmetic the
// compiler vectorises (the arrays do not alias): the memory system's speed for this
// access pattern on one core.
__attribute__((target_clones("avx512f", "avx2", "default"))) void SameTrafficKernelOneCore(
    float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
    size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float mi = m[i] + gi;
    const float vi = v[i] + gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] - mi + vi;
  }
}

// The same kernel on every core, each on its own contiguous part.
void SameTrafficKernelAllCores(float* p, const float* g, float* m, float* v, size_t n) {
  const size_t threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> helpers;
  for (size_t k = 1; k < threads; ++k) {
    const size_t begin = n * k / threads, end = n * (k + 1) / threads;
    helpers.emplace_back(SameTrafficKernelOneCore, p + begin, g + begin, m + begin, v + begin,
                         end - begin);
  }
  SameTrafficKernelOneCore(p, g, m, v, n / threads);
  for (std::thread& helper : helpers) helper.join();
}

int Main(int argc, char** argv) {
  const size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : size_t{1} << 24;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 7;
  std::vector<float> params(n, 0.5f), gradient(n), m(n, 0.0f), v(n, 0.0f), copy(n);
  for (size_t i = 0; i < n; ++i) gradient[i] = static_cast<float>((i % 1000) - 500) * 1e-4f;
  DenseOptimizer adam(DenseOptimizerOptions{}, static_cast<int64_t>(n));
  std::vector<double> adam_seconds, one_core_seconds, all_cores_seconds, memcpy_seconds;
  for (int round = 0; round < rounds; ++round) {
    auto start = std::chrono::steady_clock::now();
    adam.Apply(gradient, absl::MakeSpan(params));
    adam_seconds.push_back(Seconds(start));
    start = std::chrono::steady_clock::now();
    SameTrafficKernelOneCore(params.data(), gradient.data(), m.data(), v.data(), n);
    one_core_seconds.push_back(Seconds(start));
    start = std::chrono::steady_clock::now();
    SameTrafficKernelAllCores(params.data(), gradient.data(), m.data(), v.data(), n);
    all_cores_seconds.push_back(Seconds(start));
    start = std::chrono::steady_clock::now();
    std::memcpy(copy.data(), gradient.data(), n * sizeof(float));
    memcpy_seconds.push_back(Seconds(start));
  }
  const double bytes = 28.0 * n;
  const double adam_rate = n / Median(adam_seconds);
  // The bound: the faster of the kernel on one core and on all (threads cost more than
  // they give on small arrays).
  const double bound_bandwidth =
      bytes / std::min(Median(one_core_seconds), Median(all_cores_seconds));
  const double memcpy_bandwidth = 2.0 * n * sizeof(float) / Median(memcpy_seconds);
  std::printf("parameters %zu, %d rounds, medians, %u threads (as a server shard applies it)\n", n,
              rounds, std::max(1u, std::thread::hardware_concurrency()));
  std::printf("adam                      %8.1f M updates/s  = %6.2f GB/s at 28 B/parameter\n",
              adam_rate / 1e6, adam_rate * 28 / 1e9);
  std::printf("same-traffic kernel       %8.2f GB/s  (the bound: %.1f M updates/s)\n",
              bound_bandwidth / 1e9, bound_bandwidth / 28 / 1e6);
  std::printf("memcpy (read + write)     %8.2f GB/s\n", memcpy_bandwidth / 1e9);
  std::printf("adam / bandwidth bound    %8.2f   (goal >= 0.8)\n",
              adam_rate * 28 / bound_bandwidth);
  std::printf("checksum %g\n",
              static_cast<double>(params[n / 2] + copy[n / 3]));  // keeps the work observable
  return 0;
}

}  // namespace
}  // namespace paramserver

int main(int argc, char** argv) { return paramserver::Main(argc, argv); }
