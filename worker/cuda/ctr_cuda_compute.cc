#include "worker/cuda/ctr_cuda_compute.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "worker/cuda/ctr_kernels.h"
#include "worker/cuda/cuda_status.h"
#include "worker/cuda/mlp_kernels.h"
#include "worker/cuda/row_major_gemm.h"

namespace paramserver {
namespace cuda {
namespace {

template <typename T>
absl::Status CopyUp(T* device, const T* host, size_t count, cudaStream_t stream, const char* what) {
  if (count == 0) return absl::OkStatus();
  return CudaCallStatus(
      cudaMemcpyAsync(device, host, count * sizeof(T), cudaMemcpyHostToDevice, stream),
      absl::StrCat("cudaMemcpyAsync(", what, " to device)"));
}

template <typename T>
absl::Status CopyDown(T* host, const T* device, size_t count, cudaStream_t stream,
                      const char* what) {
  if (count == 0) return absl::OkStatus();
  return CudaCallStatus(
      cudaMemcpyAsync(host, device, count * sizeof(T), cudaMemcpyDeviceToHost, stream),
      absl::StrCat("cudaMemcpyAsync(", what, " to host)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CtrCudaCompute>> CtrCudaCompute::Create(CtrModelShape shape,
                                                                       int device) {
  if (!shape.uniform_dims()) {
    // The kernels gather rows of one width; tables of their own dims train on the CPU.
    return absl::FailedPreconditionError(
        "the GPU's ctr step needs one dim for every table (model.embedding_dim), and "
        "model.tables gives some tables their own: this job computes on the CPU "
        "(worker.device: cpu or auto)");
  }
  std::unique_ptr<CtrCudaCompute> compute(new CtrCudaCompute(std::move(shape), device));
  PS_RETURN_IF_ERROR(compute->Initialize());
  return compute;
}

CtrCudaCompute::CtrCudaCompute(CtrModelShape shape, int device)
    : shape_(std::move(shape)), layout_(shape_.layers), device_(device) {}

CtrCudaCompute::~CtrCudaCompute() {
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

std::string CtrCudaCompute::name() const { return absl::StrCat("cuda:", device_); }

absl::Status CtrCudaCompute::Initialize() {
  PS_RETURN_IF_ERROR(OpenStreamAndCublas(device_, &stream_, &cublas_));
  const size_t total = layout_.total_parameters();
  PS_RETURN_IF_ERROR(params_.Reserve(total, "parameters"));
  PS_RETURN_IF_ERROR(gradient_.Reserve(total, "gradient"));
  PS_RETURN_IF_ERROR(loss_sum_.Reserve(1, "loss"));
  PS_RETURN_IF_ERROR(row_base_.Reserve(shape_.categorical_features, "row bases"));
  for (int l = 0; l < layout_.num_layers(); ++l)
    activations_.push_back(std::make_unique<DeviceBuffer<float>>());
  return absl::OkStatus();
}

absl::Status CtrCudaCompute::Reserve(int64_t examples, int64_t unique_rows,
                                     int64_t segment_examples) {
  const int64_t input = shape_.layers.front();
  const int64_t widest = *std::max_element(shape_.layers.begin(), shape_.layers.end());
  const int64_t dim = shape_.embedding_dim;
  const int64_t n = std::max<int64_t>(examples, 1);
  PS_RETURN_IF_ERROR(dense_.Reserve(n * std::max(shape_.dense_features, 1), "dense features"));
  PS_RETURN_IF_ERROR(labels_.Reserve(n, "labels"));
  PS_RETURN_IF_ERROR(row_of_.Reserve(n * shape_.categorical_features, "row indices"));
  PS_RETURN_IF_ERROR(rows_.Reserve(std::max<int64_t>(unique_rows, 1) * dim, "rows"));
  PS_RETURN_IF_ERROR(
      row_gradients_.Reserve(std::max<int64_t>(unique_rows, 1) * dim, "row gradients"));
  PS_RETURN_IF_ERROR(segment_begin_.Reserve(unique_rows + 1, "segments"));
  PS_RETURN_IF_ERROR(column_.Reserve(std::max<int64_t>(unique_rows, 1), "segment columns"));
  PS_RETURN_IF_ERROR(
      segment_examples_.Reserve(std::max<int64_t>(segment_examples, 1), "segment examples"));
  PS_RETURN_IF_ERROR(x_.Reserve(n * input, "inputs"));
  PS_RETURN_IF_ERROR(dx_.Reserve(n * input, "input gradients"));
  for (int l = 1; l < layout_.num_layers(); ++l) {
    PS_RETURN_IF_ERROR(activations_[l]->Reserve(n * shape_.layers[l], "activations"));
  }
  PS_RETURN_IF_ERROR(logits_.Reserve(n, "logits"));
  PS_RETURN_IF_ERROR(delta_.Reserve(n * widest, "deltas"));
  PS_RETURN_IF_ERROR(next_delta_.Reserve(n * widest, "deltas"));
  return row_loss_.Reserve(n, "row losses");
}

absl::Status CtrCudaCompute::Forward(int examples) {
  const float* input = x_.data();
  for (int l = 0; l < layout_.num_layers(); ++l) {
    const int in = static_cast<int>(shape_.layers[l]);
    const int out = static_cast<int>(shape_.layers[l + 1]);
    const bool last = l + 1 == layout_.num_layers();
    float* output = last ? logits_.data() : activations_[l + 1]->data();
    PS_RETURN_IF_ERROR(
        CublasCallStatus(RowMajorTimesTransposed(cublas_, examples, out, in, input,
                                                 params_.data() + layout_.weight(l).offset, output),
                         absl::StrCat("cublasSgemm(forward, layer ", l + 1, ")")));
    PS_RETURN_IF_ERROR(
        CudaCallStatus(LaunchBiasActivation(output, params_.data() + layout_.bias(l).offset,
                                            examples, out, !last, stream_),
                       absl::StrCat("bias/ReLU kernel (layer ", l + 1, ")")));
    input = output;
  }
  return absl::OkStatus();
}

absl::Status CtrCudaCompute::Backward(int examples) {
  float* delta = delta_.data();
  float* next_delta = next_delta_.data();
  PS_RETURN_IF_ERROR(CudaCallStatus(LaunchLogisticLoss(logits_.data(), labels_.data(), examples,
                                                       delta, row_loss_.data(), stream_),
                                    "logistic loss kernel"));
  for (int l = layout_.num_layers() - 1; l >= 0; --l) {
    const int in = static_cast<int>(shape_.layers[l]);
    const int out = static_cast<int>(shape_.layers[l + 1]);
    const float* input = l == 0 ? x_.data() : activations_[l]->data();
    PS_RETURN_IF_ERROR(
        CublasCallStatus(WeightGradient(cublas_, examples, out, in, delta, input,
                                        gradient_.data() + layout_.weight(l).offset),
                         absl::StrCat("cublasSgemm(weight gradient, layer ", l + 1, ")")));
    PS_RETURN_IF_ERROR(CudaCallStatus(
        LaunchColumnSums(delta, examples, out, gradient_.data() + layout_.bias(l).offset, stream_),
        absl::StrCat("bias gradient kernel (layer ", l + 1, ")")));
    // Layer 0's input gradient is the rows' (no ReLU before it).
    float* in_gradient = l == 0 ? dx_.data() : next_delta;
    PS_RETURN_IF_ERROR(
        CublasCallStatus(InputGradient(cublas_, examples, out, in, delta,
                                       params_.data() + layout_.weight(l).offset, in_gradient),
                         absl::StrCat("cublasSgemm(input gradient, layer ", l + 1, ")")));
    if (l == 0) break;
    PS_RETURN_IF_ERROR(CudaCallStatus(
        LaunchReluBackward(next_delta, input, static_cast<int64_t>(examples) * in, stream_),
        absl::StrCat("ReLU gradient kernel (layer ", l, ")")));
    std::swap(delta, next_delta);
  }
  return absl::OkStatus();
}

RowSegments RowSegments::Of(const CtrModelShape& shape, int64_t examples, const BatchRows& rows,
                            const std::vector<std::vector<float>>& pulled) {
  const int fields = shape.categorical_features;
  const int dim = shape.embedding_dim;
  RowSegments segments;
  segments.row_base.resize(fields);
  for (int k = 0; k < fields; ++k) {
    segments.row_base[k] = segments.unique;
    segments.unique += static_cast<int32_t>(rows.unique_ids[k].size());
    segments.all_rows.insert(segments.all_rows.end(), pulled[k].begin(), pulled[k].end());
  }
  const int32_t unique = segments.unique;
  const std::vector<int32_t>& row_base = segments.row_base;
  std::vector<int32_t>& segment_begin = segments.segment_begin;
  segment_begin.assign(unique + 1, 0);
  for (int64_t b = 0; b < examples; ++b) {
    for (int k = 0; k < fields; ++k) {
      const int32_t at = rows.row_of[b * fields + k];
      if (at >= 0) ++segment_begin[row_base[k] + at + 1];
    }
  }
  for (int32_t s = 0; s < unique; ++s) segment_begin[s + 1] += segment_begin[s];
  segments.segment_examples.resize(segment_begin[unique]);
  std::vector<int32_t> filled(segment_begin.begin(), segment_begin.end() - 1);
  for (int64_t b = 0; b < examples; ++b) {
    for (int k = 0; k < fields; ++k) {
      const int32_t at = rows.row_of[b * fields + k];
      if (at >= 0) segments.segment_examples[filled[row_base[k] + at]++] = static_cast<int32_t>(b);
    }
  }
  segments.column.resize(unique);
  for (int k = 0; k < fields; ++k) {
    for (size_t u = 0; u < rows.unique_ids[k].size(); ++u)
      segments.column[row_base[k] + u] = shape.dense_features + k * dim;
  }
  return segments;
}

absl::Status CtrCudaCompute::Upload(absl::Span<const float> mlp, const CtrBatchView& batch,
                                    const BatchRows& rows, const RowSegments& segments) {
  const int examples = static_cast<int>(batch.size);
  PS_RETURN_IF_ERROR(CudaCallStatus(cudaSetDevice(device_), "cudaSetDevice"));
  PS_RETURN_IF_ERROR(
      Reserve(examples, segments.unique, static_cast<int64_t>(segments.segment_examples.size())));
  PS_RETURN_IF_ERROR(CopyUp(params_.data(), mlp.data(), mlp.size(), stream_, "parameters"));
  PS_RETURN_IF_ERROR(CopyUp(dense_.data(), batch.dense,
                            static_cast<size_t>(examples) * shape_.dense_features, stream_,
                            "dense features"));
  PS_RETURN_IF_ERROR(CopyUp(labels_.data(), batch.labels, examples, stream_, "labels"));
  PS_RETURN_IF_ERROR(
      CopyUp(row_of_.data(), rows.row_of.data(), rows.row_of.size(), stream_, "row indices"));
  PS_RETURN_IF_ERROR(CopyUp(row_base_.data(), segments.row_base.data(), segments.row_base.size(),
                            stream_, "row bases"));
  PS_RETURN_IF_ERROR(
      CopyUp(rows_.data(), segments.all_rows.data(), segments.all_rows.size(), stream_, "rows"));
  return CudaCallStatus(
      LaunchGatherInput(dense_.data(), row_of_.data(), row_base_.data(), rows_.data(), examples,
                        shape_.dense_features, shape_.categorical_features, shape_.embedding_dim,
                        x_.data(), stream_),
      "gather kernel");
}

absl::Status CtrCudaCompute::DownloadGradients(const RowSegments& segments, const BatchRows& rows,
                                               size_t mlp_size, int examples,
                                               CtrStepResult* result) {
  const int fields = shape_.categorical_features;
  const int dim = shape_.embedding_dim;
  const int input = static_cast<int>(shape_.layers.front());
  PS_RETURN_IF_ERROR(CopyUp(segment_begin_.data(), segments.segment_begin.data(),
                            segments.segment_begin.size(), stream_, "segments"));
  PS_RETURN_IF_ERROR(CopyUp(segment_examples_.data(), segments.segment_examples.data(),
                            segments.segment_examples.size(), stream_, "segment examples"));
  PS_RETURN_IF_ERROR(CopyUp(column_.data(), segments.column.data(), segments.column.size(), stream_,
                            "segment columns"));
  PS_RETURN_IF_ERROR(CudaCallStatus(
      LaunchSegmentSums(dx_.data(), input, segment_begin_.data(), segment_examples_.data(),
                        column_.data(), segments.unique, dim, row_gradients_.data(), stream_),
      "segmented-sum kernel"));
  result->dense_gradient.resize(mlp_size);
  PS_RETURN_IF_ERROR(
      CopyDown(result->dense_gradient.data(), gradient_.data(), mlp_size, stream_, "gradient"));
  std::vector<float> row_gradients(static_cast<size_t>(segments.unique) * dim);
  PS_RETURN_IF_ERROR(CopyDown(row_gradients.data(), row_gradients_.data(), row_gradients.size(),
                              stream_, "row gradients"));
  PS_RETURN_IF_ERROR(CopyDown(result->logits.data(), logits_.data(), examples, stream_, "logits"));
  PS_RETURN_IF_ERROR(CudaCallStatus(cudaStreamSynchronize(stream_),
                                    "cudaStreamSynchronize(after the training step)"));
  result->row_gradients.resize(fields);
  for (int k = 0; k < fields; ++k) {
    const size_t first = static_cast<size_t>(segments.row_base[k]) * dim;
    result->row_gradients[k].assign(
        row_gradients.begin() + first,
        row_gradients.begin() + first + rows.unique_ids[k].size() * dim);
  }
  return absl::OkStatus();
}

absl::StatusOr<CtrStepResult> CtrCudaCompute::Step(absl::Span<const float> mlp,
                                                   const CtrBatchView& batch, const BatchRows& rows,
                                                   const std::vector<std::vector<float>>& pulled,
                                                   bool backward) {
  const int examples = static_cast<int>(batch.size);
  const RowSegments segments = RowSegments::Of(shape_, examples, rows, pulled);
  PS_RETURN_IF_ERROR(Upload(mlp, batch, rows, segments));
  PS_RETURN_IF_ERROR(Forward(examples));
  CtrStepResult result;
  result.logits.resize(examples);
  if (backward) {
    PS_RETURN_IF_ERROR(Backward(examples));
    PS_RETURN_IF_ERROR(DownloadGradients(segments, rows, mlp.size(), examples, &result));
  } else {
    PS_RETURN_IF_ERROR(CopyDown(result.logits.data(), logits_.data(), examples, stream_, "logits"));
    PS_RETURN_IF_ERROR(
        CudaCallStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize(after evaluation)"));
  }
  // The loss in double, as the CPU reports it (the kernel's per-example terms are float).
  double loss = 0;
  for (int b = 0; b < examples; ++b) {
    const double z = result.logits[b];
    loss += std::max(z, 0.0) - z * batch.labels[b] + std::log1p(std::exp(-std::abs(z)));
  }
  result.loss = examples > 0 ? loss / examples : 0;
  return result;
}

}  // namespace cuda
}  // namespace paramserver
