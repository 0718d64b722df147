// The CUDA compute backend: the MLP on one GPU, cuBLAS GEMMs and our own kernels.
#ifndef PARAMSERVER_WORKER_CUDA_CUDA_BACKEND_H_
#define PARAMSERVER_WORKER_CUDA_CUDA_BACKEND_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/mlp_parameters.h"
#include "worker/compute_backend.h"
#include "worker/cuda/cuda_buffers.h"

namespace paramserver {
namespace cuda {

// Not thread-safe. Weights, activations and gradients stay on the device for the whole
// step; the host<->device traffic is the parameters in, the batch in and the gradient
// out, through pinned buffers with asynchronous copies on the backend's own stream.
// Computes exactly what CpuBackend computes, up to float rounding.
class CudaBackend final : public ComputeBackend {
 public:
  // Selects GPU `device`, creates the stream and the cuBLAS handle. Errors name the call.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(MlpLayout layout, int device);
  ~CudaBackend() override;

  std::string name() const override;
  absl::StatusOr<float> ComputeGradients(absl::Span<const float> params, const BatchView& batch,
                                         absl::Span<float> gradient) override;
  absl::StatusOr<int64_t> CountCorrect(absl::Span<const float> params,
                                       const BatchView& batch) override;

 private:
  CudaBackend(MlpLayout layout, int device);
  absl::Status Initialize();
  // Grows the buffers for a batch of `rows`.
  absl::Status Reserve(int64_t rows);
  // Copies the parameters and the batch to the device (asynchronously).
  absl::Status Upload(absl::Span<const float> params, const BatchView& batch);
  // Fills activations_ (hidden layers, after ReLU) and logits_ from the uploaded batch.
  absl::Status Forward(int rows);
  absl::Status Backward(int rows);
  absl::Status Synchronize(const char* after);

  const MlpLayout layout_;
  const int device_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  int64_t reserved_rows_ = 0;
  DeviceBuffer<float> params_;
  DeviceBuffer<float> gradient_;
  DeviceBuffer<float> features_;
  DeviceBuffer<uint8_t> labels_;
  std::vector<std::unique_ptr<DeviceBuffer<float>>> activations_;  // [l] is layer l's input, l >= 1
  DeviceBuffer<float> logits_;
  DeviceBuffer<float> delta_;
  DeviceBuffer<float> next_delta_;
  DeviceBuffer<float> row_loss_;
  DeviceBuffer<float> loss_sum_;
  DeviceBuffer<int> correct_;
  PinnedBuffer<float> host_params_;
  PinnedBuffer<float> host_gradient_;
  PinnedBuffer<float> host_features_;
  PinnedBuffer<uint8_t> host_labels_;
  PinnedBuffer<float> host_loss_;
  PinnedBuffer<int> host_correct_;
};

}  // namespace cuda
}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_CUDA_CUDA_BACKEND_H_
