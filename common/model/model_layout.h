// What a model's parameters are, independent of which model it is: named dense tensors,
// each with a shape and an offset in the one flat vector the servers shard by range,
// and row-keyed embedding tables, which are sharded by a hash of (table, id) instead
// and are not in the flat vector. PlaceShards, checkpoints and the
// safetensors import/export work from this; the MLP (common/model/mlp_parameters.h) is one
// producer of a layout, the CTR model and a user's PyTorch model will be others.
#ifndef PARAMSERVER_COMMON_MODEL_MODEL_LAYOUT_H_
#define PARAMSERVER_COMMON_MODEL_MODEL_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/checkpoint/safetensors.h"
#include "common/config/cluster_spec.h"

namespace paramserver {

// One named dense tensor inside the flat vector, row-major.
struct TensorSlot {
  std::string name;            // "fc1.weight", "fc1.bias", ... (PyTorch's names)
  std::vector<int64_t> shape;  // e.g. weight: {out, in}; bias: {out}
  int64_t offset = 0;          // first element in the flat vector
  int64_t size() const;        // the product of the shape
};

// A table of `dim`-wide rows keyed by a 64-bit id (a CTR model's feature embeddings),
// sharded by key across servers (embedding shards), rows created on first update.
struct EmbeddingTableSlot {
  std::string name;
  int64_t dim = 0;
  EmbeddingTableSettings settings;  // unset ones: the spec's
};

// Immutable; cheap to copy. Thread-compatible.
class ModelLayout {
 public:
  // A tensor's name and shape, before it has an offset.
  struct DenseTensorSpec {
    std::string name;
    std::vector<int64_t> shape;
  };

  // Lays `dense` out back to back in the given order. INVALID_ARGUMENT naming the tensor
  // for an empty or repeated name, a dimension < 1 or a size past 2^62; for an embedding
  // table with a repeated name, dim < 1 or a setting out of range (naming its key).
  static absl::StatusOr<ModelLayout> Create(const std::vector<DenseTensorSpec>& dense,
                                            std::vector<EmbeddingTableSlot> embeddings = {});
  // The empty layout: no tensors.
  ModelLayout() = default;

  const std::vector<TensorSlot>& dense_tensors() const { return dense_; }
  // The size of the flat vector: the sum of every dense tensor's size.
  int64_t dense_parameters() const { return dense_parameters_; }
  const std::vector<EmbeddingTableSlot>& embedding_tables() const { return embeddings_; }

 private:
  std::vector<TensorSlot> dense_;
  int64_t dense_parameters_ = 0;
  std::vector<EmbeddingTableSlot> embeddings_;
};

// Reads a safetensors file holding every dense tensor of `layout` (F32, its shapes) and
// returns the flat vector. INVALID_ARGUMENT naming the tensor if one is missing or has the
// wrong shape; the errors of ReadSafetensorsFile otherwise.
absl::StatusOr<std::vector<float>> LoadDenseParameters(const ModelLayout& layout,
                                                       const std::string& path);

// The flat vector cut into the layout's named, shaped tensors (F32).
// REQUIRES: params.size() == layout.dense_parameters().
std::vector<NamedTensor> DenseTensorsOf(const ModelLayout& layout,
                                        const std::vector<float>& params);

// Writes the flat vector as a safetensors file with the layout's names and shapes.
// REQUIRES: params.size() == layout.dense_parameters().
absl::Status SaveDenseParameters(const ModelLayout& layout, const std::vector<float>& params,
                                 const std::string& path);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_MODEL_MODEL_LAYOUT_H_
