#include "common/model/mlp_parameters.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/safetensors.h"

namespace paramserver {

ModelLayout MlpLayout::LayOut(const std::vector<int64_t>& layers) {
  std::vector<ModelLayout::DenseTensorSpec> tensors;
  for (size_t l = 0; l + 1 < layers.size(); ++l) {
    const std::string prefix = absl::StrCat("fc", l + 1);
    tensors.push_back({prefix + ".weight", {layers[l + 1], layers[l]}});
    tensors.push_back({prefix + ".bias", {layers[l + 1]}});
  }
  absl::StatusOr<ModelLayout> layout = ModelLayout::Create(tensors);
  // Widths >= 1 are this constructor's precondition (the cluster spec checks them).
  if (!layout.ok()) std::abort();
  return *std::move(layout);
}

MlpLayout::MlpLayout(std::vector<int64_t> layers)
    : layers_(std::move(layers)), model_(LayOut(layers_)) {}

absl::StatusOr<ModelLayout> ModelLayoutFromSpec(const ModelSection& model) {
  if (model.layers.size() < 2 ||
      std::any_of(model.layers.begin(), model.layers.end(), [](int64_t w) { return w < 1; })) {
    return absl::InvalidArgumentError(absl::StrCat("model.layers [",
                                                   absl::StrJoin(model.layers, ", "),
                                                   "] needs at least two widths, each >= 1"));
  }
  const ModelLayout mlp = MlpLayout(model.layers).model();
  if (model.type != ModelType::kCtr) return mlp;
  std::vector<ModelLayout::DenseTensorSpec> dense;
  for (const TensorSlot& slot : mlp.dense_tensors()) dense.push_back({slot.name, slot.shape});
  std::vector<EmbeddingTableSlot> tables;
  for (const CtrTableSpec& table : CtrTables(model)) {
    tables.push_back({table.name, table.dim, table.settings});
  }
  return ModelLayout::Create(dense, std::move(tables));
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

}  // namespace paramserver
