// Which GPUs this process can use. Built with or without CUDA: without it, every call
// says so, and a worker falls back to (or, when asked for a GPU, refuses with) that reason.
#ifndef PARAMSERVER_WORKER_CUDA_GPU_DEVICES_H_
#define PARAMSERVER_WORKER_CUDA_GPU_DEVICES_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/model/mlp_parameters.h"
#include "worker/compute_backend.h"
#include "worker/ctr_compute.h"

namespace paramserver {
namespace cuda {

// True when this binary was built with the CUDA backend.
bool BuiltWithCuda();

// The number of usable GPUs (>= 1), or UNAVAILABLE / FAILED_PRECONDITION saying why
// there is none: no driver, no device, or a binary built without CUDA.
absl::StatusOr<int> CountUsableGpus();

// "NVIDIA H200 (sm_90, 139.8 GiB)" for device `index`, or the error.
absl::StatusOr<std::string> DescribeGpu(int index);

// A CUDA backend for `layout` on GPU `index`; the errors of device setup.
absl::StatusOr<std::unique_ptr<ComputeBackend>> CreateCudaBackend(const MlpLayout& layout,
                                                                  int index);

// A CUDA CTR step for `shape` on GPU `index`; the errors of device setup.
absl::StatusOr<std::unique_ptr<CtrCompute>> CreateCudaCtrCompute(const CtrModelShape& shape,
                                                                 int index);

}  // namespace cuda
}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_CUDA_GPU_DEVICES_H_
