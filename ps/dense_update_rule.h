// The plug-in point for the optimizer of a dense range: how one update changes the
// values, what state it keeps, and which gradients its state could not hold. A shard
// holds one rule for its range and calls it under its lock; the rule knows nothing of
// workers, steps' consistency or the log.
#ifndef PARAMSERVER_PS_DENSE_UPDATE_RULE_H_
#define PARAMSERVER_PS_DENSE_UPDATE_RULE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/types/span.h"
#include "common/checkpoint/shard_checkpoint.h"
#include "common/config/cluster_spec.h"

namespace paramserver {

// Thread-compatible; its shard serialises the calls.
class DenseUpdateRule {
 public:
  virtual ~DenseUpdateRule() = default;
  // Applies update number `step` (1 for the first; one more than the last call's) with
  // `gradient` to `values`. REQUIRES: gradient.size() == values.size() == the range's.
  virtual void Apply(int64_t step, absl::Span<const float> gradient, absl::Span<float> values) = 0;
  // The first element of `gradient` that Apply(step, ...) now would let take the rule's
  // state out of the accepted range (ps/optimizer_state_limit.h), or gradient.size().
  virtual size_t FirstUnsafeElement(int64_t step, absl::Span<const float> gradient) const = 0;
  // Writes the rule's state into a checkpoint's fields (first_moment, second_moment).
  virtual void SaveState(ShardState* state) const = 0;
};

// Adam (ps/adam_optimizer.h) over `size` parameters: fresh, or resumed after
// `applied_updates` updates with the given moments (REQUIRES: both of `size` floats).
std::unique_ptr<DenseUpdateRule> MakeAdamRule(const AdamOptions& options, int64_t size);
std::unique_ptr<DenseUpdateRule> MakeAdamRule(const AdamOptions& options, int64_t applied_updates,
                                              std::vector<float> first_moment,
                                              std::vector<float> second_moment);

}  // namespace paramserver

#endif  // PARAMSERVER_PS_DENSE_UPDATE_RULE_H_
