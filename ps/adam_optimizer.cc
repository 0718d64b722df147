#include "ps/adam_optimizer.h"

#include <cmath>

namespace paramserver {

AdamOptimizer::AdamOptimizer(AdamOptions options, int64_t size)
    : options_(options), m_(size, 0.0f), v_(size, 0.0f) {}

AdamOptimizer::AdamOptimizer(AdamOptions options, int64_t step, std::vector<float> first_moment,
                             std::vector<float> second_moment)
    : options_(options), step_(step), m_(std::move(first_moment)), v_(std::move(second_moment)) {}

void AdamOptimizer::Apply(absl::Span<const float> gradient, absl::Span<float> params) {
  ++step_;
  // Scalars in double, element-wise work in float, in the order PyTorch's single-tensor
  // Adam uses: exp_avg.lerp_(grad, 1-b1); exp_avg_sq.mul_(b2).addcmul_(grad, grad, 1-b2);
  // denom = exp_avg_sq.sqrt() / sqrt(bc2) + eps; param.addcdiv_(exp_avg, denom, -lr/bc1).
  const double t = static_cast<double>(step_);
  const double bias_correction1 = 1.0 - std::pow(options_.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(options_.beta2, t);
  const float step_size = static_cast<float>(options_.learning_rate / bias_correction1);
  const float bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  const float one_minus_beta1 = static_cast<float>(1.0 - options_.beta1);
  const float beta2 = static_cast<float>(options_.beta2);
  const float one_minus_beta2 = static_cast<float>(1.0 - options_.beta2);
  const float epsilon = static_cast<float>(options_.epsilon);
  float* m = m_.data();
  float* v = v_.data();
  float* p = params.data();
  const float* g = gradient.data();
  const size_t n = params.size();
  for (size_t i = 0; i < n; ++i) {
    m[i] += one_minus_beta1 * (g[i] - m[i]);
    v[i] = v[i] * beta2 + one_minus_beta2 * g[i] * g[i];
    const float denom = std::sqrt(v[i]) / bias_correction2_sqrt + epsilon;
    p[i] -= step_size * (m[i] / denom);
  }
}

}  // namespace paramserver
