// Adam, exactly as torch.optim.Adam computes it (no weight decay, no amsgrad).
#ifndef PARAMSERVER_PS_ADAM_OPTIMIZER_H_
#define PARAMSERVER_PS_ADAM_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "common/config/cluster_spec.h"

namespace paramserver {

// The optimizer state of a range of parameters: first and second moments and the
// number of updates applied so far. Not thread-safe; its owner serialises updates.
class AdamOptimizer {
 public:
  AdamOptimizer(AdamOptions options, int64_t size);
  // Resumes from saved state. REQUIRES: first_moment.size() == second_moment.size().
  AdamOptimizer(AdamOptions options, int64_t step, std::vector<float> first_moment,
                std::vector<float> second_moment);

  // Applies one update with `gradient` to `params` and increments the step:
  //   t += 1; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2;
  //   p -= lr / (1-b1^t) * m / (sqrt(v) / sqrt(1-b2^t) + eps)
  // Vectorised; at 2^18 parameters and more the work is split over the machine's cores
  // (the caller's thread and helpers it joins before returning). Every path rounds the
  // same: the result is bit-identical to the plain loop's, in this order of operations.
  // REQUIRES: gradient.size() == params.size() == size.
  void Apply(absl::Span<const float> gradient, absl::Span<float> params);

  // The first element of `gradient` that Apply, called now, would let take the moments
  // out of the accepted range (ps/optimizer_state_limit.h), or gradient.size() if none
  // would: each of g*g, the new first moment and the new second moment must pass
  // StateValueAccepted, computed in Apply's float arithmetic against the present
  // moments. g*g is checked besides the second moment Apply writes, (1-b2)*g*g added to
  // b2*v: that sum is an average of g*g, which a steady gradient g drives to g*g itself,
  // so a gradient whose square is out of range would take the second moment out of it
  // after some steps even where one step does not. (The parameters move by about the
  // learning rate per step whatever the gradient, so they need no check.) Changes nothing.
  // REQUIRES: gradient.size() == size.
  size_t FirstUnsafeElement(absl::Span<const float> gradient) const;

  int64_t step() const { return step_; }
  const std::vector<float>& first_moment() const { return m_; }
  const std::vector<float>& second_moment() const { return v_; }

 private:
  AdamOptions options_;
  int64_t step_ = 0;
  std::vector<float> m_;
  std::vector<float> v_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_PS_ADAM_OPTIMIZER_H_
