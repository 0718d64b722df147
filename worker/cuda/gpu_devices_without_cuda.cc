// gpu_devices.h for binaries built without the CUDA toolkit (or with PS_CUDA=0).
#include "worker/cuda/gpu_devices.h"

namespace paramserver {
namespace cuda {
namespace {

absl::Status NotBuilt() {
  return absl::FailedPreconditionError(
      "this binary was built without CUDA (no toolkit at build time, or --repo_env=PS_CUDA=0)");
}

}  // namespace

bool BuiltWithCuda() { return false; }

absl::StatusOr<int> CountUsableGpus() { return NotBuilt(); }

absl::StatusOr<std::string> DescribeGpu(int) { return NotBuilt(); }

absl::StatusOr<std::unique_ptr<ComputeBackend>> CreateCudaBackend(const MlpLayout&, int) {
  return NotBuilt();
}

absl::StatusOr<std::unique_ptr<CtrCompute>> CreateCudaCtrCompute(const CtrModelShape&, int) {
  return NotBuilt();
}

}  // namespace cuda
}  // namespace paramserver
