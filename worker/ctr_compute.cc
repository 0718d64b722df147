#include "worker/ctr_compute.h"

#include <cblas.h>

namespace paramserver {
namespace {

class CpuCompute final : public CtrCompute {
 public:
  explicit CpuCompute(CtrModelShape shape) : shape_(std::move(shape)) {
    // One BLAS thread: a worker shares the machine with its peers and servers.
    openblas_set_num_threads(1);
  }
  std::string name() const override { return "cpu"; }
  absl::StatusOr<CtrStepResult> Step(absl::Span<const float> mlp, const CtrBatchView& batch,
                                     const BatchRows& rows,
                                     const std::vector<std::vector<float>>& pulled,
                                     bool backward) override {
    return CtrForwardBackward(shape_, mlp, batch, rows, pulled, backward);
  }

 private:
  const CtrModelShape shape_;
};

}  // namespace

std::unique_ptr<CtrCompute> CpuCtrCompute(const CtrModelShape& shape) {
  return std::make_unique<CpuCompute>(shape);
}

}  // namespace paramserver
