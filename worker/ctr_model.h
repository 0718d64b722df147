// The CTR model's step on the CPU, sparse: dense features and one embedding table per
// categorical field, then an MLP to one logit, trained with the mean BCE-with-logits.
//
//   x = concat(dense, row of C1's id, ..., row of C<k>'s id)   (a missing id: zeros)
//   logit = MLP(x)      (nn.Linear layers with ReLU between, the last of width 1)
//   loss = mean over the batch of max(z,0) - z*y + log(1 + exp(-|z|))
//
// The worker never holds a table: a step deduplicates each field's ids in the batch
// (DeduplicateIds), pulls only those rows, and gets back the dense gradient and one
// gradient row per unique id, accumulated over the examples in ascending order, so a
// sync run is bit-reproducible whatever the batch's id repeats.
#ifndef PARAMSERVER_WORKER_CTR_MODEL_H_
#define PARAMSERVER_WORKER_CTR_MODEL_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/model/mlp_parameters.h"

namespace paramserver {

struct CtrModelShape {
  int dense_features = 13;
  int categorical_features = 26;
  int embedding_dim = 16;  // every table's, unless table_dims gives each its own
  // The MLP: layers[0] == input_width(), the last 1.
  std::vector<int64_t> layers;
  // Field k's table dim (model.tables); empty: embedding_dim for every field.
  std::vector<int> table_dims;

  int dim(int field) const { return table_dims.empty() ? embedding_dim : table_dims[field]; }
  // Where field k's row starts in the MLP's input (after the dense features and the rows
  // of the fields before it).
  int64_t column(int field) const;
  // dense_features + every field's dim.
  int64_t input_width() const;
  // Whether every field's table has embedding_dim.
  bool uniform_dims() const;
};

// INVALID_ARGUMENT naming what is wrong with `shape`.
absl::Status ValidateCtrModelShape(const CtrModelShape& shape);

// A batch of examples, row-major as CtrDataset stores them (worker/criteo_dataset.h):
// dense[b * dense_features + j], ids[b * categorical_features + k] (-1: missing).
struct CtrBatchView {
  int64_t size = 0;
  const float* dense = nullptr;
  const int64_t* ids = nullptr;
  const float* labels = nullptr;
};

// Each field's distinct ids in the batch, ascending, and where each example's id is.
struct BatchRows {
  std::vector<std::vector<int64_t>> unique_ids;  // per field
  std::vector<int32_t> row_of;  // [b * fields + k]: index into unique_ids[k]; -1: missing
};
BatchRows DeduplicateIds(const CtrModelShape& shape, const CtrBatchView& batch);

struct CtrStepResult {
  double loss = 0;                                // the batch's mean loss
  std::vector<float> logits;                      // per example
  std::vector<float> dense_gradient;              // the MLP's, in MlpLayout order
  std::vector<std::vector<float>> row_gradients;  // per field k: unique ids x dim(k)
};

// The forward and backward pass of one batch. `mlp` holds the MLP's parameters (MlpLayout
// of shape.layers); `rows[k]` holds field k's pulled rows, unique_ids[k].size() x dim(k), in
// BatchRows order. With `backward` false only loss and logits are filled (evaluation).
// REQUIRES: a valid shape, sizes as described.
CtrStepResult CtrForwardBackward(const CtrModelShape& shape, absl::Span<const float> mlp,
                                 const CtrBatchView& batch, const BatchRows& batch_rows,
                                 const std::vector<std::vector<float>>& rows, bool backward);

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_CTR_MODEL_H_
