// One worker step's compute (forward, backward, and the host<->device traffic the
// backend owns: parameters and batch in, gradient out; no pull or push) on the CPU and,
// where usable, the GPU backend, for the reference 784-128-10 MLP. Prints one line per
// backend and batch size:
//   backend=cpu batch=32 samples_per_sec=123456 (median of 5 runs of ~0.5 s)
// A benchmark, not a test: it prints figures and asserts nothing about time.
#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "absl/time/clock.h"
#include "common/model/mlp_parameters.h"
#include "worker/cpu_backend.h"
#include "worker/cuda/gpu_devices.h"

namespace paramserver {
namespace {

double MedianSamplesPerSecond(ComputeBackend& backend, const MlpLayout& layout, int batch) {
  std::mt19937 generator(1);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  std::vector<float> features(static_cast<size_t>(batch) * layout.layers().front());
  for (float& x : features) x = pixel(generator);
  std::vector<uint8_t> labels(batch);
  for (uint8_t& y : labels) y = static_cast<uint8_t>(generator() % layout.layers().back());
  std::vector<float> params = InitializeMlpParameters(layout, 1), gradient(params.size());
  const BatchView view{features.data(), labels.data(), batch};
  for (int i = 0; i < 5; ++i) {
    if (!backend.ComputeGradients(params, view, absl::MakeSpan(gradient)).ok()) return -1;
  }
  std::vector<double> rates;
  for (int run = 0; run < 5; ++run) {
    int64_t steps = 0;
    const absl::Time start = absl::Now();
    while (absl::Now() - start < absl::Milliseconds(500)) {
      if (!backend.ComputeGradients(params, view, absl::MakeSpan(gradient)).ok()) return -1;
      ++steps;
    }
    rates.push_back(steps * batch / absl::ToDoubleSeconds(absl::Now() - start));
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

int Main() {
  const MlpLayout layout({784, 128, 10});
  CpuBackend cpu(layout, /*blas_threads=*/1);
  std::unique_ptr<ComputeBackend> gpu;
  absl::StatusOr<int> gpus = cuda::CountUsableGpus();
  if (gpus.ok()) {
    absl::StatusOr<std::unique_ptr<ComputeBackend>> created = cuda::CreateCudaBackend(layout, 0);
    if (created.ok()) gpu = std::move(*created);
  } else {
    std::printf("# no GPU: %s\n", std::string(gpus.status().message()).c_str());
  }
  for (int batch : {32, 256, 1024}) {
    std::printf("backend=cpu batch=%d samples_per_sec=%.0f\n", batch,
                MedianSamplesPerSecond(cpu, layout, batch));
    if (gpu != nullptr) {
      std::printf("backend=gpu batch=%d samples_per_sec=%.0f\n", batch,
                  MedianSamplesPerSecond(*gpu, layout, batch));
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace paramserver

int main() { return paramserver::Main(); }
