// For the GPU tests: a test case that needs a GPU calls SkipWithoutGpu() first, and
// returns when it says so. It then prints "SKIPPED: <reason>", which tests/run.sh
// counts as a skipped test case rather than a passed one.
#ifndef PARAMSERVER_WORKER_CUDA_SKIP_WITHOUT_GPU_H_
#define PARAMSERVER_WORKER_CUDA_SKIP_WITHOUT_GPU_H_

#include <cstdio>
#include <string>

#include "worker/cuda/gpu_devices.h"

namespace paramserver {
namespace cuda {

inline bool SkipWithoutGpu() {
  absl::StatusOr<int> gpus = CountUsableGpus();
  if (gpus.ok()) return false;
  std::printf("SKIPPED: no usable GPU: %s\n", std::string(gpus.status().message()).c_str());
  return true;
}

}  // namespace cuda
}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_CUDA_SKIP_WITHOUT_GPU_H_
