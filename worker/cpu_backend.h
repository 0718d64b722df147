// The CPU compute backend: the MLP with OpenBLAS GEMMs.
#ifndef PARAMSERVER_WORKER_CPU_BACKEND_H_
#define PARAMSERVER_WORKER_CPU_BACKEND_H_

#include <vector>

#include "common/model/mlp_parameters.h"
#include "worker/compute_backend.h"

namespace paramserver {

// Not thread-safe (holds its activation buffers). ReLU between layers, softmax
// cross-entropy on top, as torch.nn.Linear / F.relu / F.cross_entropy compute them.
class CpuBackend final : public ComputeBackend {
 public:
  // `blas_threads` sets OpenBLAS's thread count for the whole process.
  CpuBackend(MlpLayout layout, int blas_threads);

  std::string name() const override { return "cpu"; }
  absl::StatusOr<float> ComputeGradients(absl::Span<const float> params, const BatchView& batch,
                                         absl::Span<float> gradient) override;
  // Reports each layer's bias, then its weight gradient in blocks of rows (about
  // kValuesPerReport values each), last rows first.
  absl::StatusOr<float> ComputeGradientsStreamed(absl::Span<const float> params,
                                                 const BatchView& batch, absl::Span<float> gradient,
                                                 const GradientReadyCallback& on_ready) override;
  static constexpr int64_t kValuesPerReport = 16384;
  absl::StatusOr<int64_t> CountCorrect(absl::Span<const float> params,
                                       const BatchView& batch) override;

 private:
  // Fills activations_ (post-ReLU hidden layers) and logits_ for the batch.
  void Forward(const float* params, const BatchView& batch);

  const MlpLayout layout_;
  // activations_[l] is layer l's input for l >= 1 (B x layers[l]); layer 0 reads the batch.
  std::vector<std::vector<float>> activations_;
  std::vector<float> logits_;
  std::vector<float> delta_;       // d(loss)/d(pre-activation) of the current layer
  std::vector<float> next_delta_;  // the layer below's
};

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_CPU_BACKEND_H_
