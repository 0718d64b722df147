// The MLP's parameters as one flat float vector: the layout (PyTorch names, shapes,
// offsets) and the default initialisation. Servers and workers share both.
#ifndef PARAMSERVER_COMMON_MLP_PARAMETERS_H_
#define PARAMSERVER_COMMON_MLP_PARAMETERS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace paramserver {

// One named tensor inside the flat vector.
struct TensorSlot {
  std::string name;            // "fc1.weight", "fc1.bias", "fc2.weight", ...
  std::vector<int64_t> shape;  // weight: {out, in}; bias: {out}
  int64_t offset = 0;          // first element in the flat vector
  int64_t size() const;
};

// The flat layout of an MLP with widths `layers` (input, hidden..., classes):
// fc1.weight [layers[1], layers[0]] row-major, fc1.bias [layers[1]], fc2.weight, ...
// in that order, as torch.nn.Linear stores them.
class MlpLayout {
 public:
  // REQUIRES: layers.size() >= 2 and every width >= 1.
  explicit MlpLayout(std::vector<int64_t> layers);

  const std::vector<int64_t>& layers() const { return layers_; }
  int num_layers() const { return static_cast<int>(layers_.size()) - 1; }
  const std::vector<TensorSlot>& tensors() const { return tensors_; }
  const TensorSlot& weight(int layer) const { return tensors_[2 * layer]; }
  const TensorSlot& bias(int layer) const { return tensors_[2 * layer + 1]; }
  int64_t total_parameters() const { return total_; }

 private:
  std::vector<int64_t> layers_;
  std::vector<TensorSlot> tensors_;
  int64_t total_ = 0;
};

// PyTorch nn.Linear's default distribution: every weight and bias of layer l drawn
// from U(-1/sqrt(fan_in), 1/sqrt(fan_in)), from a generator seeded with `seed`.
// Deterministic for a given seed on every platform.
std::vector<float> InitializeMlpParameters(const MlpLayout& layout, uint64_t seed);

// Reads a safetensors file holding every tensor of `layout` (F32, the shapes above)
// and returns the flat vector. INVALID_ARGUMENT naming the tensor if one is missing
// or has the wrong shape; the errors of ReadSafetensorsFile otherwise.
absl::StatusOr<std::vector<float>> LoadMlpParameters(const MlpLayout& layout,
                                                     const std::string& path);

// Writes the flat vector as a safetensors file with the layout's names and shapes.
// REQUIRES: params.size() == layout.total_parameters().
absl::Status SaveMlpParameters(const MlpLayout& layout, const std::vector<float>& params,
                               const std::string& path);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_MLP_PARAMETERS_H_
