#include "worker/ctr_model.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace paramserver {

int64_t CtrModelShape::column(int field) const {
  if (table_dims.empty()) return dense_features + int64_t{field} * embedding_dim;
  int64_t at = dense_features;
  for (int k = 0; k < field; ++k) at += table_dims[k];
  return at;
}

int64_t CtrModelShape::input_width() const { return column(categorical_features); }

bool CtrModelShape::uniform_dims() const {
  return std::all_of(table_dims.begin(), table_dims.end(),
                     [this](int d) { return d == embedding_dim; });
}

absl::Status ValidateCtrModelShape(const CtrModelShape& shape) {
  if (shape.dense_features < 0 || shape.categorical_features < 1 || shape.embedding_dim < 1) {
    return absl::InvalidArgumentError(
        "ctr model: dense_features >= 0, categorical_features >= 1 and embedding_dim >= 1");
  }
  if (!shape.table_dims.empty() &&
      (static_cast<int>(shape.table_dims.size()) != shape.categorical_features ||
       *std::min_element(shape.table_dims.begin(), shape.table_dims.end()) < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("ctr model: one table dim >= 1 per field (",
                                                   shape.categorical_features, "), got ",
                                                   shape.table_dims.size()));
  }
  const int64_t input = shape.input_width();
  if (shape.layers.size() < 2 || shape.layers.front() != input) {
    return absl::InvalidArgumentError(
        absl::StrCat("ctr model: layers[0] must be dense_features + the tables' dims = ", input));
  }
  if (shape.layers.back() != 1) {
    return absl::InvalidArgumentError("ctr model: the last layer must be 1 (one logit)");
  }
  for (int64_t width : shape.layers) {
    if (width < 1) return absl::InvalidArgumentError("ctr model: every layer width must be >= 1");
  }
  return absl::OkStatus();
}

BatchRows DeduplicateIds(const CtrModelShape& shape, const CtrBatchView& batch) {
  const int fields = shape.categorical_features;
  BatchRows result;
  result.unique_ids.resize(fields);
  result.row_of.assign(batch.size * fields, -1);
  // Per field, one pass numbers the distinct ids in the order they first appear (a hash
  // map), then only the distinct ids are sorted, and a second pass turns each example's
  // number into its id's rank. A binary search per example in the sorted ids costs a
  // mispredicted branch per halving: with it, this took about half of a CTR worker's CPU
  // (2 x 2, MLP 429-32-1, perf).
  absl::flat_hash_map<int64_t, int32_t> number_of;
  std::vector<std::pair<int64_t, int32_t>> by_id;  // (id, number), sorted by id
  std::vector<int32_t> rank_of;                    // by number
  for (int k = 0; k < fields; ++k) {
    // Abseil's clear() frees a table of more than 127 slots: sized again for the batch,
    // once, rather than grown by rehashes.
    number_of.clear();
    number_of.reserve(batch.size);
    by_id.clear();
    for (int64_t b = 0; b < batch.size; ++b) {
      const int64_t id = batch.ids[b * fields + k];
      if (id < 0) continue;
      const auto [found, inserted] = number_of.try_emplace(id, static_cast<int32_t>(by_id.size()));
      if (inserted) by_id.emplace_back(id, found->second);
      result.row_of[b * fields + k] = found->second;
    }
    std::sort(by_id.begin(), by_id.end());
    std::vector<int64_t>& unique = result.unique_ids[k];
    unique.resize(by_id.size());
    rank_of.resize(by_id.size());
    for (size_t rank = 0; rank < by_id.size(); ++rank) {
      unique[rank] = by_id[rank].first;
      rank_of[by_id[rank].second] = static_cast<int32_t>(rank);
    }
    for (int64_t b = 0; b < batch.size; ++b) {
      int32_t& at = result.row_of[b * fields + k];
      if (at >= 0) at = rank_of[at];
    }
  }
  return result;
}

namespace {

// The MLP's input per example: its dense features, then each field's row (zeros for a
// missing id), [n, shape.layers[0]].
std::vector<float> AssembleInput(const CtrModelShape& shape, const CtrBatchView& batch,
                                 const BatchRows& batch_rows,
                                 const std::vector<std::vector<float>>& rows) {
  const int64_t n = batch.size;
  const int fields = shape.categorical_features;
  const int64_t input = shape.layers[0];
  std::vector<int64_t> columns(fields);
  for (int k = 0; k < fields; ++k) columns[k] = shape.column(k);
  std::vector<float> x(n * input, 0.0f);
  for (int64_t b = 0; b < n; ++b) {
    float* row = x.data() + b * input;
    std::copy(batch.dense + b * shape.dense_features, batch.dense + (b + 1) * shape.dense_features,
              row);
    for (int k = 0; k < fields; ++k) {
      const int32_t at = batch_rows.row_of[b * fields + k];
      if (at < 0) continue;
      const int dim = shape.dim(k);
      std::copy(rows[k].begin() + int64_t{at} * dim, rows[k].begin() + int64_t{at + 1} * dim,
                row + columns[k]);
    }
  }
  return x;
}

// Fills activations[1..layers] from activations[0] (the input): activations[l] is the
// input of layer l (after ReLU); the last is the logits.
void Forward(const CtrModelShape& shape, const MlpLayout& layout, absl::Span<const float> mlp,
             int64_t n, std::vector<std::vector<float>>* activations) {
  const int layers = layout.num_layers();
  for (int l = 0; l < layers; ++l) {
    const int64_t in = shape.layers[l], out = shape.layers[l + 1];
    const float* weight = mlp.data() + layout.weight(l).offset;
    const float* bias = mlp.data() + layout.bias(l).offset;
    std::vector<float>& next = (*activations)[l + 1];
    next.resize(n * out);
    // next[n, out] = h[n, in] * W[out, in]^T, then the bias and (between layers) ReLU.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0f, (*activations)[l].data(),
                in, weight, in, 0.0f, next.data(), out);
    for (int64_t b = 0; b < n; ++b) {
      float* z = next.data() + b * out;
      for (int64_t o = 0; o < out; ++o) {
        z[o] += bias[o];
        if (l + 1 < layers) z[o] = std::max(z[o], 0.0f);
      }
    }
  }
}

// Backpropagates the mean log loss from the logits into *dense_gradient (the MLP's, in
// MlpLayout order) and returns d loss / d input, [n, shape.layers[0]].
std::vector<float> Backward(const CtrModelShape& shape, const MlpLayout& layout,
                            absl::Span<const float> mlp, const CtrBatchView& batch,
                            const std::vector<std::vector<float>>& activations,
                            std::vector<float>* dense_gradient) {
  const int64_t n = batch.size;
  const int layers = layout.num_layers();
  const std::vector<float>& logits = activations[layers];
  dense_gradient->assign(layout.total_parameters(), 0.0f);
  // g: d loss / d (layer output), per example; starts at the logit.
  std::vector<float> g(n);
  for (int64_t b = 0; b < n; ++b) {
    const float probability = 1.0f / (1.0f + std::exp(-logits[b]));
    g[b] = (probability - batch.labels[b]) / static_cast<float>(n);
  }
  for (int l = layers - 1; l >= 0; --l) {
    const int64_t in = shape.layers[l], out = shape.layers[l + 1];
    const float* weight = mlp.data() + layout.weight(l).offset;
    float* weight_gradient = dense_gradient->data() + layout.weight(l).offset;
    float* bias_gradient = dense_gradient->data() + layout.bias(l).offset;
    const std::vector<float>& h = activations[l];
    for (int64_t b = 0; b < n; ++b) {
      for (int64_t o = 0; o < out; ++o) bias_gradient[o] += g[b * out + o];
    }
    // weight_gradient[out, in] = g[n, out]^T * h[n, in]; g_in[n, in] = g[n, out] * W[out, in].
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, n, 1.0f, g.data(), out, h.data(),
                in, 0.0f, weight_gradient, in);
    std::vector<float> g_in(n * in);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, in, out, 1.0f, g.data(), out, weight,
                in, 0.0f, g_in.data(), in);
    if (l > 0) {  // through the ReLU that made h
      for (int64_t i = 0; i < n * in; ++i) {
        if (h[i] <= 0) g_in[i] = 0;
      }
    }
    g = std::move(g_in);
  }
  return g;
}

// The embedding segments of d loss / d input, summed per unique row, example by example.
std::vector<std::vector<float>> RowGradients(const CtrModelShape& shape, int64_t n,
                                             const BatchRows& batch_rows,
                                             const std::vector<float>& input_gradient) {
  const int fields = shape.categorical_features;
  const int64_t input = shape.layers[0];
  std::vector<std::vector<float>> row_gradients(fields);
  std::vector<int64_t> columns(fields);
  for (int k = 0; k < fields; ++k) {
    row_gradients[k].assign(batch_rows.unique_ids[k].size() * shape.dim(k), 0.0f);
    columns[k] = shape.column(k);
  }
  for (int64_t b = 0; b < n; ++b) {
    for (int k = 0; k < fields; ++k) {
      const int32_t at = batch_rows.row_of[b * fields + k];
      if (at < 0) continue;
      const int dim = shape.dim(k);
      const float* from = input_gradient.data() + b * input + columns[k];
      float* to = row_gradients[k].data() + int64_t{at} * dim;
      for (int e = 0; e < dim; ++e) to[e] += from[e];
    }
  }
  return row_gradients;
}

}  // namespace

CtrStepResult CtrForwardBackward(const CtrModelShape& shape, absl::Span<const float> mlp,
                                 const CtrBatchView& batch, const BatchRows& batch_rows,
                                 const std::vector<std::vector<float>>& rows, bool backward) {
  const MlpLayout layout(shape.layers);
  const int64_t n = batch.size;
  const int layers = layout.num_layers();
  std::vector<std::vector<float>> activations(layers + 1);
  activations[0] = AssembleInput(shape, batch, batch_rows, rows);
  Forward(shape, layout, mlp, n, &activations);
  CtrStepResult result;
  result.logits = activations[layers];
  double loss = 0;
  for (int64_t b = 0; b < n; ++b) {
    const double z = result.logits[b];
    loss += std::max(z, 0.0) - z * batch.labels[b] + std::log1p(std::exp(-std::abs(z)));
  }
  result.loss = loss / static_cast<double>(n);
  if (!backward) return result;
  const std::vector<float> input_gradient =
      Backward(shape, layout, mlp, batch, activations, &result.dense_gradient);
  result.row_gradients = RowGradients(shape, n, batch_rows, input_gradient);
  return result;
}

}  // namespace paramserver
