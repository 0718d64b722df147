#include "worker/compute_backend.h"

#include "absl/strings/str_cat.h"

namespace paramserver {

absl::Status CheckBackendInputs(const MlpLayout& layout, absl::Span<const float> params,
                                const BatchView& batch) {
  if (static_cast<int64_t>(params.size()) != layout.total_parameters()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", layout.total_parameters(), " parameters, got ", params.size()));
  }
  if (batch.size < 1 || batch.features == nullptr || batch.labels == nullptr) {
    return absl::InvalidArgumentError("empty batch");
  }
  const int64_t classes = layout.layers().back();
  for (int64_t i = 0; i < batch.size; ++i) {
    if (batch.labels[i] >= classes) {
      return absl::InvalidArgumentError(absl::StrCat("label ", int{batch.labels[i]}, " of example ",
                                                     i, " is not below ", classes, " classes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace paramserver
