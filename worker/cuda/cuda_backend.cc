#include "worker/cuda/cuda_backend.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "worker/cuda/cuda_status.h"
#include "worker/cuda/mlp_kernels.h"
#include "worker/cuda/row_major_gemm.h"

namespace paramserver {
namespace cuda {

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(MlpLayout layout, int device) {
  std::unique_ptr<CudaBackend> backend(new CudaBackend(std::move(layout), device));
  PS_RETURN_IF_ERROR(backend->Initialize());
  return backend;
}

CudaBackend::CudaBackend(MlpLayout layout, int device)
    : layout_(std::move(layout)), device_(device) {}

CudaBackend::~CudaBackend() {
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

std::string CudaBackend::name() const { return absl::StrCat("cuda:", device_); }

absl::Status CudaBackend::Initialize() {
  PS_RETURN_IF_ERROR(OpenStreamAndCublas(device_, &stream_, &cublas_));
  const size_t total = layout_.total_parameters();
  PS_RETURN_IF_ERROR(params_.Reserve(total, "parameters"));
  PS_RETURN_IF_ERROR(gradient_.Reserve(total, "gradient"));
  PS_RETURN_IF_ERROR(host_params_.Reserve(total, "parameters"));
  PS_RETURN_IF_ERROR(host_gradient_.Reserve(total, "gradient"));
  PS_RETURN_IF_ERROR(loss_sum_.Reserve(1, "loss"));
  PS_RETURN_IF_ERROR(host_loss_.Reserve(1, "loss"));
  PS_RETURN_IF_ERROR(correct_.Reserve(1, "correct count"));
  PS_RETURN_IF_ERROR(host_correct_.Reserve(1, "correct count"));
  for (int l = 0; l < layout_.num_layers(); ++l)
    activations_.push_back(std::make_unique<DeviceBuffer<float>>());
  return absl::OkStatus();
}

absl::Status CudaBackend::Reserve(int64_t rows) {
  if (rows <= reserved_rows_) return absl::OkStatus();
  const int64_t inputs = layout_.layers().front();
  const int64_t widest = *std::max_element(layout_.layers().begin(), layout_.layers().end());
  PS_RETURN_IF_ERROR(features_.Reserve(rows * inputs, "batch features"));
  PS_RETURN_IF_ERROR(host_features_.Reserve(rows * inputs, "batch features"));
  PS_RETURN_IF_ERROR(labels_.Reserve(rows, "batch labels"));
  PS_RETURN_IF_ERROR(host_labels_.Reserve(rows, "batch labels"));
  for (int l = 1; l < layout_.num_layers(); ++l) {
    PS_RETURN_IF_ERROR(activations_[l]->Reserve(rows * layout_.layers()[l], "activations"));
  }
  PS_RETURN_IF_ERROR(logits_.Reserve(rows * layout_.layers().back(), "logits"));
  PS_RETURN_IF_ERROR(delta_.Reserve(rows * widest, "deltas"));
  PS_RETURN_IF_ERROR(next_delta_.Reserve(rows * widest, "deltas"));
  PS_RETURN_IF_ERROR(row_loss_.Reserve(rows, "row losses"));
  reserved_rows_ = rows;
  return absl::OkStatus();
}

absl::Status CudaBackend::Upload(absl::Span<const float> params, const BatchView& batch) {
  PS_RETURN_IF_ERROR(CudaCallStatus(cudaSetDevice(device_), "cudaSetDevice"));
  PS_RETURN_IF_ERROR(Reserve(batch.size));
  const int64_t inputs = layout_.layers().front();
  // The previous step's copies out of these pinned buffers finished at its Synchronize.
  std::memcpy(host_params_.data(), params.data(), params.size() * sizeof(float));
  std::memcpy(host_features_.data(), batch.features, batch.size * inputs * sizeof(float));
  std::memcpy(host_labels_.data(), batch.labels, batch.size);
  PS_RETURN_IF_ERROR(CudaCallStatus(
      cudaMemcpyAsync(params_.data(), host_params_.data(), params.size() * sizeof(float),
                      cudaMemcpyHostToDevice, stream_),
      "cudaMemcpyAsync(parameters to device)"));
  PS_RETURN_IF_ERROR(CudaCallStatus(
      cudaMemcpyAsync(features_.data(), host_features_.data(), batch.size * inputs * sizeof(float),
                      cudaMemcpyHostToDevice, stream_),
      "cudaMemcpyAsync(batch features to device)"));
  return CudaCallStatus(cudaMemcpyAsync(labels_.data(), host_labels_.data(), batch.size,
                                        cudaMemcpyHostToDevice, stream_),
                        "cudaMemcpyAsync(batch labels to device)");
}

absl::Status CudaBackend::Forward(int rows) {
  const float* input = features_.data();
  for (int l = 0; l < layout_.num_layers(); ++l) {
    const int in = static_cast<int>(layout_.layers()[l]);
    const int out = static_cast<int>(layout_.layers()[l + 1]);
    const bool last = l + 1 == layout_.num_layers();
    float* output = last ? logits_.data() : activations_[l + 1]->data();
    PS_RETURN_IF_ERROR(
        CublasCallStatus(RowMajorTimesTransposed(cublas_, rows, out, in, input,
                                                 params_.data() + layout_.weight(l).offset, output),
                         absl::StrCat("cublasSgemm(forward, layer ", l + 1, ")")));
    PS_RETURN_IF_ERROR(
        CudaCallStatus(LaunchBiasActivation(output, params_.data() + layout_.bias(l).offset, rows,
                                            out, !last, stream_),
                       absl::StrCat("bias/ReLU kernel (layer ", l + 1, ")")));
    input = output;
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Backward(int rows) {
  const int classes = static_cast<int>(layout_.layers().back());
  float* delta = delta_.data();
  float* next_delta = next_delta_.data();
  PS_RETURN_IF_ERROR(
      CudaCallStatus(LaunchSoftmaxCrossEntropy(logits_.data(), labels_.data(), rows, classes, delta,
                                               row_loss_.data(), stream_),
                     "softmax cross-entropy kernel"));
  PS_RETURN_IF_ERROR(CudaCallStatus(LaunchSum(row_loss_.data(), rows, loss_sum_.data(), stream_),
                                    "loss sum kernel"));
  for (int l = layout_.num_layers() - 1; l >= 0; --l) {
    const int in = static_cast<int>(layout_.layers()[l]);
    const int out = static_cast<int>(layout_.layers()[l + 1]);
    const float* input = l == 0 ? features_.data() : activations_[l]->data();
    PS_RETURN_IF_ERROR(
        CublasCallStatus(WeightGradient(cublas_, rows, out, in, delta, input,
                                        gradient_.data() + layout_.weight(l).offset),
                         absl::StrCat("cublasSgemm(weight gradient, layer ", l + 1, ")")));
    PS_RETURN_IF_ERROR(CudaCallStatus(
        LaunchColumnSums(delta, rows, out, gradient_.data() + layout_.bias(l).offset, stream_),
        absl::StrCat("bias gradient kernel (layer ", l + 1, ")")));
    if (l == 0) break;
    PS_RETURN_IF_ERROR(
        CublasCallStatus(InputGradient(cublas_, rows, out, in, delta,
                                       params_.data() + layout_.weight(l).offset, next_delta),
                         absl::StrCat("cublasSgemm(input gradient, layer ", l + 1, ")")));
    PS_RETURN_IF_ERROR(CudaCallStatus(
        LaunchReluBackward(next_delta, input, static_cast<int64_t>(rows) * in, stream_),
        absl::StrCat("ReLU gradient kernel (layer ", l, ")")));
    std::swap(delta, next_delta);
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Synchronize(const char* after) {
  return CudaCallStatus(cudaStreamSynchronize(stream_),
                        absl::StrCat("cudaStreamSynchronize(after ", after, ")"));
}

absl::StatusOr<float> CudaBackend::ComputeGradients(absl::Span<const float> params,
                                                    const BatchView& batch,
                                                    absl::Span<float> gradient) {
  PS_RETURN_IF_ERROR(CheckBackendInputs(layout_, params, batch));
  if (gradient.size() != params.size()) {
    return absl::InvalidArgumentError(absl::StrCat("gradient buffer holds ", gradient.size(),
                                                   " values, expected ", params.size()));
  }
  const int rows = static_cast<int>(batch.size);
  PS_RETURN_IF_ERROR(Upload(params, batch));
  PS_RETURN_IF_ERROR(Forward(rows));
  PS_RETURN_IF_ERROR(Backward(rows));
  PS_RETURN_IF_ERROR(CudaCallStatus(
      cudaMemcpyAsync(host_gradient_.data(), gradient_.data(), gradient.size() * sizeof(float),
                      cudaMemcpyDeviceToHost, stream_),
      "cudaMemcpyAsync(gradient to host)"));
  PS_RETURN_IF_ERROR(CudaCallStatus(cudaMemcpyAsync(host_loss_.data(), loss_sum_.data(),
                                                    sizeof(float), cudaMemcpyDeviceToHost, stream_),
                                    "cudaMemcpyAsync(loss to host)"));
  PS_RETURN_IF_ERROR(Synchronize("the training step"));
  std::memcpy(gradient.data(), host_gradient_.data(), gradient.size() * sizeof(float));
  return *host_loss_.data() / static_cast<float>(rows);
}

absl::StatusOr<int64_t> CudaBackend::CountCorrect(absl::Span<const float> params,
                                                  const BatchView& batch) {
  PS_RETURN_IF_ERROR(CheckBackendInputs(layout_, params, batch));
  const int rows = static_cast<int>(batch.size);
  PS_RETURN_IF_ERROR(Upload(params, batch));
  PS_RETURN_IF_ERROR(Forward(rows));
  PS_RETURN_IF_ERROR(CudaCallStatus(
      LaunchCountCorrect(logits_.data(), labels_.data(), rows,
                         static_cast<int>(layout_.layers().back()), correct_.data(), stream_),
      "accuracy kernel"));
  PS_RETURN_IF_ERROR(CudaCallStatus(cudaMemcpyAsync(host_correct_.data(), correct_.data(),
                                                    sizeof(int), cudaMemcpyDeviceToHost, stream_),
                                    "cudaMemcpyAsync(correct count to host)"));
  PS_RETURN_IF_ERROR(Synchronize("evaluation"));
  return *host_correct_.data();
}

}  // namespace cuda
}  // namespace paramserver
