#include "worker/gradient_clipping.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace paramserver {

float ClipCoefficient(double max_norm, double sum_squares) {
  // torch: total_norm (float32) + 1e-6, its reciprocal times max_norm, clamped to 1.
  const float norm = static_cast<float>(std::sqrt(sum_squares));
  const float denominator = norm + 1e-6f;
  const float coefficient = (1.0f / denominator) * static_cast<float>(max_norm);
  return std::min(coefficient, 1.0f);
}

absl::StatusOr<float> StepClipCoefficient(int64_t step, double max_norm, double sum_squares) {
  const float coefficient = ClipCoefficient(max_norm, sum_squares);
  if (coefficient > 0) return coefficient;
  return absl::InvalidArgumentError(absl::StrCat(
      "training diverged at step ", step, ": the gradient's norm is ", std::sqrt(sum_squares),
      ", which clipping to ", max_norm, " would scale by 0; lower the learning rate"));
}

absl::Status ClipGradientInPlace(int64_t step, double max_norm, absl::Span<float> gradient) {
  double sum_squares = 0;
  for (float v : gradient) sum_squares += static_cast<double>(v) * v;
  absl::StatusOr<float> coefficient = StepClipCoefficient(step, max_norm, sum_squares);
  if (!coefficient.ok()) return coefficient.status();
  if (*coefficient < 1) {
    for (float& v : gradient) v *= *coefficient;
  }
  return absl::OkStatus();
}

}  // namespace paramserver
