// CPU and GPU backends agree: forward (predictions), loss, every gradient, and whole
// training steps, for several shapes including odd sizes and batch 1. Each test case
// prints "SKIPPED: <reason>" and checks nothing where no GPU is usable; tests/run.sh
// counts those as skipped, not passed.
#include "worker/cuda/cuda_backend.h"

#include <cmath>
#include <random>

#include "catch2/catch.hpp"
#include "worker/cpu_backend.h"
#include "worker/cuda/gpu_devices.h"
#include "worker/cuda/skip_without_gpu.h"
#include "worker/mlp_test_problem.h"
#include "worker/trainer.h"

namespace paramserver {
namespace cuda {
namespace {

const std::vector<std::vector<int64_t>> kShapes = {
    {784, 128, 10}, {33, 17, 5}, {7, 3}, {100, 65, 31, 2}};

TEST_CASE("GPU loss and every gradient equal the CPU's") {
  if (SkipWithoutGpu()) return;
  for (const auto& layers : kShapes) {
    for (int rows : {1, 7, 32, 257}) {
      MlpTestProblem p = MakeMlpTestProblem(layers, rows, 11);
      CpuBackend cpu(p.layout, 1);
      absl::StatusOr<std::unique_ptr<CudaBackend>> gpu = CudaBackend::Create(p.layout, 0);
      REQUIRE(gpu.ok());
      std::vector<float> cpu_gradient(p.params.size()), gpu_gradient(p.params.size());
      absl::StatusOr<float> cpu_loss =
          cpu.ComputeGradients(p.params, p.batch(), absl::MakeSpan(cpu_gradient));
      absl::StatusOr<float> gpu_loss =
          (*gpu)->ComputeGradients(p.params, p.batch(), absl::MakeSpan(gpu_gradient));
      REQUIRE(cpu_loss.ok());
      REQUIRE(gpu_loss.ok());
      INFO("layers " << layers.size() << " first width " << layers[0] << " rows " << rows);
      // cuBLAS and OpenBLAS sum the same products in other orders: each float32 result
      // differs by at most gamma_n = n u relative to the sum of its terms' magnitudes,
      // n <= 784 + 257 (an input row, the batch): 6.2e-5 in the worst case, ~sqrt(n) u
      // = 2e-6 in practice. The loss: 1e-5 relative. Gradients, relative to their size
      // plus 1e-3 (components near zero are differences of large terms): 1e-3.
      CHECK(*gpu_loss == Approx(*cpu_loss).epsilon(1e-5));
      double worst = 0;
      for (size_t i = 0; i < cpu_gradient.size(); ++i) {
        worst = std::max(worst, std::fabs(double{gpu_gradient[i]} - cpu_gradient[i]) /
                                    (1e-3 + std::fabs(double{cpu_gradient[i]})));
      }
      CHECK(worst < 1e-3);
    }
  }
}

TEST_CASE("GPU predictions equal the CPU's") {
  if (SkipWithoutGpu()) return;
  for (const auto& layers : kShapes) {
    MlpTestProblem p = MakeMlpTestProblem(layers, 1000, 5);
    CpuBackend cpu(p.layout, 1);
    absl::StatusOr<std::unique_ptr<CudaBackend>> gpu = CudaBackend::Create(p.layout, 0);
    REQUIRE(gpu.ok());
    absl::StatusOr<int64_t> cpu_correct = cpu.CountCorrect(p.params, p.batch());
    absl::StatusOr<int64_t> gpu_correct = (*gpu)->CountCorrect(p.params, p.batch());
    REQUIRE(cpu_correct.ok());
    REQUIRE(gpu_correct.ok());
    CHECK(std::abs(*gpu_correct - *cpu_correct) <= 1);  // a near-tie may round either way
  }
}

// Serves parameters and applies each push as a plain SGD step, like a one-shard server.
class SgdFakePsClient final : public PsClient {
 public:
  explicit SgdFakePsClient(std::vector<float> params) : params_(std::move(params)) {}
  absl::Status Pull(const StepPull& pull) override {
    std::copy(params_.begin(), params_.end(), pull.into.params.begin());
    return absl::OkStatus();
  }
  // Brings nothing back: the next step pulls.
  absl::StatusOr<bool> Push(const StepPush& push) override {
    for (size_t i = 0; i < params_.size(); ++i) params_[i] -= 0.05f * push.gradient[i];
    return false;
  }
  absl::StatusOr<ShardMapUpdate> RefreshShardMap() override { return ShardMapUpdate(); }
  absl::StatusOr<int64_t> StartStep() override { return 0; }
  const std::vector<float>& params() const { return params_; }

 private:
  std::vector<float> params_;
};

TEST_CASE("whole training steps on the GPU end where the CPU's end") {
  if (SkipWithoutGpu()) return;
  const MlpLayout layout({33, 17, 5});
  MlpTestProblem data = MakeMlpTestProblem({33, 17, 5}, 64, 3);
  LabeledDataset train;
  train.example_count = 64;
  train.feature_count = 33;
  train.features = data.features;
  train.labels = data.labels;
  TrainerOptions options;
  options.training.batch_size = 8;
  options.training.epochs = 2;
  options.training.shuffle = true;
  CpuBackend cpu(layout, 1);
  absl::StatusOr<std::unique_ptr<CudaBackend>> gpu = CudaBackend::Create(layout, 0);
  REQUIRE(gpu.ok());
  SgdFakePsClient cpu_ps(data.params), gpu_ps(data.params);
  auto cpu_trainer = Trainer::Create(options, layout, &train, nullptr, &cpu_ps, &cpu);
  auto gpu_trainer = Trainer::Create(options, layout, &train, nullptr, &gpu_ps, gpu->get());
  REQUIRE(cpu_trainer.ok());
  REQUIRE(gpu_trainer.ok());
  REQUIRE((*cpu_trainer)->Run().ok());
  REQUIRE((*gpu_trainer)->Run().ok());
  double worst = 0;
  for (size_t i = 0; i < data.params.size(); ++i) {
    worst =
        std::max(worst, static_cast<double>(std::fabs(cpu_ps.params()[i] - gpu_ps.params()[i])));
  }
  // Two epochs of SGD on each: the per-step differences above (relative 1e-5 on steps
  // of lr x gradient) accumulate over the steps; 1e-4 absolute on weights of order 0.1.
  CHECK(worst < 1e-4);
}

}  // namespace
}  // namespace cuda
}  // namespace paramserver
