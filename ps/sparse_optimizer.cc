#include "ps/sparse_optimizer.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "ps/optimizer_state_limit.h"

namespace paramserver {

int StateFloatsPerElement(EmbeddingOptimizerType type) {
  switch (type) {
    case EmbeddingOptimizerType::kAdam:
      return 2;
    case EmbeddingOptimizerType::kAdagrad:
      return 1;
    case EmbeddingOptimizerType::kSgd:
      return 0;
  }
  return 0;
}

RowUpdate PrepareRowUpdate(const EmbeddingOptimizerOptions& options, int64_t step) {
  RowUpdate update;
  update.type = options.type;
  update.eps = static_cast<float>(options.epsilon);
  update.minus_step_size = static_cast<float>(-options.learning_rate);
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
