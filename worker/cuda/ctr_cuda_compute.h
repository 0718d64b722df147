// The CTR step on a GPU: the batch's pulled rows and dense features go up once, a gather
// kernel builds the MLP's input, cuBLAS runs the MLP forward and backward (plain FP32,
// no TF32), and segmented-sum kernels add each unique row's gradient over its examples
// in ascending order, as the CPU does. What comes back is CtrForwardBackward's result.
#ifndef PARAMSERVER_WORKER_CUDA_CTR_CUDA_COMPUTE_H_
#define PARAMSERVER_WORKER_CUDA_CTR_CUDA_COMPUTE_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/mlp_parameters.h"
#include "worker/ctr_compute.h"
#include "worker/cuda/cuda_buffers.h"

namespace paramserver {
namespace cuda {

// A batch's rows as the kernels take them: every field's pulled rows back to back
// (field k's from row_base[k]), and one segment per unique row listing its examples in
// ascending order (the CPU's order of summation), with the input column it feeds.
struct RowSegments {
  std::vector<int32_t> row_base;  // per field
  std::vector<float> all_rows;
  int32_t unique = 0;                  // rows in all
  std::vector<int32_t> segment_begin;  // unique + 1 offsets into segment_examples
  std::vector<int32_t> segment_examples;
  std::vector<int32_t> column;  // per row: its field's first column of the MLP's input

  // REQUIRES: pulled[k] holds rows.unique_ids[k].size() x shape.embedding_dim values;
  // rows.row_of covers `examples` examples.
  static RowSegments Of(const CtrModelShape& shape, int64_t examples, const BatchRows& rows,
                        const std::vector<std::vector<float>>& pulled);
};

class CtrCudaCompute final : public CtrCompute {
 public:
  // On GPU `device`; the errors of device setup; FAILED_PRECONDITION for tables of
  // several dims (the CPU's step takes those). REQUIRES: a valid shape.
  static absl::StatusOr<std::unique_ptr<CtrCudaCompute>> Create(CtrModelShape shape, int device);
  ~CtrCudaCompute() override;

  std::string name() const override;
  absl::StatusOr<CtrStepResult> Step(absl::Span<const float> mlp, const CtrBatchView& batch,
                                     const BatchRows& rows,
                                     const std::vector<std::vector<float>>& pulled,
                                     bool backward) override;

 private:
  CtrCudaCompute(CtrModelShape shape, int device);
  absl::Status Initialize();
  // Sizes every buffer for `examples` examples and `unique_rows` rows.
  absl::Status Reserve(int64_t examples, int64_t unique_rows, int64_t segment_examples);
  absl::Status Forward(int examples);
  // Fills gradient_ and dx_ (the loss's gradient with respect to the MLP's input).
  absl::Status Backward(int examples);
  // Sizes the buffers and sends the MLP, the batch and its rows up; gathers x_.
  absl::Status Upload(absl::Span<const float> mlp, const CtrBatchView& batch, const BatchRows& rows,
                      const RowSegments& segments);
  // After Backward: sums each row's gradient over its segment, and brings the MLP's
  // gradient, the rows' gradients (per field) and the logits down into *result.
  absl::Status DownloadGradients(const RowSegments& segments, const BatchRows& rows,
                                 size_t mlp_size, int examples, CtrStepResult* result);

  const CtrModelShape shape_;
  const MlpLayout layout_;
  const int device_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  DeviceBuffer<float> params_, gradient_, dense_, labels_, rows_, x_, dx_, logits_, delta_,
      next_delta_, row_loss_, loss_sum_, row_gradients_;
  DeviceBuffer<int32_t> row_of_, row_base_, segment_begin_, segment_examples_, column_;
  std::vector<std::unique_ptr<DeviceBuffer<float>>> activations_;  // [l]: layer l's input
};

}  // namespace cuda
}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_CUDA_CTR_CUDA_COMPUTE_H_
