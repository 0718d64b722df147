// The MLP: its model layout (PyTorch names, shapes, offsets in the flat vector) and its
// default initialisation. Servers and workers share both. One producer of a ModelLayout.
#ifndef PARAMSERVER_COMMON_MODEL_MLP_PARAMETERS_H_
#define PARAMSERVER_COMMON_MODEL_MLP_PARAMETERS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/cluster_spec.h"
#include "common/model/model_layout.h"

namespace paramserver {

// The flat layout of an MLP with widths `layers` (input, hidden..., classes):
// fc1.weight [layers[1], layers[0]] row-major, fc1.bias [layers[1]], fc2.weight, ...
// in that order, as torch.nn.Linear stores them.
class MlpLayout {
 public:
  // REQUIRES: layers.size() >= 2 and every width >= 1 (the cluster spec checks them).
  explicit MlpLayout(std::vector<int64_t> layers);

  const std::vector<int64_t>& layers() const { return layers_; }
  int num_layers() const { return static_cast<int>(layers_.size()) - 1; }
  // The model-independent layout: what shards, checkpoints and weight files use.
  const ModelLayout& model() const { return model_; }
  const std::vector<TensorSlot>& tensors() const { return model_.dense_tensors(); }
  const TensorSlot& weight(int layer) const { return tensors()[2 * layer]; }
  const TensorSlot& bias(int layer) const { return tensors()[2 * layer + 1]; }
  int64_t total_parameters() const { return model_.dense_parameters(); }

 private:
  static ModelLayout LayOut(const std::vector<int64_t>& layers);
  std::vector<int64_t> layers_;
  ModelLayout model_;
};

// PyTorch nn.Linear's default distribution: every weight and bias of layer l drawn
// from U(-1/sqrt(fan_in), 1/sqrt(fan_in)), from a generator seeded with `seed`.
// Deterministic for a given seed on every platform.
std::vector<float> InitializeMlpParameters(const MlpLayout& layout, uint64_t seed);

// The layout of the model `model` describes: the MLP of model.layers, and for a ctr
// model its tables C1..C<categorical_features>.
// INVALID_ARGUMENT naming what is wrong.
absl::StatusOr<ModelLayout> ModelLayoutFromSpec(const ModelSection& model);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_MODEL_MLP_PARAMETERS_H_
