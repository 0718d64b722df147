#include "worker/ctr_metrics.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"

namespace paramserver {

absl::StatusOr<double> ExactAuc(absl::Span<const float> scores, absl::Span<const float> labels) {
  if (scores.size() != labels.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("AUC: ", scores.size(), " scores but ", labels.size(), " labels"));
  }
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  double positive_rank_sum = 0;
  double positives = 0;
  for (size_t begin = 0; begin < order.size();) {
    size_t end = begin + 1;
    while (end < order.size() && scores[order[end]] == scores[order[begin]]) ++end;
    const double average_rank = (begin + 1 + end) / 2.0;  // ranks begin+1 .. end
    for (size_t i = begin; i < end; ++i) {
      const float label = labels[order[i]];
      if (label != 0 && label != 1) {
        return absl::InvalidArgumentError(absl::StrCat("AUC: label ", label, " is not 0 or 1"));
      }
      if (label == 1) {
        positive_rank_sum += average_rank;
        positives += 1;
      }
    }
    begin = end;
  }
  const double negatives = static_cast<double>(scores.size()) - positives;
  if (positives == 0 || negatives == 0) {
    return absl::InvalidArgumentError("AUC: needs both positive and negative examples");
  }
  return (positive_rank_sum - positives * (positives + 1) / 2) / (positives * negatives);
}

double MeanLogLoss(absl::Span<const float> logits, absl::Span<const float> labels) {
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double z = logits[i];
    sum += std::max(z, 0.0) - z * labels[i] + std::log1p(std::exp(-std::abs(z)));
  }
  return sum / static_cast<double>(logits.size());
}

}  // namespace paramserver
