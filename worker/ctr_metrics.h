// What a click-through-rate model is judged by: the area under the ROC curve, exactly
// (by sorting, ties counted as half), and the mean log loss.
#ifndef PARAMSERVER_WORKER_CTR_METRICS_H_
#define PARAMSERVER_WORKER_CTR_METRICS_H_

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace paramserver {

// The probability that a random positive example scores above a random negative one
// (a tie counts one half): the Mann-Whitney statistic over average ranks. Any monotone
// score works (logits or probabilities). INVALID_ARGUMENT if the sizes differ, a label
// is not 0 or 1, or one class is absent (AUC is undefined then).
absl::StatusOr<double> ExactAuc(absl::Span<const float> scores, absl::Span<const float> labels);

// The mean binary cross-entropy of `logits` against `labels`, computed stably:
// max(z, 0) - z*y + log(1 + exp(-|z|)), in double. REQUIRES: equal sizes, non-empty.
double MeanLogLoss(absl::Span<const float> logits, absl::Span<const float> labels);

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_CTR_METRICS_H_
