#include "common/mlp_parameters.h"

#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/safetensors.h"
#include "common/status_macros.h"

namespace paramserver {

int64_t TensorSlot::size() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

MlpLayout::MlpLayout(std::vector<int64_t> layers) : layers_(std::move(layers)) {
  for (int l = 0; l + 1 < static_cast<int>(layers_.size()); ++l) {
    const int64_t in = layers_[l];
    const int64_t out = layers_[l + 1];
    const std::string prefix = absl::StrCat("fc", l + 1);
    tensors_.push_back({prefix + ".weight", {out, in}, total_});
    total_ += out * in;
    tensors_.push_back({prefix + ".bias", {out}, total_});
    total_ += out;
  }
}

std::vector<float> InitializeMlpParameters(const MlpLayout& layout, uint64_t seed) {
  std::vector<float> params(layout.total_parameters());
  std::mt19937_64 generator(seed);
  for (int l = 0; l < layout.num_layers(); ++l) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(layout.layers()[l]));
    for (const TensorSlot* slot : {&layout.weight(l), &layout.bias(l)}) {
      for (int64_t i = 0; i < slot->size(); ++i) {
        // 53 random bits -> [0, 1): the same on every platform, unlike
        // std::uniform_real_distribution.
        const double unit = static_cast<double>(generator() >> 11) * 0x1.0p-53;
        params[slot->offset + i] = static_cast<float>((2.0 * unit - 1.0) * bound);
      }
    }
  }
  return params;
}

absl::StatusOr<std::vector<float>> LoadMlpParameters(const MlpLayout& layout,
                                                     const std::string& path) {
  PS_ASSIGN_OR_RETURN(std::vector<NamedTensor> tensors, ReadSafetensorsFile(path));
  std::vector<float> params(layout.total_parameters());
  for (const TensorSlot& slot : layout.tensors()) {
    const NamedTensor* found = nullptr;
    for (const NamedTensor& t : tensors) {
      if (t.name == slot.name) found = &t;
    }
    if (found == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", slot.name, "' is missing; the model needs it"));
    }
    if (found->shape != slot.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor '", slot.name, "' has shape [", absl::StrJoin(found->shape, ", "),
          "], the model needs [", absl::StrJoin(slot.shape, ", "), "]"));
    }
    std::copy(found->values.begin(), found->values.end(), params.begin() + slot.offset);
  }
  return params;
}

absl::Status SaveMlpParameters(const MlpLayout& layout, const std::vector<float>& params,
                               const std::string& path) {
  std::vector<NamedTensor> tensors;
  for (const TensorSlot& slot : layout.tensors()) {
    tensors.push_back({slot.name, slot.shape,
                       std::vector<float>(params.begin() + slot.offset,
                                          params.begin() + slot.offset + slot.size())});
  }
  return WriteSafetensorsFile(path, tensors);
}

}  // namespace paramserver
