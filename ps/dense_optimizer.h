// The servers' dense optimizers, each exactly torch.optim's of the same name (Debian's
// torch 1.13, its single-tensor path): SGD (momentum, dampening, nesterov, weight_decay),
// Adam (weight_decay, amsgrad), AdamW, Adagrad (lr_decay, weight_decay,
// initial_accumulator_value, eps) and RMSprop (alpha, eps, weight_decay, momentum,
// centered). Each element goes through torch's tensor operations in torch's order, each
// rounded to float32 (the build forbids FMA contraction); scalars are computed in double
// and rounded once, as torch turns a Python float into a kernel's scalar.
#ifndef PARAMSERVER_PS_DENSE_OPTIMIZER_H_
#define PARAMSERVER_PS_DENSE_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "common/config/cluster_spec.h"
#include "common/model/optimizer_groups.h"  // DenseOptimizerSlotNames

namespace paramserver {

// The state of a range of parameters: its slots and the number of updates applied so
// far. Not thread-safe; its owner serialises updates.
class DenseOptimizer {
 public:
  // Fresh: no update applied; slots zero (adagrad's sum: initial_accumulator_value).
  DenseOptimizer(DenseOptimizerOptions options, int64_t size);
  // Resumed after `step` updates. REQUIRES: slots as DenseOptimizerSlotNames(options)
  // names them, each of the same size.
  DenseOptimizer(DenseOptimizerOptions options, int64_t step,
                 std::vector<std::vector<float>> slots);

  // Applies update number step() + 1 with `gradient` to `params`, as torch's step() does
  // with `gradient` in .grad. Vectorised; at 2^18 parameters and more the work is split
  // over the machine's cores (joined before it returns). Every path rounds the same: the
  // result is bit-identical to the plain loop's. `settings` (may be null: options()) are
  // this update's hyperparameters, a script's for its step (their lr_schedule is not
  // consulted when empty: their learning_rate is the step's). REQUIRES: gradient.size() ==
  // params.size() == size; settings of options()'s type keeping the same slots
  // (DenseOptimizerSlotNames equal).
  void Apply(absl::Span<const float> gradient, absl::Span<float> params,
             const DenseOptimizerOptions* settings = nullptr);

  // The first element of `gradient` that Apply, called now on `params`, would let take
  // the state or the parameter out of the accepted range (ps/optimizer_state_limit.h), or
  // gradient.size() if none would. It computes, in Apply's float arithmetic, every value
  // the update would write, and the (decayed) gradient and its square where the rule
  // keeps an average or a sum of squares: a steady gradient g drives such an average to
  // g*g itself, so a gradient whose square is out of range is refused even where one
  // step would not leave the range. (Adam's parameters move by about the learning rate
  // per step whatever the gradient, so its check skips them.) Changes nothing.
  // `settings` as for Apply. REQUIRES: gradient.size() == params.size() == size.
  size_t FirstUnsafeElement(absl::Span<const float> gradient, absl::Span<const float> params,
                            const DenseOptimizerOptions* settings = nullptr) const;

  const DenseOptimizerOptions& options() const { return options_; }
  int64_t step() const { return step_; }
  const std::vector<std::vector<float>>& slots() const { return slots_; }

 private:
  DenseOptimizerOptions options_;
  int64_t step_ = 0;
  std::vector<std::vector<float>> slots_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_PS_DENSE_OPTIMIZER_H_
