#include "ps/dense_optimizer.h"

#include <algorithm>
#include <cmath>
#include <thread>
#include <utility>
#include <vector>

#include "common/ops/cpu_features.h"
#include "ps/learning_rate_schedule.h"
#include "ps/optimizer_state_limit.h"

namespace paramserver {

DenseOptimizer::DenseOptimizer(DenseOptimizerOptions options, int64_t size) : options_(options) {
  const float initial = options.type == DenseOptimizerType::kAdagrad
                            ? static_cast<float>(options.initial_accumulator_value)
                            : 0.0f;
  slots_.assign(DenseOptimizerSlotNames(options).size(),
                std::vector<float>(static_cast<size_t>(size), initial));
}

DenseOptimizer::DenseOptimizer(DenseOptimizerOptions options, int64_t step,
                               std::vector<std::vector<float>> slots)
    : options_(options), step_(step), slots_(std::move(slots)) {}

namespace {

// One step's scalars, each a Python float rounded to float32 as torch's kernels take it.
struct StepScalars {
  float neg_lr = 0;    // sgd, rmsprop: -lr; adagrad: -lr / (1 + (t-1) lr_decay); adam: -lr/bc1
  bool decay = false;  // L2 weight decay, added to the gradient (every type but adamw)
  float weight_decay = 0;
  bool scale_params = false;  // adamw: the parameter first times 1 - lr weight_decay
  float param_scale = 1;
  float beta1 = 0, one_minus_beta1 = 0, beta2 = 0, one_minus_beta2 = 0;
  float bias_correction2_sqrt = 1;
  bool amsgrad = false;
  float eps = 0;
  bool use_momentum = false, nesterov = false, first_step = false;
  float momentum = 0, one_minus_dampening = 0;
  float alpha = 0, one_minus_alpha = 0;
  bool centered = false;
};

StepScalars ScalarsFor(const DenseOptimizerOptions& o, int64_t step) {
  const double t = static_cast<double>(step);
  // This update's rate (ps/learning_rate_schedule.h), as torch's param_groups hold it
  // when a scheduler has set it.
  const double lr = ScheduledLearningRate(o, step);
  StepScalars s;
  s.decay = o.weight_decay != 0 && o.type != DenseOptimizerType::kAdamW;
  s.weight_decay = static_cast<float>(o.weight_decay);
  s.eps = static_cast<float>(o.epsilon);
  s.neg_lr = static_cast<float>(-lr);
  s.momentum = static_cast<float>(o.momentum);
  s.use_momentum = o.momentum > 0;
  switch (o.type) {
    case DenseOptimizerType::kSgd:
      s.nesterov = o.nesterov;
      s.first_step = step == 1;
      s.one_minus_dampening = static_cast<float>(1.0 - o.dampening);
      break;
    case DenseOptimizerType::kAdamW:
      s.scale_params = true;
      s.param_scale = static_cast<float>(1.0 - lr * o.weight_decay);
      [[fallthrough]];
    case DenseOptimizerType::kAdam:
      s.beta1 = static_cast<float>(o.beta1);
      s.one_minus_beta1 = static_cast<float>(1.0 - o.beta1);
      s.beta2 = static_cast<float>(o.beta2);
      s.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
      s.neg_lr = static_cast<float>(-(lr / (1.0 - std::pow(o.beta1, t))));
      s.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(o.beta2, t)));
      s.amsgrad = o.amsgrad;
      break;
    case DenseOptimizerType::kAdagrad:
      s.neg_lr = static_cast<float>(-(lr / (1.0 + (t - 1.0) * o.lr_decay)));
      break;
    case DenseOptimizerType::kRmsprop:
      s.alpha = static_cast<float>(o.alpha);
      s.one_minus_alpha = static_cast<float>(1.0 - o.alpha);
      s.centered = o.centered;
      break;
  }
  return s;
}

struct Arrays {
  const float* g;
  float* p;
  float* s0;
  float* s1;
  float* s2;
};

#define PS_INLINE inline __attribute__((always_inline))

// The step's choices, each a template argument of the loops (a bit of kF), so that each
// combination is a loop of its own with no branch inside: one that vectorises.
constexpr uint32_t kDecay = 1;        // L2 weight decay added to the gradient
constexpr uint32_t kScaleParams = 2;  // adamw's decoupled decay
constexpr uint32_t kAmsgrad = 4;
constexpr uint32_t kMomentum = 8;
constexpr uint32_t kNesterov = 16;
constexpr uint32_t kFirstStep = 32;  // sgd: the momentum buffer starts as the gradient
constexpr uint32_t kCentered = 64;
constexpr uint32_t kFlagCount = 7;

uint32_t FlagsOf(const StepScalars& s) {
  return (s.decay ? kDecay : 0) | (s.scale_params ? kScaleParams : 0) | (s.amsgrad ? kAmsgrad : 0) |
         (s.use_momentum ? kMomentum : 0) | (s.nesterov ? kNesterov : 0) |
         (s.first_step ? kFirstStep : 0) | (s.centered ? kCentered : 0);
}

// The flags each rule reads; the others are ignored (and zero in its loops' kF).
constexpr uint32_t RelevantFlags(DenseOptimizerType type) {
  switch (type) {
    case DenseOptimizerType::kSgd:
      return kDecay | kMomentum | kNesterov | kFirstStep;
    case DenseOptimizerType::kAdam:
    case DenseOptimizerType::kAdamW:
      return kDecay | kScaleParams | kAmsgrad;
    case DenseOptimizerType::kAdagrad:
      return kDecay;
    case DenseOptimizerType::kRmsprop:
      return kDecay | kMomentum | kCentered;
  }
  return 0;
}

// Each rule's update of element i, torch's tensor operations in torch's order. With
// kWrite it writes what it computes; without, it writes nothing. It returns whether any
// value it computed (ps/dense_optimizer.h, FirstUnsafeElement) is out of range.
// torch: d_p = grad.add(param, alpha=wd); buf = clone(d_p) at the first step, else
// buf.mul_(momentum).add_(d_p, alpha=1-dampening); d_p = d_p.add(buf, alpha=momentum)
// (nesterov) or buf; param.add_(d_p, alpha=-lr).
template <bool kWrite, uint32_t kF>
PS_INLINE unsigned SgdElement(const StepScalars& s, const float* __restrict g, float* __restrict p,
                              float* __restrict buffer, size_t i) {
  const float pi = p[i];
  float d = g[i];
  if constexpr ((kF & kDecay)) d = d + s.weight_decay * pi;
  unsigned out = StateValueRejected(d);
  if constexpr ((kF & kMomentum)) {
    const float b = (kF & kFirstStep) ? d : buffer[i] * s.momentum + s.one_minus_dampening * d;
    out |= StateValueRejected(b);
    if (kWrite) buffer[i] = b;
    d = (kF & kNesterov) ? d + s.momentum * b : b;
  }
  const float updated = pi + s.neg_lr * d;
  out |= StateValueRejected(updated);
  if (kWrite) p[i] = updated;
  return out;
}

// torch: param.mul_(1 - lr*wd) (adamw); grad = grad.add(param, alpha=wd) (adam);
// exp_avg.mul_(b1).add_(grad, alpha=1-b1); exp_avg_sq.mul_(b2).addcmul_(grad, grad,
// value=1-b2); max_exp_avg_sq = maximum(max_exp_avg_sq, exp_avg_sq) (amsgrad);
// denom = (sq.sqrt() / sqrt(bc2)).add_(eps); param.addcdiv_(exp_avg, denom, value=-lr/bc1).
template <bool kWrite, uint32_t kF>
PS_INLINE unsigned AdamElement(const StepScalars& s, const float* __restrict g, float* __restrict p,
                               float* __restrict m, float* __restrict v, float* __restrict v_max,
                               size_t i) {
  float pi = p[i];
  if constexpr ((kF & kScaleParams)) pi = pi * s.param_scale;
  float gi = g[i];
  if constexpr ((kF & kDecay)) gi = gi + s.weight_decay * pi;
  const float mi = m[i] * s.beta1 + s.one_minus_beta1 * gi;
  const float vi = v[i] * s.beta2 + s.one_minus_beta2 * gi * gi;
  const unsigned out = StateValueRejected(gi) | StateValueRejected(gi * gi) |
                       StateValueRejected(mi) | StateValueRejected(vi);
  if (kWrite) {
    float v_used = vi;
    if constexpr ((kF & kAmsgrad)) {
      const float previous = v_max[i];
      v_used = previous < vi ? vi : previous;  // torch.maximum, for finite values
      v_max[i] = v_used;
    }
    const float denom = std::sqrt(v_used) / s.bias_correction2_sqrt + s.eps;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi + s.neg_lr * mi / denom;
  }
  return out;
}

// torch: grad = grad.add(param, alpha=wd); sum.addcmul_(grad, grad, value=1);
// std = sum.sqrt().add_(eps); param.addcdiv_(grad, std, value=-clr).
template <bool kWrite, uint32_t kF>
PS_INLINE unsigned AdagradElement(const StepScalars& s, const float* __restrict g,
                                  float* __restrict p, float* __restrict sum, size_t i) {
  const float pi = p[i];
  float d = g[i];
  if constexpr ((kF & kDecay)) d = d + s.weight_decay * pi;
  const float si = sum[i] + d * d;
  const float updated = pi + s.neg_lr * d / (std::sqrt(si) + s.eps);
  if (kWrite) {
    sum[i] = si;
    p[i] = updated;
  }
  return StateValueRejected(d) | StateValueRejected(d * d) | StateValueRejected(si) |
         StateValueRejected(updated);
}

// torch: grad = grad.add(param, alpha=wd); square_avg.mul_(alpha).addcmul_(grad, grad,
// value=1-alpha); centered: grad_avg.mul_(alpha).add_(grad, alpha=1-alpha), avg =
// square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_(), else avg = square_avg.sqrt();
// avg.add_(eps); momentum: buf.mul_(momentum).addcdiv_(grad, avg), param.add_(buf,
// alpha=-lr); else param.addcdiv_(grad, avg, value=-lr).
template <bool kWrite, uint32_t kF>
PS_INLINE unsigned RmspropElement(const StepScalars& s, const float* __restrict g,
                                  float* __restrict p, float* __restrict square_avg,
                                  float* __restrict buffer, float* __restrict grad_avg, size_t i) {
  const float pi = p[i];
  float d = g[i];
  if constexpr ((kF & kDecay)) d = d + s.weight_decay * pi;
  const float sq = square_avg[i] * s.alpha + s.one_minus_alpha * d * d;
  unsigned out = StateValueRejected(d) | StateValueRejected(d * d) | StateValueRejected(sq);
  float avg;
  if constexpr ((kF & kCentered)) {
    const float ga = grad_avg[i] * s.alpha + s.one_minus_alpha * d;
    out |= StateValueRejected(ga);
    if (kWrite) grad_avg[i] = ga;
    avg = std::sqrt(sq + -ga * ga) + s.eps;
  } else {
    avg = std::sqrt(sq) + s.eps;
  }
  if (kWrite) square_avg[i] = sq;
  float updated;
  if constexpr ((kF & kMomentum)) {
    const float b = buffer[i] * s.momentum + d / avg;
    out |= StateValueRejected(b);
    if (kWrite) buffer[i] = b;
    updated = pi + s.neg_lr * b;
  } else {
    updated = pi + s.neg_lr * d / avg;
  }
  out |= StateValueRejected(updated);
  if (kWrite) p[i] = updated;
  return out;
}

// The slots each rule's element function takes, in slot order (DenseOptimizerSlotNames):
// rmsprop's optional slots follow square_avg in that order, so their positions depend on
// which are kept.
template <bool kWrite, DenseOptimizerType kType, uint32_t kF>
PS_INLINE unsigned Element(const StepScalars& s, const Arrays& a, size_t i) {
  if constexpr (kType == DenseOptimizerType::kSgd) {
    return SgdElement<kWrite, kF>(s, a.g, a.p, a.s0, i);
  } else if constexpr (kType == DenseOptimizerType::kAdagrad) {
    return AdagradElement<kWrite, kF>(s, a.g, a.p, a.s0, i);
  } else if constexpr (kType == DenseOptimizerType::kRmsprop) {
    float* buffer = (kF & kMomentum) ? a.s1 : nullptr;
    float* grad_avg = (kF & kCentered) ? ((kF & kMomentum) ? a.s2 : a.s1) : nullptr;
    return RmspropElement<kWrite, kF>(s, a.g, a.p, a.s0, buffer, grad_avg, i);
  } else {
    return AdamElement<kWrite, kF>(s, a.g, a.p, a.s0, a.s1, a.s2, i);
  }
}

// The update loops, one per rule and combination of its flags, compiled for each
// instruction set; picked per call by UsableCpuFeatures(), so PS_CPU_BASELINE=1 runs the
// baseline ones on any CPU. sqrt and division are correctly rounded in each, and no
// multiply-add is contracted: every one computes the scalar loop's bits.
using UpdateKernel = void (*)(const StepScalars&, const Arrays&, size_t, size_t);
using CheckKernel = size_t (*)(const StepScalars&, const Arrays&, size_t);

template <DenseOptimizerType kType, uint32_t kF>
PS_INLINE void UpdateLoop(const StepScalars& s, const Arrays& a, size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) Element<true, kType, kF>(s, a, i);
}

#if defined(__x86_64__)
template <DenseOptimizerType kType, uint32_t kF>
__attribute__((target("avx512f"))) void UpdateAvx512(const StepScalars& s, const Arrays& a,
                                                     size_t begin, size_t end) {
  UpdateLoop<kType, kF>(s, a, begin, end);
}
template <DenseOptimizerType kType, uint32_t kF>
__attribute__((target("avx2"))) void UpdateAvx2(const StepScalars& s, const Arrays& a, size_t begin,
                                                size_t end) {
  UpdateLoop<kType, kF>(s, a, begin, end);
}
#endif
template <DenseOptimizerType kType, uint32_t kF>
void UpdateBaseline(const StepScalars& s, const Arrays& a, size_t begin, size_t end) {
  UpdateLoop<kType, kF>(s, a, begin, end);
}

// The check before every update (a push's whole gradient, before anything is written),
// cloned per instruction set as the updates are: a server computes every value twice,
// once here and once in the update.
template <DenseOptimizerType kType, uint32_t kF>
PS_INLINE size_t FirstOutOfRangeLoop(const StepScalars& s, const Arrays& a, size_t n) {
  // Without an early exit the loop vectorises: the common case (nothing out of range)
  // reads everything once, at memory speed.
  unsigned any = 0;
  for (size_t i = 0; i < n; ++i) any |= Element<false, kType, kF>(s, a, i);
  if (!any) return n;
  for (size_t i = 0; i < n; ++i) {
    if (Element<false, kType, kF>(s, a, i)) return i;
  }
  return n;
}

#if defined(__x86_64__)
template <DenseOptimizerType kType, uint32_t kF>
__attribute__((target("avx512f"))) size_t CheckAvx512(const StepScalars& s, const Arrays& a,
                                                      size_t n) {
  return FirstOutOfRangeLoop<kType, kF>(s, a, n);
}
template <DenseOptimizerType kType, uint32_t kF>
__attribute__((target("avx2"))) size_t CheckAvx2(const StepScalars& s, const Arrays& a, size_t n) {
  return FirstOutOfRangeLoop<kType, kF>(s, a, n);
}
#endif
template <DenseOptimizerType kType, uint32_t kF>
size_t CheckBaseline(const StepScalars& s, const Arrays& a, size_t n) {
  return FirstOutOfRangeLoop<kType, kF>(s, a, n);
}

// The flags of combination `index` of kType's relevant flags: index's bits, in order, on
// the relevant flags' bits.
constexpr uint32_t ExpandFlags(DenseOptimizerType type, uint32_t index) {
  uint32_t flags = 0;
  for (uint32_t bit = 0, next = 0; bit < kFlagCount; ++bit) {
    if ((RelevantFlags(type) & (1u << bit)) == 0) continue;
    if (index & (1u << next)) flags |= 1u << bit;
    ++next;
  }
  return flags;
}

constexpr uint32_t CompactFlags(DenseOptimizerType type, uint32_t flags) {
  uint32_t index = 0;
  for (uint32_t bit = 0, next = 0; bit < kFlagCount; ++bit) {
    if ((RelevantFlags(type) & (1u << bit)) == 0) continue;
    if (flags & (1u << bit)) index |= 1u << next;
    ++next;
  }
  return index;
}

// Every combination's kernels of one rule, by compact index.
template <DenseOptimizerType kType>
struct Kernels {
  static constexpr uint32_t kCombinations = 1u << __builtin_popcount(RelevantFlags(kType));
  template <uint32_t... kIndex>
  static UpdateKernel Update(uint32_t index, std::integer_sequence<uint32_t, kIndex...>) {
#if defined(__x86_64__)
    const CpuFeatures cpu = UsableCpuFeatures();
    if (cpu.avx512f) {
      static constexpr UpdateKernel kAvx512[] = {
          UpdateAvx512<kType, ExpandFlags(kType, kIndex)>...};
      return kAvx512[index];
    }
    if (cpu.avx2) {
      static constexpr UpdateKernel kAvx2[] = {UpdateAvx2<kType, ExpandFlags(kType, kIndex)>...};
      return kAvx2[index];
    }
#endif
    static constexpr UpdateKernel kBaseline[] = {
        UpdateBaseline<kType, ExpandFlags(kType, kIndex)>...};
    return kBaseline[index];
  }
  template <uint32_t... kIndex>
  static CheckKernel Check(uint32_t index, std::integer_sequence<uint32_t, kIndex...>) {
#if defined(__x86_64__)
    const CpuFeatures cpu = UsableCpuFeatures();
    if (cpu.avx512f) {
      static constexpr CheckKernel kAvx512[] = {CheckAvx512<kType, ExpandFlags(kType, kIndex)>...};
      return kAvx512[index];
    }
    if (cpu.avx2) {
      static constexpr CheckKernel kAvx2[] = {CheckAvx2<kType, ExpandFlags(kType, kIndex)>...};
      return kAvx2[index];
    }
#endif
    static constexpr CheckKernel kBaseline[] = {
        CheckBaseline<kType, ExpandFlags(kType, kIndex)>...};
    return kBaseline[index];
  }
  static UpdateKernel Update(uint32_t flags) {
    return Update(CompactFlags(kType, flags),
                  std::make_integer_sequence<uint32_t, kCombinations>());
  }
  static CheckKernel Check(uint32_t flags) {
    return Check(CompactFlags(kType, flags), std::make_integer_sequence<uint32_t, kCombinations>());
  }
};

UpdateKernel PickUpdateKernel(DenseOptimizerType type, uint32_t flags) {
  switch (type) {
    case DenseOptimizerType::kSgd:
      return Kernels<DenseOptimizerType::kSgd>::Update(flags);
    case DenseOptimizerType::kAdagrad:
      return Kernels<DenseOptimizerType::kAdagrad>::Update(flags);
    case DenseOptimizerType::kRmsprop:
      return Kernels<DenseOptimizerType::kRmsprop>::Update(flags);
    case DenseOptimizerType::kAdam:
    case DenseOptimizerType::kAdamW:
      break;
  }
  return Kernels<DenseOptimizerType::kAdam>::Update(flags);
}

CheckKernel PickCheckKernel(DenseOptimizerType type, uint32_t flags) {
  switch (type) {
    case DenseOptimizerType::kSgd:
      return Kernels<DenseOptimizerType::kSgd>::Check(flags);
    case DenseOptimizerType::kAdagrad:
      return Kernels<DenseOptimizerType::kAdagrad>::Check(flags);
    case DenseOptimizerType::kRmsprop:
      return Kernels<DenseOptimizerType::kRmsprop>::Check(flags);
    case DenseOptimizerType::kAdam:
    case DenseOptimizerType::kAdamW:
      break;
  }
  return Kernels<DenseOptimizerType::kAdam>::Check(flags);
}

// Below this many parameters one thread is faster than starting others.
constexpr size_t kParallelThreshold = size_t{1} << 18;
// Each extra thread gets at least this many.
constexpr size_t kMinimumPerThread = size_t{1} << 16;

Arrays ArraysOf(const float* g, float* p, std::vector<std::vector<float>>& slots) {
  float* s[3] = {nullptr, nullptr, nullptr};
  for (size_t k = 0; k < slots.size() && k < 3; ++k) s[k] = slots[k].data();
  return {g, p, s[0], s[1], s[2]};
}

}  // namespace

size_t DenseOptimizer::FirstUnsafeElement(absl::Span<const float> gradient,
                                          absl::Span<const float> params,
                                          const DenseOptimizerOptions* settings) const {
  const StepScalars s = ScalarsFor(settings != nullptr ? *settings : options_, step_ + 1);
  // Element<false> reads through these and writes nothing.
  auto& slots = const_cast<std::vector<std::vector<float>>&>(slots_);
  const Arrays a = ArraysOf(gradient.data(), const_cast<float*>(params.data()), slots);
  return PickCheckKernel(options_.type, FlagsOf(s))(s, a, gradient.size());
}

void DenseOptimizer::Apply(absl::Span<const float> gradient, absl::Span<float> params,
                           const DenseOptimizerOptions* settings) {
  ++step_;
  const StepScalars scalars = ScalarsFor(settings != nullptr ? *settings : options_, step_);
  const Arrays arrays = ArraysOf(gradient.data(), params.data(), slots_);
  const size_t n = params.size();
  size_t threads = 1;
  if (n >= kParallelThreshold) {
    threads =
        std::min<size_t>(std::max(1u, std::thread::hardware_concurrency()), n / kMinimumPerThread);
  }
  const UpdateKernel kernel = PickUpdateKernel(options_.type, FlagsOf(scalars));
  if (threads <= 1) {
    kernel(scalars, arrays, 0, n);
    return;
  }
  // Chunks are multiples of 64 parameters so that no two threads share a cache line.
  std::vector<std::thread> helpers;
  helpers.reserve(threads - 1);
  auto boundary = [&](size_t k) { return std::min(n, (n * k / threads) & ~size_t{63}); };
  for (size_t k = 1; k < threads; ++k) {
    helpers.emplace_back(kernel, std::cref(scalars), std::cref(arrays), boundary(k),
                         k + 1 == threads ? n : boundary(k + 1));
  }
  kernel(scalars, arrays, 0, boundary(1));
  for (std::thread& helper : helpers) helper.join();
}

}  // namespace paramserver
