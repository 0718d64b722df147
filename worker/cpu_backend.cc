#include "worker/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace paramserver {

CpuBackend::CpuBackend(MlpLayout layout, int blas_threads)
    : layout_(std::move(layout)), activations_(layout_.num_layers()) {
  openblas_set_num_threads(blas_threads);
}

void CpuBackend::Forward(const float* params, const BatchView& batch) {
  const int64_t rows = batch.size;
  const float* input = batch.features;
  for (int l = 0; l < layout_.num_layers(); ++l) {
    const int64_t in = layout_.layers()[l];
    const int64_t out = layout_.layers()[l + 1];
    const bool last = l + 1 == layout_.num_layers();
    std::vector<float>& output = last ? logits_ : activations_[l + 1];
    output.resize(rows * out);
    const float* weight = params + layout_.weight(l).offset;
    const float* bias = params + layout_.bias(l).offset;
    // output[B, out] = input[B, in] * weight[out, in]^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, out, in, 1.0f, input, in, weight, in,
                0.0f, output.data(), out);
    for (int64_t r = 0; r < rows; ++r) {
      float* row = output.data() + r * out;
      for (int64_t j = 0; j < out; ++j) {
        row[j] += bias[j];
        if (!last) row[j] = std::max(row[j], 0.0f);
      }
    }
    input = output.data();
  }
}

absl::StatusOr<float> CpuBackend::ComputeGradients(absl::Span<const float> params,
                                                   const BatchView& batch,
                                                   absl::Span<float> gradient) {
  // The same arithmetic either way, so that streaming never changes a gradient.
  return ComputeGradientsStreamed(params, batch, gradient, nullptr);
}

absl::StatusOr<float> CpuBackend::ComputeGradientsStreamed(absl::Span<const float> params,
                                                           const BatchView& batch,
                                                           absl::Span<float> gradient,
                                                           const GradientReadyCallback& on_ready) {
  if (absl::Status s = CheckBackendInputs(layout_, params, batch); !s.ok()) return s;
  if (gradient.size() != params.size()) {
    return absl::InvalidArgumentError(absl::StrCat("gradient buffer holds ", gradient.size(),
                                                   " values, expected ", params.size()));
  }
  Forward(params.data(), batch);
  const int64_t rows = batch.size;
  const int64_t classes = layout_.layers().back();
  // Softmax cross-entropy: loss = mean(logsumexp(z) - z_y); dz = (softmax(z) - onehot(y)) / B.
  delta_.resize(rows * classes);
  double loss_sum = 0;
  const float inv_rows = 1.0f / static_cast<float>(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = logits_.data() + r * classes;
    float* dz = delta_.data() + r * classes;
    const float max_logit = *std::max_element(z, z + classes);
    float sum = 0;
    for (int64_t j = 0; j < classes; ++j) {
      dz[j] = std::exp(z[j] - max_logit);
      sum += dz[j];
    }
    const int label = batch.labels[r];
    loss_sum += std::log(sum) + max_logit - z[label];
    const float inv_sum = 1.0f / sum;
    for (int64_t j = 0; j < classes; ++j) dz[j] = dz[j] * inv_sum * inv_rows;
    dz[label] -= inv_rows;
  }
  for (int l = layout_.num_layers() - 1; l >= 0; --l) {
    const int64_t in = layout_.layers()[l];
    const int64_t out = layout_.layers()[l + 1];
    const float* input = l == 0 ? batch.features : activations_[l].data();
    float* weight_grad = gradient.data() + layout_.weight(l).offset;
    float* bias_grad = gradient.data() + layout_.bias(l).offset;
    // The bias first: it follows the weight in the flat vector, so the finished part
    // stays one suffix as the weight's rows follow, last rows first.
    std::fill(bias_grad, bias_grad + out, 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = delta_.data() + r * out;
      for (int64_t j = 0; j < out; ++j) bias_grad[j] += row[j];
    }
    if (on_ready) on_ready(layout_.bias(l).offset);
    const int64_t block_rows = std::max<int64_t>(1, kValuesPerReport / in);
    for (int64_t row_end = out; row_end > 0; row_end -= block_rows) {
      const int64_t row_begin = std::max<int64_t>(0, row_end - block_rows);
      // weight_grad[row_begin:row_end, in] = delta[B, row_begin:row_end]^T * input[B, in]
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, row_end - row_begin, in, rows, 1.0f,
                  delta_.data() + row_begin, out, input, in, 0.0f, weight_grad + row_begin * in,
                  in);
      if (on_ready) on_ready(layout_.weight(l).offset + row_begin * in);
    }
    if (l == 0) break;
    // next_delta[B, in] = delta[B, out] * weight[out, in], masked by ReLU's derivative.
    next_delta_.resize(rows * in);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, in, out, 1.0f, delta_.data(), out,
                params.data() + layout_.weight(l).offset, in, 0.0f, next_delta_.data(), in);
    for (int64_t i = 0; i < rows * in; ++i) {
      if (input[i] <= 0.0f) next_delta_[i] = 0.0f;
    }
    delta_.swap(next_delta_);
  }
  return static_cast<float>(loss_sum / rows);
}

absl::StatusOr<int64_t> CpuBackend::CountCorrect(absl::Span<const float> params,
                                                 const BatchView& batch) {
  if (absl::Status s = CheckBackendInputs(layout_, params, batch); !s.ok()) return s;
  Forward(params.data(), batch);
  const int64_t classes = layout_.layers().back();
  int64_t correct = 0;
  for (int64_t r = 0; r < batch.size; ++r) {
    const float* z = logits_.data() + r * classes;
    if (std::max_element(z, z + classes) - z == batch.labels[r]) ++correct;
  }
  return correct;
}

}  // namespace paramserver
