// The servers' dense optimizers against the machine's memory bandwidth, measured in the
// same run. An update of n fp32 parameters reads the parameter and the gradient, reads
// and writes each of the optimizer's k state slots and writes the parameter: 12 + 8k
// bytes per parameter (Adam, k = 2: 28 bytes). Each optimizer's bound is the bandwidth of
// a kernel with exactly its access pattern and no arithmetic to speak of, the faster of
// that kernel on one core and on all; memcpy's is printed beside them. Each optimizer
// runs as a server runs it (vectorised; large updates split over every core). Rounds
// are interleaved, and medians reported.
//   bazel run -c opt //bench:dense_optimizer_bench [-- PARAMETERS [ROUNDS]]
//   (default 16777216 and 7)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_figures.h"
#include "ps/dense_optimizer.h"

namespace paramserver {
namespace {

double Seconds(const std::chrono::steady_clock::time_point& start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Reads p, g and kSlots state arrays and writes p and the state, as an optimizer with
// kSlots slots does, with trivial arithmetic the compiler vectorises (the arrays do not
// alias): the memory system's speed for this access pattern on one core.
template <int kSlots>
__attribute__((target_clones("avx512f", "avx2", "default"))) void SameTrafficKernel(
    float* __restrict p, const float* __restrict g, float* __restrict s0, float* __restrict s1,
    float* __restrict s2, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i];
    float pi = p[i] + gi;
    if (kSlots > 0) {
      s0[i] = s0[i] + gi;
      pi -= s0[i];
    }
    if (kSlots > 1) {
      s1[i] = s1[i] + gi;
      pi -= s1[i];
    }
    if (kSlots > 2) {
      s2[i] = s2[i] + gi;
      pi -= s2[i];
    }
    p[i] = pi;
  }
}

using BoundKernel = void (*)(float*, const float*, float*, float*, float*, size_t);

BoundKernel SameTrafficKernelFor(size_t slots) {
  switch (slots) {
    case 0:
      return SameTrafficKernel<0>;
    case 1:
      return SameTrafficKernel<1>;
    case 2:
      return SameTrafficKernel<2>;
    default:
      return SameTrafficKernel<3>;
  }
}

// The kernel on every core, each on its own contiguous part.
void OnAllCores(BoundKernel kernel, float* p, const float* g, std::vector<std::vector<float>>& s,
                size_t n) {
  const size_t threads = std::max(1u, std::thread::hardware_concurrency());
  auto part = [&](size_t k) {
    const size_t begin = n * k / threads, end = n * (k + 1) / threads;
    kernel(p + begin, g + begin, s[0].data() + begin, s[1].data() + begin, s[2].data() + begin,
           end - begin);
  };
  std::vector<std::thread> helpers;
  for (size_t k = 1; k < threads; ++k) helpers.emplace_back(part, k);
  part(0);
  for (std::thread& helper : helpers) helper.join();
}

struct Measured {
  double rate = 0;        // updates/s
  double bound_rate = 0;  // updates/s at the bound kernel's bandwidth
  double bytes_per_update = 0;
  double check_rate = 0;  // parameters/s through FirstUnsafeElement, a push's check
};

Measured Measure(const DenseOptimizerOptions& options, size_t n, int rounds,
                 std::vector<float>& params, const std::vector<float>& gradient) {
  DenseOptimizer optimizer(options, static_cast<int64_t>(n));
  const size_t slots = optimizer.slots().size();
  std::vector<std::vector<float>> state(3, std::vector<float>(n, 0.0f));
  const BoundKernel kernel = SameTrafficKernelFor(slots);
  std::vector<double> optimizer_seconds, check_seconds, one_core_seconds, all_cores_seconds;
  size_t unsafe = 0;
  for (int round = 0; round < rounds; ++round) {
    auto start = std::chrono::steady_clock::now();
    optimizer.Apply(gradient, absl::MakeSpan(params));
    optimizer_seconds.push_back(Seconds(start));
    start = std::chrono::steady_clock::now();
    unsafe += optimizer.FirstUnsafeElement(gradient, params);
    check_seconds.push_back(Seconds(start));
    start = std::chrono::steady_clock::now();
    kernel(params.data(), gradient.data(), state[0].data(), state[1].data(), state[2].data(), n);
    one_core_seconds.push_back(Seconds(start));
    start = std::chrono::steady_clock::now();
    OnAllCores(kernel, params.data(), gradient.data(), state, n);
    all_cores_seconds.push_back(Seconds(start));
  }
  Measured m;
  m.bytes_per_update = 12.0 + 8.0 * static_cast<double>(slots);
  m.rate = n / Median(optimizer_seconds);
  m.check_rate = n / Median(check_seconds);
  if (unsafe != n * rounds) std::printf("an element out of range: %zu\n", unsafe);
  m.bound_rate = n / std::min(Median(one_core_seconds), Median(all_cores_seconds));
  return m;
}

int Main(int argc, char** argv) {
  const size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : size_t{1} << 24;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 7;
  std::vector<float> params(n, 0.5f), gradient(n), copy(n);
  for (size_t i = 0; i < n; ++i) gradient[i] = static_cast<float>((i % 1000) - 500) * 1e-4f;
  std::vector<std::pair<std::string, DenseOptimizerOptions>> optimizers;
  auto add = [&](const std::string& name, DenseOptimizerType type, auto&& set) {
    DenseOptimizerOptions options = DenseOptimizerDefaults(type);
    options.learning_rate = 1e-3;
    set(options);
    optimizers.emplace_back(name, options);
  };
  using T = DenseOptimizerType;
  add("adam", T::kAdam, [](DenseOptimizerOptions&) {});
  add("adam_amsgrad_wd", T::kAdam, [](DenseOptimizerOptions& o) {
    o.amsgrad = true;
    o.weight_decay = 0.01;
  });
  add("adamw", T::kAdamW, [](DenseOptimizerOptions&) {});
  add("sgd", T::kSgd, [](DenseOptimizerOptions&) {});
  add("sgd_momentum_nesterov_wd", T::kSgd, [](DenseOptimizerOptions& o) {
    o.momentum = 0.9;
    o.nesterov = true;
    o.weight_decay = 1e-4;
  });
  add("adagrad", T::kAdagrad, [](DenseOptimizerOptions&) {});
  add("rmsprop", T::kRmsprop, [](DenseOptimizerOptions&) {});
  add("rmsprop_centered_momentum", T::kRmsprop, [](DenseOptimizerOptions& o) {
    o.centered = true;
    o.momentum = 0.9;
  });
  std::printf("parameters %zu, %d rounds, medians, %u threads (as a server shard applies it)\n", n,
              rounds, std::max(1u, std::thread::hardware_concurrency()));
  for (const auto& [name, options] : optimizers) {
    const Measured m = Measure(options, n, rounds, params, gradient);
    std::printf(
        "%-26s %8.1f M updates/s  the bound: %8.1f M updates/s at %2.0f B/parameter  ratio %.2f  "
        "check %8.1f M/s\n",
        name.c_str(), m.rate / 1e6, m.bound_rate / 1e6, m.bytes_per_update, m.rate / m.bound_rate,
        m.check_rate / 1e6);
  }
  std::vector<double> memcpy_seconds;
  for (int round = 0; round < rounds; ++round) {
    const auto start = std::chrono::steady_clock::now();
    std::memcpy(copy.data(), gradient.data(), n * sizeof(float));
    memcpy_seconds.push_back(Seconds(start));
  }
  std::printf("memcpy (read + write)      %8.2f GB/s\n",
              2.0 * n * sizeof(float) / Median(memcpy_seconds) / 1e9);
  std::printf("checksum %g\n",
              static_cast<double>(params[n / 2] + copy[n / 3]));  // keeps the work observable
  return 0;
}

}  // namespace
}  // namespace paramserver

int main(int argc, char** argv) { return paramserver::Main(argc, argv); }
