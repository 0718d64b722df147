// Where a CTR step's forward and backward pass runs: the CPU (worker/ctr_model.h's
// CtrForwardBackward) or a GPU (worker/cuda/ctr_cuda_compute.h: gather and
// segmented-sum kernels, cuBLAS for the MLP). Both give the same CtrStepResult, and
// both sum each row's gradient over the batch's examples in ascending order, so sync
// runs stay reproducible on either.
#ifndef PARAMSERVER_WORKER_CTR_COMPUTE_H_
#define PARAMSERVER_WORKER_CTR_COMPUTE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/ctr_model.h"

namespace paramserver {

// Not thread-safe: one training loop uses it.
class CtrCompute {
 public:
  virtual ~CtrCompute() = default;
  // "cpu", "cuda:0".
  virtual std::string name() const = 0;
  // CtrForwardBackward's contract; errors are the device's.
  virtual absl::StatusOr<CtrStepResult> Step(absl::Span<const float> mlp, const CtrBatchView& batch,
                                             const BatchRows& rows,
                                             const std::vector<std::vector<float>>& pulled,
                                             bool backward) = 0;
};

// REQUIRES: a valid shape (ValidateCtrModelShape).
std::unique_ptr<CtrCompute> CpuCtrCompute(const CtrModelShape& shape);

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_CTR_COMPUTE_H_
