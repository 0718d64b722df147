#include "worker/cuda/gpu_devices.h"

#include <cuda_runtime_api.h>

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/cuda/ctr_cuda_compute.h"
#include "worker/cuda/cuda_backend.h"
#include "worker/cuda/cuda_status.h"

namespace paramserver {
namespace cuda {

bool BuiltWithCuda() { return true; }

absl::StatusOr<int> CountUsableGpus() {
  int count = 0;
  const cudaError_t result = cudaGetDeviceCount(&count);
  if (result == cudaSuccess && count >= 1) return count;
  std::string driver_version;
  if (std::ifstream in("/proc/driver/nvidia/version"); in) {
    std::stringstream text;
    text << in.rdbuf();
    driver_version = text.str();
  }
  return ExplainNoGpu(result, driver_version);
}

absl::StatusOr<std::string> DescribeGpu(int index) {
  cudaDeviceProp properties;
  if (absl::Status s = CudaCallStatus(cudaGetDeviceProperties(&properties, index),
                                      absl::StrCat("cudaGetDeviceProperties(", index, ")"));
      !s.ok()) {
    return s;
  }
  return absl::StrFormat("%s (sm_%d%d, %.1f GiB)", properties.name, properties.major,
                         properties.minor, properties.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
}

absl::StatusOr<std::unique_ptr<ComputeBackend>> CreateCudaBackend(const MlpLayout& layout,
                                                                  int index) {
  absl::StatusOr<std::unique_ptr<CudaBackend>> backend = CudaBackend::Create(layout, index);
  if (!backend.ok()) return backend.status();
  return std::unique_ptr<ComputeBackend>(std::move(*backend));
}

absl::StatusOr<std::unique_ptr<CtrCompute>> CreateCudaCtrCompute(const CtrModelShape& shape,
                                                                 int index) {
  absl::StatusOr<std::unique_ptr<CtrCudaCompute>> compute = CtrCudaCompute::Create(shape, index);
  if (!compute.ok()) return compute.status();
  return std::unique_ptr<CtrCompute>(std::move(*compute));
}

}  // namespace cuda
}  // namespace paramserver
