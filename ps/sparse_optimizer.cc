#include "ps/sparse_optimizer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/ops/cpu_features.h"
#include "ps/memory_prefetch.h"
#include "ps/optimizer_state_limit.h"

namespace paramserver {

int StateFloatsPerRow(EmbeddingOptimizerType type, int dim) {
  switch (type) {
    case EmbeddingOptimizerType::kAdam:
    case EmbeddingOptimizerType::kFtrl:
      return 2 * dim;
    case EmbeddingOptimizerType::kAdagrad:
      return dim;
    case EmbeddingOptimizerType::kSgd:
      return 0;
    case EmbeddingOptimizerType::kRowwiseAdagrad:
      return 1;
  }
  return 0;
}

void InitializeRowState(const EmbeddingOptimizerOptions& options, int dim,
                        absl::Span<float> state) {
  std::fill(state.begin(), state.end(), 0.0f);
  const float initial = static_cast<float>(options.initial_accumulator_value);
  if (options.type == EmbeddingOptimizerType::kRowwiseAdagrad) {
    state[0] = initial;
  } else if (options.type == EmbeddingOptimizerType::kFtrl) {
    std::fill(state.begin(), state.begin() + dim, initial);
  }
}

namespace {

// FTRL's new value of one element from its new linear term and accumulator. The
// quotient is computed whether or not it is taken: without a branch, the checks' loops
// vectorise too.
inline float FtrlValue(const RowUpdate& u, float z, float n_power) {
  const float quadratic = (u.beta + n_power) / u.learning_rate + 2.0f * u.l2;
  const float value = ((z > 0 ? u.l1 : -u.l1) - z) / quadratic;
  return std::fabs(z) <= u.l1 ? 0.0f : value;
}

// n^p for FTRL, p = -lr_power: the square root where lr_power is -0.5 (its default), as
// TensorFlow's ApplyFtrl takes it (a correctly rounded sqrt vectorises; pow does not).
template <bool kSquareRoot>
inline float FtrlPower(float n, float power) {
  if constexpr (kSquareRoot) {
    return std::sqrt(n);
  } else {
    return std::pow(n, power);
  }
}

// One FTRL element's update, computed without writing: the new n, z and w.
struct FtrlElement {
  float n, z, w;
};
template <bool kSquareRoot>
inline FtrlElement FtrlStep(const RowUpdate& u, float g, float w, float n, float z) {
  const float n_new = n + g * g;
  const float n_power = FtrlPower<kSquareRoot>(n_new, u.power);
  const float sigma = (n_power - FtrlPower<kSquareRoot>(n, u.power)) / u.learning_rate;
  const float z_new = z + (g - sigma * w);
  return {n_new, z_new, FtrlValue(u, z_new, n_power)};
}
inline FtrlElement FtrlStep(const RowUpdate& u, float g, float w, float n, float z) {
  return u.ftrl_square_root ? FtrlStep<true>(u, g, w, n, z) : FtrlStep<false>(u, g, w, n, z);
}

// The row-wise accumulator's increment: the mean over the row of g^2, summed in order.
inline float MeanSquare(absl::Span<const float> gradient) {
  float sum = 0;
  for (float g : gradient) sum = sum + g * g;
  return sum / static_cast<float>(gradient.size());
}

}  // namespace

RowUpdate PrepareRowUpdate(const EmbeddingOptimizerOptions& options, int64_t step) {
  RowUpdate update;
  update.type = options.type;
  update.eps = static_cast<float>(options.epsilon);
  update.minus_step_size = static_cast<float>(-options.learning_rate);
  update.learning_rate = static_cast<float>(options.learning_rate);
  update.power = static_cast<float>(-options.learning_rate_power);
  update.l1 = static_cast<float>(options.l1);
  update.l2 = static_cast<float>(options.l2);
  update.beta = static_cast<float>(options.beta);
  update.ftrl_square_root = update.power == 0.5f;
  if (options.type == EmbeddingOptimizerType::kAdam) {
    // torch/optim/_functional.py sparse_adam, with Python's double arithmetic for the
    // step size and float32 tensors for the rest.
    const double bias_correction1 = 1 - std::pow(options.beta1, static_cast<double>(step));
    const double bias_correction2 = 1 - std::pow(options.beta2, static_cast<double>(step));
    const double step_size = options.learning_rate * std::sqrt(bias_correction2) / bias_correction1;
    update.one_minus_beta1 = static_cast<float>(1 - options.beta1);
    update.one_minus_beta2 = static_cast<float>(1 - options.beta2);
    update.minus_step_size = static_cast<float>(-step_size);
  }
  return update;
}

namespace {

#define PS_INLINE inline __attribute__((always_inline))

template <bool kSquareRoot>
PS_INLINE void UpdateFtrlRow(const RowUpdate& update, const float* __restrict gradient,
                             float* __restrict row, float* __restrict state, size_t dim) {
  float* __restrict n = state;
  float* __restrict z = state + dim;
  for (size_t i = 0; i < dim; ++i) {
    const FtrlElement next = FtrlStep<kSquareRoot>(update, gradient[i], row[i], n[i], z[i]);
    n[i] = next.n;
    z[i] = next.z;
    row[i] = next.w;
  }
}

// One row's update under optimizer kType: the arithmetic of ApplyRowUpdate, written once
// for the reference call and the batched kernels below. `state` as ApplyRowUpdate's.
template <EmbeddingOptimizerType kType>
PS_INLINE void UpdateRow(const RowUpdate& update, const float* __restrict gradient,
                         float* __restrict row, float* __restrict state, size_t dim) {
  if constexpr (kType == EmbeddingOptimizerType::kAdam) {
    float* __restrict m = state;
    float* __restrict v = state + dim;
    for (size_t i = 0; i < dim; ++i) {
      const float g = gradient[i];
      const float old_m = m[i];
      const float m_update = (g - old_m) * update.one_minus_beta1;
      m[i] = old_m + m_update;
      const float old_v = v[i];
      const float v_update = (g * g - old_v) * update.one_minus_beta2;
      v[i] = old_v + v_update;
      const float numer = m_update + old_m;
      const float denom = std::sqrt(v_update + old_v) + update.eps;
      row[i] = row[i] + update.minus_step_size * (numer / denom);
    }
  } else if constexpr (kType == EmbeddingOptimizerType::kAdagrad) {
    // torch/optim/adagrad.py _single_tensor_adagrad, sparse branch: clr = lr (no decay).
    float* __restrict sum = state;
    for (size_t i = 0; i < dim; ++i) {
      const float g = gradient[i];
      const float new_sum = sum[i] + g * g;
      sum[i] = new_sum;
      const float std_value = std::sqrt(new_sum) + update.eps;
      row[i] = row[i] + update.minus_step_size * (g / std_value);
    }
  } else if constexpr (kType == EmbeddingOptimizerType::kSgd) {
    for (size_t i = 0; i < dim; ++i) row[i] = row[i] + update.minus_step_size * gradient[i];
  } else if constexpr (kType == EmbeddingOptimizerType::kRowwiseAdagrad) {
    state[0] = state[0] + MeanSquare(absl::MakeConstSpan(gradient, dim));
    const float multiplier = update.learning_rate / (std::sqrt(state[0]) + update.eps);
    for (size_t i = 0; i < dim; ++i) row[i] = row[i] - multiplier * gradient[i];
  } else if (update.ftrl_square_root) {
    UpdateFtrlRow<true>(update, gradient, row, state, dim);
  } else {
    UpdateFtrlRow<false>(update, gradient, row, state, dim);
  }
}

template <EmbeddingOptimizerType kType>
PS_INLINE void UpdateRowsLoop(const RowUpdate& update, size_t dim, size_t state_floats,
                              float* const* slots, const float* gradients, size_t count) {
  const size_t slot_bytes = (dim + state_floats) * sizeof(float);
  for (size_t r = 0; r < count; ++r) {
    if (r + kRowsAhead < count && slots[r + kRowsAhead] != nullptr) {
      PrefetchForWrite(slots[r + kRowsAhead], slot_bytes);
    }
    float* slot = slots[r];
    if (slot == nullptr) continue;
    UpdateRow<kType>(update, gradients + r * dim, slot, slot + dim, dim);
  }
}

// The row-wise accumulator's increment is a sum in element order, one chain of additions
// per row: four rows at a time run four chains side by side, each in its own order.
template <>
PS_INLINE void UpdateRowsLoop<EmbeddingOptimizerType::kRowwiseAdagrad>(
    const RowUpdate& update, size_t dim, size_t state_floats, float* const* slots,
    const float* gradients, size_t count) {
  const size_t slot_bytes = (dim + state_floats) * sizeof(float);
  constexpr size_t kChains = 4;
  size_t r = 0;
  for (; r + kChains <= count; r += kChains) {
    for (size_t k = 0; k < kChains; ++k) {
      if (r + kRowsAhead + k < count && slots[r + kRowsAhead + k] != nullptr) {
        PrefetchForWrite(slots[r + kRowsAhead + k], slot_bytes);
      }
    }
    const float* g = gradients + r * dim;
    float sums[kChains] = {0, 0, 0, 0};
    for (size_t i = 0; i < dim; ++i) {
      for (size_t k = 0; k < kChains; ++k) {
        const float x = g[k * dim + i];
        sums[k] = sums[k] + x * x;
      }
    }
    for (size_t k = 0; k < kChains; ++k) {
      float* slot = slots[r + k];
      if (slot == nullptr) continue;
      float* __restrict row = slot;
      const float* __restrict row_gradient = g + k * dim;
      slot[dim] = slot[dim] + sums[k] / static_cast<float>(dim);
      const float multiplier = update.learning_rate / (std::sqrt(slot[dim]) + update.eps);
      for (size_t i = 0; i < dim; ++i) row[i] = row[i] - multiplier * row_gradient[i];
    }
  }
  for (; r < count; ++r) {
    if (slots[r] == nullptr) continue;
    UpdateRow<EmbeddingOptimizerType::kRowwiseAdagrad>(update, gradients + r * dim, slots[r],
                                                       slots[r] + dim, dim);
  }
}

// The batched kernels, compiled for each instruction set and picked per call by
// UsableCpuFeatures() (PS_CPU_BASELINE=1 runs the baseline ones anywhere). sqrt and
// division round correctly in each, and nothing is contracted into a multiply-add: all
// compute the reference's bits.
using RowsKernel = void (*)(const RowUpdate&, size_t, size_t, float* const*, const float*, size_t);

#if defined(__x86_64__)
template <EmbeddingOptimizerType kType>
__attribute__((target("avx512f"))) void UpdateRowsAvx512(const RowUpdate& update, size_t dim,
                                                         size_t state_floats, float* const* slots,
                                                         const float* gradients, size_t count) {
  UpdateRowsLoop<kType>(update, dim, state_floats, slots, gradients, count);
}
template <EmbeddingOptimizerType kType>
__attribute__((target("avx2"))) void UpdateRowsAvx2(const RowUpdate& update, size_t dim,
                                                    size_t state_floats, float* const* slots,
                                                    const float* gradients, size_t count) {
  UpdateRowsLoop<kType>(update, dim, state_floats, slots, gradients, count);
}
#endif
template <EmbeddingOptimizerType kType>
void UpdateRowsBaseline(const RowUpdate& update, size_t dim, size_t state_floats,
                        float* const* slots, const float* gradients, size_t count) {
  UpdateRowsLoop<kType>(update, dim, state_floats, slots, gradients, count);
}

template <bool kSquareRoot>
PS_INLINE unsigned FtrlRowRejected(const RowUpdate& update, const float* __restrict gradient,
                                   const float* __restrict slot, size_t dim) {
  unsigned out = 0;
  for (size_t i = 0; i < dim; ++i) {
    const float g = gradient[i];
    const FtrlElement next =
        FtrlStep<kSquareRoot>(update, g, slot[i], slot[dim + i], slot[2 * dim + i]);
    out |= StateValueRejected(g * g) | StateValueRejected(next.n) | StateValueRejected(next.z) |
           StateValueRejected(next.w);
  }
  return out;
}

// What a row's update would write, computed as UpdateRow computes it, each value or-ed in
// through StateValueRejected: FirstUnsafeElement's rule without its early exit, so that
// the row vectorises. Nonzero if any value is out of range. `slot` as ApplyRowUpdates'.
template <EmbeddingOptimizerType kType>
PS_INLINE unsigned RowRejected(const RowUpdate& update, const float* __restrict gradient,
                               const float* __restrict slot, size_t dim) {
  unsigned out = 0;
  if constexpr (kType == EmbeddingOptimizerType::kAdam) {
    for (size_t i = 0; i < dim; ++i) {
      const float g = gradient[i];
      const float old_m = slot[dim + i];
      const float old_v = slot[2 * dim + i];
      const float square = g * g;
      out |= StateValueRejected(square) |
             StateValueRejected(old_m + (g - old_m) * update.one_minus_beta1) |
             StateValueRejected(old_v + (square - old_v) * update.one_minus_beta2);
    }
  } else if constexpr (kType == EmbeddingOptimizerType::kAdagrad) {
    for (size_t i = 0; i < dim; ++i) {
      const float square = gradient[i] * gradient[i];
      out |= StateValueRejected(square) | StateValueRejected(slot[dim + i] + square);
    }
  } else if constexpr (kType == EmbeddingOptimizerType::kSgd) {
    for (size_t i = 0; i < dim; ++i) {
      out |= StateValueRejected(slot[i] + update.minus_step_size * gradient[i]);
    }
  } else if constexpr (kType == EmbeddingOptimizerType::kRowwiseAdagrad) {
    for (size_t i = 0; i < dim; ++i) out |= StateValueRejected(gradient[i] * gradient[i]);
    out |= StateValueRejected(slot[dim] + MeanSquare(absl::MakeConstSpan(gradient, dim)));
  } else if (update.ftrl_square_root) {
    out = FtrlRowRejected<true>(update, gradient, slot, dim);
  } else {
    out = FtrlRowRejected<false>(update, gradient, slot, dim);
  }
  return out;
}

using RowCheckKernel = unsigned (*)(const RowUpdate&, const float*, const float*, size_t);

#if defined(__x86_64__)
template <EmbeddingOptimizerType kType>
__attribute__((target("avx512f"))) unsigned RowRejectedAvx512(const RowUpdate& update,
                                                              const float* gradient,
                                                              const float* slot, size_t dim) {
  return RowRejected<kType>(update, gradient, slot, dim);
}
template <EmbeddingOptimizerType kType>
__attribute__((target("avx2"))) unsigned RowRejectedAvx2(const RowUpdate& update,
                                                         const float* gradient, const float* slot,
                                                         size_t dim) {
  return RowRejected<kType>(update, gradient, slot, dim);
}
#endif
template <EmbeddingOptimizerType kType>
unsigned RowRejectedBaseline(const RowUpdate& update, const float* gradient, const float* slot,
                             size_t dim) {
  return RowRejected<kType>(update, gradient, slot, dim);
}

// Each family of kernels picks its clone for this CPU per rule (For<kType>); KernelFor
// maps the run-time rule to it.
struct UpdateKernels {
  using Kernel = RowsKernel;
  template <EmbeddingOptimizerType kType>
  static Kernel For() {
#if defined(__x86_64__)
    const CpuFeatures cpu = UsableCpuFeatures();
    if (cpu.avx512f) return UpdateRowsAvx512<kType>;
    if (cpu.avx2) return UpdateRowsAvx2<kType>;
#endif
    return UpdateRowsBaseline<kType>;
  }
};

struct CheckKernels {
  using Kernel = RowCheckKernel;
  template <EmbeddingOptimizerType kType>
  static Kernel For() {
#if defined(__x86_64__)
    const CpuFeatures cpu = UsableCpuFeatures();
    if (cpu.avx512f) return RowRejectedAvx512<kType>;
    if (cpu.avx2) return RowRejectedAvx2<kType>;
#endif
    return RowRejectedBaseline<kType>;
  }
};

template <typename Kernels>
typename Kernels::Kernel KernelFor(EmbeddingOptimizerType type) {
  switch (type) {
    case EmbeddingOptimizerType::kAdam:
      return Kernels::template For<EmbeddingOptimizerType::kAdam>();
    case EmbeddingOptimizerType::kAdagrad:
      return Kernels::template For<EmbeddingOptimizerType::kAdagrad>();
    case EmbeddingOptimizerType::kSgd:
      return Kernels::template For<EmbeddingOptimizerType::kSgd>();
    case EmbeddingOptimizerType::kRowwiseAdagrad:
      return Kernels::template For<EmbeddingOptimizerType::kRowwiseAdagrad>();
    case EmbeddingOptimizerType::kFtrl:
      break;
  }
  return Kernels::template For<EmbeddingOptimizerType::kFtrl>();
}

}  // namespace

#undef PS_INLINE

void ApplyRowUpdate(const RowUpdate& update, absl::Span<const float> gradient,
                    absl::Span<float> row, absl::Span<float> state) {
  const size_t dim = row.size();
  switch (update.type) {
    case EmbeddingOptimizerType::kAdam:
      return UpdateRow<EmbeddingOptimizerType::kAdam>(update, gradient.data(), row.data(),
                                                      state.data(), dim);
    case EmbeddingOptimizerType::kAdagrad:
      return UpdateRow<EmbeddingOptimizerType::kAdagrad>(update, gradient.data(), row.data(),
                                                         state.data(), dim);
    case EmbeddingOptimizerType::kSgd:
      return UpdateRow<EmbeddingOptimizerType::kSgd>(update, gradient.data(), row.data(),
                                                     state.data(), dim);
    case EmbeddingOptimizerType::kRowwiseAdagrad:
      return UpdateRow<EmbeddingOptimizerType::kRowwiseAdagrad>(update, gradient.data(), row.data(),
                                                                state.data(), dim);
    case EmbeddingOptimizerType::kFtrl:
      return UpdateRow<EmbeddingOptimizerType::kFtrl>(update, gradient.data(), row.data(),
                                                      state.data(), dim);
  }
}

void ApplyRowUpdates(const RowUpdate& update, int dim, absl::Span<float* const> slots,
                     absl::Span<const float> gradients) {
  const size_t state_floats = static_cast<size_t>(StateFloatsPerRow(update.type, dim));
  KernelFor<UpdateKernels>(update.type)(update, static_cast<size_t>(dim), state_floats,
                                        slots.data(), gradients.data(), slots.size());
}

RowUpdateCheck::RowUpdateCheck(const RowUpdate& update, int dim)
    : update_(update),
      dim_(static_cast<size_t>(dim)),
      kernel_(KernelFor<CheckKernels>(update.type)) {}

size_t FirstUnsafeElement(const RowUpdate& update, absl::Span<const float> gradient,
                          absl::Span<const float> row, absl::Span<const float> state) {
  const size_t dim = row.size();
  for (size_t i = 0; i < dim; ++i) {
    const float g = gradient[i];
    bool accepted = true;
    switch (update.type) {
      case EmbeddingOptimizerType::kAdam: {
        // ApplyRowUpdate's SparseAdam arithmetic.
        const float old_m = state[i];
        const float old_v = state[dim + i];
        const float square = g * g;
        const float m = old_m + (g - old_m) * update.one_minus_beta1;
        const float v = old_v + (square - old_v) * update.one_minus_beta2;
        accepted = StateValueAccepted(square) && StateValueAccepted(m) && StateValueAccepted(v);
        break;
      }
      case EmbeddingOptimizerType::kAdagrad: {
        const float square = g * g;
        accepted = StateValueAccepted(square) && StateValueAccepted(state[i] + square);
        break;
      }
      case EmbeddingOptimizerType::kSgd:
        accepted = StateValueAccepted(row[i] + update.minus_step_size * g);
        break;
      case EmbeddingOptimizerType::kRowwiseAdagrad: {
        // The accumulator grows by the row's mean square; each element's square too must
        // fit (a steady gradient drives the mean to it).
        const float square = g * g;
        accepted = StateValueAccepted(square) &&
                   (i > 0 || StateValueAccepted(state[0] + MeanSquare(gradient)));
        break;
      }
      case EmbeddingOptimizerType::kFtrl: {
        const FtrlElement next = FtrlStep(update, g, row[i], state[i], state[dim + i]);
        accepted = StateValueAccepted(g * g) && StateValueAccepted(next.n) &&
                   StateValueAccepted(next.z) && StateValueAccepted(next.w);
        break;
      }
    }
    if (!accepted) return i;
  }
  return dim;
}

void ApplyRowUpdate(const EmbeddingOptimizerOptions& options, int64_t step,
                    absl::Span<const float> gradient, absl::Span<float> row,
                    absl::Span<float> state) {
  ApplyRowUpdate(PrepareRowUpdate(options, step), gradient, row, state);
}

}  // namespace paramserver
