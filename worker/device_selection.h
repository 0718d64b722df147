// Choosing the compute backend from --device / worker.device: auto, cpu, gpu, gpu:N.
#ifndef PARAMSERVER_WORKER_DEVICE_SELECTION_H_
#define PARAMSERVER_WORKER_DEVICE_SELECTION_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/model/mlp_parameters.h"
#include "worker/compute_backend.h"
#include "worker/ctr_compute.h"

namespace paramserver {

// The GPU questions the selection asks; SystemGpus() answers them with CUDA, tests
// with fakes.
struct GpuProvider {
  std::function<absl::StatusOr<int>()> count_usable;
  std::function<absl::StatusOr<std::string>(int)> describe;
  std::function<absl::StatusOr<std::unique_ptr<ComputeBackend>>(const MlpLayout&, int)>
      create_backend;
  std::function<absl::StatusOr<std::unique_ptr<CtrCompute>>(const CtrModelShape&, int)> create_ctr;
};

GpuProvider SystemGpus();

// Builds the backend `device` asks for and logs one line saying which it is and why:
//  - "cpu": the CPU.
//  - "auto": GPU 0 when one is usable, otherwise the CPU, with the reason there is no GPU.
//  - "gpu" (GPU 0) or "gpu:N": that GPU, or FAILED_PRECONDITION with the reason none is
//    usable, or INVALID_ARGUMENT when N is past the last GPU.
// INVALID_ARGUMENT for any other string.
absl::StatusOr<std::unique_ptr<ComputeBackend>> CreateComputeBackend(const std::string& device,
                                                                     const MlpLayout& layout,
                                                                     const GpuProvider& gpus);

// The same choice for a ctr model's step (worker/ctr_compute.h).
absl::StatusOr<std::unique_ptr<CtrCompute>> CreateCtrCompute(const std::string& device,
                                                             const CtrModelShape& shape,
                                                             const GpuProvider& gpus);

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_DEVICE_SELECTION_H_
