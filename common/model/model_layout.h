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

// What a dense tensor is (proto TensorKind): a parameter, which the optimizer trains, or
// a module's buffer (BatchNorm's running statistics), which the servers move by the
// change the workers' forward passes made to it. An integer buffer (int64 in the module,
// num_batches_tracked) is held as float32, exact up to 2^24, and written as I64.
enum class DenseTensorKind { kParameter, kFloatBuffer, kIntegerBuffer };
inline constexpr int64_t kMaxExactIntegerBuffer = int64_t{1} << 24;

// One named dense tensor inside the flat vector, row-major.
struct TensorSlot {
  std::string name;            // "fc1.weight", "fc1.bias", ... (PyTorch's names)
  std::vector<int64_t> shape;  // e.g. weight: {out, in}; bias: {out}
  int64_t offset = 0;          // first element in the flat vector
  DenseTensorKind kind = DenseTensorKind::kParameter;
  int64_t size() const;  // the product of the shape
  bool is_buffer() const { return kind != DenseTensorKind::kParameter; }
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
    DenseTensorKind kind = DenseTensorKind::kParameter;
  };

  // Lays `dense` out back to back in the given order. INVALID_ARGUMENT naming the tensor
  // for an empty or repeated name, a dimension < 1 or a size past 2^62, or a parameter
  // after a buffer (buffers follow every parameter); for an embedding
  // table with a repeated name, dim < 1 or a setting out of range (naming its key).
  static absl::StatusOr<ModelLayout> Create(const std::vector<DenseTensorSpec>& dense,
                                            std::vector<EmbeddingTableSlot> embeddings = {});
  // The empty layout: no tensors.
  ModelLayout() = default;

  const std::vector<TensorSlot>& dense_tensors() const { return dense_; }
  // The size of the flat vector: the sum of every dense tensor's size.
  int64_t dense_parameters() const { return dense_parameters_; }
  // The flat vector's trained part, [0, trained_parameters()): every parameter; the
  // buffers hold the rest.
  int64_t trained_parameters() const { return trained_parameters_; }
  const std::vector<EmbeddingTableSlot>& embedding_tables() const { return embeddings_; }

 private:
  std::vector<TensorSlot> dense_;
  int64_t dense_parameters_ = 0;
  int64_t trained_parameters_ = 0;
  std::vector<EmbeddingTableSlot> embeddings_;
};

// Reads a safetensors file holding every dense tensor of `layout` (F32, its shapes; an
// integer buffer I64 or F32) and returns the flat vector. INVALID_ARGUMENT naming the
// tensor if one is missing or has the wrong shape or dtype, or an integer buffer's value
// is past 2^24; the errors of ReadSafetensorsFile otherwise.
absl::StatusOr<std::vector<float>> LoadDenseParameters(const ModelLayout& layout,
                                                       const std::string& path);

// The flat vector cut into the layout's named, shaped tensors (F32; an integer buffer
// I64, each value rounded to the nearest integer).
// REQUIRES: params.size() == layout.dense_parameters().
std::vector<NamedTensor> DenseTensorsOf(const ModelLayout& layout,
                                        const std::vector<float>& params);

// Writes the flat vector as a safetensors file with the layout's names and shapes.
// REQUIRES: params.size() == layout.dense_parameters().
absl::Status SaveDenseParameters(const ModelLayout& layout, const std::vector<float>& params,
                                 const std::string& path);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_MODEL_MODEL_LAYOUT_H_
