#include "ps/adam_optimizer.h"

#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

#include "absl/base/config.h"
#include "common/ops/cpu_features.h"
#include "ps/optimizer_state_limit.h"

namespace paramserver {

AdamOptimizer::AdamOptimizer(AdamOptions options, int64_t size)
    : options_(options), m_(size, 0.0f), v_(size, 0.0f) {}

AdamOptimizer::AdamOptimizer(AdamOptions options, int64_t step, std::vector<float> first_moment,
                             std::vector<float> second_moment)
    : options_(options), step_(step), m_(std::move(first_moment)), v_(std::move(second_moment)) {}

namespace {

struct AdamScalars {
  float step_size, bias_correction2_sqrt, one_minus_beta1, beta2, one_minus_beta2, epsilon;
};

// The element-wise update. The arrays never alias, which lets the compiler vectorise;
// sqrt and division are correctly rounded in every instruction set and the build forbids
// contracting a*b+c into an FMA (-ffp-contract=off), so every instruction set below
// computes the same bits as the scalar loop.
inline __attribute__((always_inline)) void AdamLoop(const AdamScalars& s, const float* __restrict g,
                                                    float* __restrict m, float* __restrict v,
                                                    float* __restrict p, size_t n) {
  const float step_size = s.step_size, bias_correction2_sqrt = s.bias_correction2_sqrt;
  const float one_minus_beta1 = s.one_minus_beta1, beta2 = s.beta2,
              one_minus_beta2 = s.one_minus_beta2;
  const float epsilon = s.epsilon;
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float mi = m[i] + one_minus_beta1 * (gi - m[i]);
    const float vi = v[i] * beta2 + one_minus_beta2 * gi * gi;
    const float denom = std::sqrt(vi) / bias_correction2_sqrt + epsilon;
    m[i] = mi;
    v[i] = vi;
    p[i] -= step_size * (mi / denom);
  }
}

using AdamKernel = void (*)(const AdamScalars&, const float*, float*, float*, float*, size_t);

// The loop compiled for each instruction set; picked per call by UsableCpuFeatures(), so
// PS_CPU_BASELINE=1 runs the baseline one on any CPU.
#if defined(__x86_64__)
__attribute__((target("avx512f"))) void AdamAvx512(const AdamScalars& s, const float* g, float* m,
                                                   float* v, float* p, size_t n) {
  AdamLoop(s, g, m, v, p, n);
}
__attribute__((target("avx2"))) void AdamAvx2(const AdamScalars& s, const float* g, float* m,
                                              float* v, float* p, size_t n) {
  AdamLoop(s, g, m, v, p, n);
}
#endif
void AdamBaseline(const AdamScalars& s, const float* g, float* m, float* v, float* p, size_t n) {
  AdamLoop(s, g, m, v, p, n);
}

AdamKernel PickAdamKernel() {
#if defined(__x86_64__)
  const CpuFeatures cpu = UsableCpuFeatures();
  if (cpu.avx512f) return AdamAvx512;
  if (cpu.avx2) return AdamAvx2;
#endif
  return AdamBaseline;
}

// Below this many parameters one thread is faster than starting others.
constexpr size_t kParallelThreshold = size_t{1} << 18;
// Each extra thread gets at least this many.
constexpr size_t kMinimumPerThread = size_t{1} << 16;

}  // namespace

size_t AdamOptimizer::FirstUnsafeElement(absl::Span<const float> gradient) const {
  // The moments' scalars as Apply computes them, and AdamLoop's arithmetic.
  const float one_minus_beta1 = static_cast<float>(1.0 - options_.beta1);
  const float beta2 = static_cast<float>(options_.beta2);
  const float one_minus_beta2 = static_cast<float>(1.0 - options_.beta2);
  const auto unsafe = [&](size_t i) {
    const float gi = gradient[i];
    const float mi = m_[i] + one_minus_beta1 * (gi - m_[i]);
    const float vi = v_[i] * beta2 + one_minus_beta2 * gi * gi;
    return !StateValueAccepted(gi * gi) | !StateValueAccepted(mi) | !StateValueAccepted(vi);
  };
  // Without an early exit the loop vectorises: the common case (nothing unsafe) reads
  // the gradient and the moments once, at memory speed.
  const size_t n = gradient.size();
  bool any = false;
  for (size_t i = 0; i < n; ++i) any |= unsafe(i);
  if (!any) return n;
  for (size_t i = 0; i < n; ++i) {
    if (unsafe(i)) return i;
  }
  return n;
}

void AdamOptimizer::Apply(absl::Span<const float> gradient, absl::Span<float> params) {
  ++step_;
  // Scalars in double, element-wise work in float, in the order PyTorch's single-tensor
  // Adam uses: exp_avg.lerp_(grad, 1-b1); exp_avg_sq.mul_(b2).addcmul_(grad, grad, 1-b2);
  // denom = exp_avg_sq.sqrt() / sqrt(bc2) + eps; param.addcdiv_(exp_avg, denom, -lr/bc1).
  const double t = static_cast<double>(step_);
  const double bias_correction1 = 1.0 - std::pow(options_.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(options_.beta2, t);
  const AdamScalars scalars{static_cast<float>(options_.learning_rate / bias_correction1),
                            static_cast<float>(std::sqrt(bias_correction2)),
                            static_cast<float>(1.0 - options_.beta1),
                            static_cast<float>(options_.beta2),
                            static_cast<float>(1.0 - options_.beta2),
                            static_cast<float>(options_.epsilon)};
  const size_t n = params.size();
  size_t threads = 1;
  if (n >= kParallelThreshold) {
    threads =
        std::min<size_t>(std::max(1u, std::thread::hardware_concurrency()), n / kMinimumPerThread);
  }
  const AdamKernel kernel = PickAdamKernel();
  auto run = [&](size_t begin, size_t end) {
    kernel(scalars, gradient.data() + begin, m_.data() + begin, v_.data() + begin,
           params.data() + begin, end - begin);
  };
  if (threads <= 1) {
    run(0, n);
    return;
  }
  // Chunks are multiples of 64 parameters so that no two threads share a cache line.
  std::vector<std::thread> helpers;
  helpers.reserve(threads - 1);
  auto boundary = [&](size_t k) { return std::min(n, (n * k / threads) & ~size_t{63}); };
  for (size_t k = 1; k < threads; ++k)
    helpers.emplace_back(run, boundary(k), k + 1 == threads ? n : boundary(k + 1));
  run(0, boundary(1));
  for (std::thread& helper : helpers) helper.join();
}

}  // namespace paramserver
