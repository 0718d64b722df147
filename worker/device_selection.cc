#include "worker/device_selection.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/config/cluster_spec.h"
#include "spdlog/spdlog.h"
#include "worker/blas_kernels.h"
#include "worker/cpu_backend.h"
#include "worker/cuda/gpu_devices.h"

namespace paramserver {
namespace {

// The selection both kinds of compute share: `cpu` makes the CPU's, `gpu(index)` a GPU's.
template <typename Compute>
absl::StatusOr<std::unique_ptr<Compute>> Select(
    const std::string& device, const GpuProvider& gpus,
    const std::function<std::unique_ptr<Compute>()>& cpu,
    const std::function<absl::StatusOr<std::unique_ptr<Compute>>(int)>& gpu) {
  if (absl::Status s = CheckDeviceName(device); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("device ", s.message()));
  }
  if (device == "cpu") {
    spdlog::info("computing on the CPU (device cpu) with {}", BlasKernelsDescription());
    return cpu();
  }
  absl::StatusOr<int> count = gpus.count_usable();
  if (device == "auto") {
    if (count.ok()) {
      absl::StatusOr<std::unique_ptr<Compute>> made = gpu(0);
      if (made.ok()) {
        absl::StatusOr<std::string> description = gpus.describe(0);
        spdlog::info("computing on GPU 0: {} (device auto)", description.ok() ? *description : "?");
        return made;
      }
      spdlog::warn("GPU 0 is present but unusable ({}); computing on the CPU (device auto) with {}",
                   made.status().ToString(), BlasKernelsDescription());
      return cpu();
    }
    spdlog::info("no usable GPU ({}); computing on the CPU (device auto) with {}",
                 std::string(count.status().message()), BlasKernelsDescription());
    return cpu();
  }
  int index = 0;
  if (device != "gpu" && !absl::SimpleAtoi(device.substr(4), &index)) {
    return absl::InvalidArgumentError(absl::StrCat("device '", device, "': bad GPU index"));
  }
  if (!count.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("device ", device,
                     " asks for a GPU, but there is no usable GPU: ", count.status().message()));
  }
  if (index >= *count) {
    return absl::InvalidArgumentError(absl::StrCat("device ", device, " asks for GPU ", index,
                                                   ", but this machine has ", *count,
                                                   " usable GPU(s)"));
  }
  absl::StatusOr<std::unique_ptr<Compute>> made = gpu(index);
  if (!made.ok()) return made.status();
  absl::StatusOr<std::string> description = gpus.describe(index);
  spdlog::info("computing on GPU {}: {} (device {})", index, description.ok() ? *description : "?",
               device);
  return made;
}

}  // namespace

GpuProvider SystemGpus() {
  return {cuda::CountUsableGpus, cuda::DescribeGpu, cuda::CreateCudaBackend,
          cuda::CreateCudaCtrCompute};
}

absl::StatusOr<std::unique_ptr<ComputeBackend>> CreateComputeBackend(const std::string& device,
                                                                     const MlpLayout& layout,
                                                                     const GpuProvider& gpus) {
  return Select<ComputeBackend>(
      device, gpus,
      [&] {
        // One BLAS thread: a worker shares the machine with its peers and servers.
        return std::unique_ptr<ComputeBackend>(
            std::make_unique<CpuBackend>(layout, /*blas_threads=*/1));
      },
      [&](int index) { return gpus.create_backend(layout, index); });
}

absl::StatusOr<std::unique_ptr<CtrCompute>> CreateCtrCompute(const std::string& device,
                                                             const CtrModelShape& shape,
                                                             const GpuProvider& gpus) {
  return Select<CtrCompute>(
      device, gpus, [&] { return CpuCtrCompute(shape); },
      [&](int index) -> absl::StatusOr<std::unique_ptr<CtrCompute>> {
        if (!gpus.create_ctr) return absl::UnimplementedError("no CTR step for this GPU provider");
        return gpus.create_ctr(shape, index);
      });
}

}  // namespace paramserver
