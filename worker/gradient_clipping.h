// Global-norm gradient clipping as torch.nn.utils.clip_grad_norm_ does it, for both of
// a worker's ways: a sync step's mean gradient, whose sum of squares the servers gather
// (StepPush::clip_grad_norm), and a worker's own push (async and ssp modes).
#ifndef PARAMSERVER_WORKER_GRADIENT_CLIPPING_H_
#define PARAMSERVER_WORKER_GRADIENT_CLIPPING_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace paramserver {

// torch.nn.utils.clip_grad_norm_'s scale for a gradient whose squares sum to
// `sum_squares`: min(1, max_norm / (norm + 1e-6)), in float32 as torch computes it.
// 0 when the norm is not finite in float32.
float ClipCoefficient(double max_norm, double sum_squares);

// ClipCoefficient for step `step`'s gradient, or INVALID_ARGUMENT ("training diverged
// at step ...") when it is 0: the norm overflowed float32, and torch would zero the step.
absl::StatusOr<float> StepClipCoefficient(int64_t step, double max_norm, double sum_squares);

// Clips `gradient` in place to the global 2-norm `max_norm` (> 0), as clip_grad_norm_
// over every parameter: scaled by StepClipCoefficient (1 leaves it as it is). The sum
// of squares is taken in double.
absl::Status ClipGradientInPlace(int64_t step, double max_norm, absl::Span<float> gradient);

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_GRADIENT_CLIPPING_H_
