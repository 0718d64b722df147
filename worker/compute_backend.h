// The interface every compute backend (CPU now, CUDA in its own package) implements:
// the MLP's forward and backward pass over one batch.
#ifndef PARAMSERVER_WORKER_COMPUTE_BACKEND_H_
#define PARAMSERVER_WORKER_COMPUTE_BACKEND_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model/mlp_parameters.h"

namespace paramserver {

// A batch laid out row-major: example i's features at features[i * input_width].
// Not owned.
struct BatchView {
  const float* features = nullptr;
  const uint8_t* labels = nullptr;
  int64_t size = 0;
};

// Not thread-safe: one backend per training thread.
class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;

  // "cpu", "cuda:0", ...
  virtual std::string name() const = 0;

  // Returns the batch's mean softmax cross-entropy under `params` (the flat MlpLayout
  // vector) and writes d(loss)/d(params) into `gradient` (same size as params).
  // INVALID_ARGUMENT for wrong sizes; a device error names the failed call.
  virtual absl::StatusOr<float> ComputeGradients(absl::Span<const float> params,
                                                 const BatchView& batch,
                                                 absl::Span<float> gradient) = 0;

  // Told during ComputeGradientsStreamed that gradient[from, size) is final.
  using GradientReadyCallback = std::function<void(int64_t from)>;

  // ComputeGradients, calling `on_ready(from)` each time backpropagation has finished
  // more of the gradient, so that it can leave while the layers below are computed.
  // Backpropagation runs from the last layer to the first and the flat layout keeps each
  // layer after the one below it, so the final part is always a suffix: `from` only
  // decreases, and gradient[from, size) is never written again in this call. The values
  // are exactly ComputeGradients'. Not called when the computation fails. This default
  // computes everything, then reports it once (from = 0).
  virtual absl::StatusOr<float> ComputeGradientsStreamed(absl::Span<const float> params,
                                                         const BatchView& batch,
                                                         absl::Span<float> gradient,
                                                         const GradientReadyCallback& on_ready) {
    absl::StatusOr<float> loss = ComputeGradients(params, batch, gradient);
    if (loss.ok()) on_ready(0);
    return loss;
  }

  // The number of examples whose highest logit is at their label.
  virtual absl::StatusOr<int64_t> CountCorrect(absl::Span<const float> params,
                                               const BatchView& batch) = 0;
};

// The checks every backend makes before computing: `params` has the layout's size,
// the batch is non-empty and every label is below the number of classes.
// INVALID_ARGUMENT naming the problem.
absl::Status CheckBackendInputs(const MlpLayout& layout, absl::Span<const float> params,
                                const BatchView& batch);

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_COMPUTE_BACKEND_H_
