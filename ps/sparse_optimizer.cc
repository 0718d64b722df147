#include "ps/sparse_optimizer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
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

// FTRL's new value of one element from its new linear term and accumulator.
inline float FtrlValue(const RowUpdate& u, float z, float n_power) {
  if (std::fabs(z) <= u.l1) return 0.0f;
  const float quadratic = (u.beta + n_power) / u.learning_rate + 2.0f * u.l2;
  return ((z > 0 ? u.l1 : -u.l1) - z) / quadratic;
}

// One FTRL element's update, computed without writing: the new n, z and w.
struct FtrlElement {
  float n, z, w;
};
inline FtrlElement FtrlStep(const RowUpdate& u, float g, float w, float n, float z) {
  const float n_new = n + g * g;
  const float n_power = std::pow(n_new, u.power);
  const float sigma = (n_power - std::pow(n, u.power)) / u.learning_rate;
  const float z_new = z + (g - sigma * w);
  return {n_new, z_new, FtrlValue(u, z_new, n_power)};
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

void ApplyRowUpdate(const RowUpdate& update, absl::Span<const float> gradient,
                    absl::Span<float> row, absl::Span<float> state) {
  const size_t dim = row.size();
  switch (update.type) {
    case EmbeddingOptimizerType::kAdam: {
      float* m = state.data();
      float* v = state.data() + dim;
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
      return;
    }
    case EmbeddingOptimizerType::kAdagrad: {
      // torch/optim/adagrad.py _single_tensor_adagrad, sparse branch: clr = lr (no decay).
      float* sum = state.data();
      for (size_t i = 0; i < dim; ++i) {
        const float g = gradient[i];
        sum[i] = sum[i] + g * g;
        const float std_value = std::sqrt(sum[i]) + update.eps;
        row[i] = row[i] + update.minus_step_size * (g / std_value);
      }
      return;
    }
    case EmbeddingOptimizerType::kSgd: {
      for (size_t i = 0; i < dim; ++i) row[i] = row[i] + update.minus_step_size * gradient[i];
      return;
    }
    case EmbeddingOptimizerType::kRowwiseAdagrad: {
      state[0] = state[0] + MeanSquare(gradient);
      const float multiplier = update.learning_rate / (std::sqrt(state[0]) + update.eps);
      for (size_t i = 0; i < dim; ++i) row[i] = row[i] - multiplier * gradient[i];
      return;
    }
    case EmbeddingOptimizerType::kFtrl: {
      float* n = state.data();
      float* z = state.data() + dim;
      for (size_t i = 0; i < dim; ++i) {
        const FtrlElement next = FtrlStep(update, gradient[i], row[i], n[i], z[i]);
        n[i] = next.n;
        z[i] = next.z;
        row[i] = next.w;
      }
      return;
    }
  }
}

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
