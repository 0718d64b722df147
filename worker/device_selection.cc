#include "worker/device_selection.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/cluster_spec.h"
#include "spdlog/spdlog.h"
#include "worker/cpu_backend.h"
#include "worker/cuda/gpu_devices.h"

namespace paramserver {
namespace {

std::unique_ptr<ComputeBackend> Cpu(const MlpLayout& layout) {
  // One BLAS thread: a worker shares the machine with its peers and servers.
  return std::make_unique<CpuBackend>(layout, /*blas_threads=*/1);
}

}  // namespace

GpuProvider SystemGpus() {
  return {cuda::CountUsableGpus, cuda::DescribeGpu, cuda::CreateCudaBackend};
}

absl::StatusOr<std::unique_ptr<ComputeBackend>> CreateComputeBackend(const std::string& device,
                                                                     const MlpLayout& layout,
                                                                     const GpuProvider& gpus) {
  if (absl::Status s = CheckDeviceName(device); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("device ", s.message()));
  }
  if (device == "cpu") {
    spdlog::info("computing on the CPU (device cpu)");
    return Cpu(layout);
  }
  absl::StatusOr<int> count = gpus.count_usable();
  if (device == "auto") {
    if (count.ok()) {
      absl::StatusOr<std::unique_ptr<ComputeBackend>> gpu = gpus.create_backend(layout, 0);
      if (gpu.ok()) {
        absl::StatusOr<std::string> description = gpus.describe(0);
        spdlog::info("computing on GPU 0: {} (device auto)", description.ok() ? *description : "?");
        return gpu;
      }
      spdlog::warn("GPU 0 is present but unusable ({}); computing on the CPU (device auto)",
                   gpu.status().ToString());
      return Cpu(layout);
    }
    spdlog::info("no usable GPU ({}); computing on the CPU (device auto)",
                 std::string(count.status().message()));
    return Cpu(layout);
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
  absl::StatusOr<std::unique_ptr<ComputeBackend>> gpu = gpus.create_backend(layout, index);
  if (!gpu.ok()) return gpu.status();
  absl::StatusOr<std::string> description = gpus.describe(index);
  spdlog::info("computing on GPU {}: {} (device {})", index, description.ok() ? *description : "?",
               device);
  return gpu;
}

}  // namespace paramserver
