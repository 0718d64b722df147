// The plug-in point for the optimizer of a dense range: how one update changes the
// values, what state it keeps, and which gradients its state could not hold. A shard
// holds one rule for its range and calls it under its lock; the rule knows nothing of
// workers, steps' consistency or the log.
#ifndef PARAMSERVER_PS_DENSE_UPDATE_RULE_H_
#define PARAMSERVER_PS_DENSE_UPDATE_RULE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/checkpoint/shard_checkpoint.h"
#include "common/config/cluster_spec.h"
#include "common/model/optimizer_groups.h"
#include "common/model/step_optimizer.h"

namespace paramserver {

// Thread-compatible; its shard serialises the calls.
class DenseUpdateRule {
 public:
  virtual ~DenseUpdateRule() = default;
  // Applies update number `step` (1 for the first; one more than the last call's) with
  // `gradient` to `values`, with `settings` (a script's for this step; empty: the rule's
  // own). REQUIRES: gradient.size() == values.size() == the range's; settings empty or
  // accepted by PrepareFor.
  virtual void Apply(int64_t step, absl::Span<const float> gradient, absl::Span<float> values,
                     const StepHyperparameters& settings) = 0;
  // The first element of `gradient` that Apply(step, ...) now, on `values`, would let take
  // the rule's state or a value out of the accepted range (ps/optimizer_state_limit.h),
  // or gradient.size(). REQUIRES: as Apply's.
  virtual size_t FirstUnsafeElement(int64_t step, absl::Span<const float> gradient,
                                    absl::Span<const float> values,
                                    const StepHyperparameters& settings) const = 0;
  // OK if updates may run with `settings` (runs covering the range, checked by
  // StepHyperparametersFromProto): each run keeps the state the rule keeps there (the
  // same slots: momentum on or off, amsgrad, centered), and the rule is made ready for
  // them (which changes no result). INVALID_ARGUMENT naming the group, the parameters
  // and both slot lists otherwise.
  virtual absl::Status PrepareFor(const StepHyperparameters& settings) = 0;
  // Writes the rule's state into a checkpoint's fields (optimizer, slots).
  virtual void SaveState(ShardState* state) const = 0;
};

// A range's rule: the optimizer `options` names (ps/dense_optimizer.h) over `size`
// parameters, fresh; with `segments` (its parameter groups' runs, offsets from the
// range's start, covering [0, size): OptimizerSegments and SegmentsWithin), each run with
// its own settings. The rule's state is every slot any run keeps (DenseRuleSlotNames); a
// run without one holds zeros there. A buffer run (OptimizerSegment::kind) keeps no
// state and ignores step settings: an update adds the gradient to its values (an
// integer buffer's sum rounded to the nearest integer), and refuses a sum past
// kLargestAcceptedStateValue.
std::unique_ptr<DenseUpdateRule> MakeDenseUpdateRule(
    const DenseOptimizerOptions& options, int64_t size,
    const std::vector<OptimizerSegment>& segments = {});

// The slots such a rule saves, in the type's order: every slot the optimizer or any of
// its groups keeps (options.groups), so every shard of a job saves the same ones.
std::vector<std::string> DenseRuleSlotNames(const DenseOptimizerOptions& options);

// What a checkpoint and a replica name that state by: the type and its slots,
// "rmsprop(square_avg,grad_avg)".
std::string DenseRuleStateName(const DenseOptimizerOptions& options);

// OK if `state` (a checkpoint's, a replica's) holds the state of that rule over its
// range: the same DenseRuleStateName, and each slot of the range's size.
// FAILED_PRECONDITION naming both otherwise (a job resumed with another optimizer, or
// one keeping other state, than it was saved with).
absl::Status CheckResumableState(const DenseOptimizerOptions& options, const ShardState& state);

// The rule resumed from `state`'s slots (which it takes) and update count (its step less
// the steps skipped).
// REQUIRES: CheckResumableState(options, *state).ok().
std::unique_ptr<DenseUpdateRule> ResumeDenseUpdateRule(
    const DenseOptimizerOptions& options, ShardState* state,
    const std::vector<OptimizerSegment>& segments = {});

}  // namespace paramserver

#endif  // PARAMSERVER_PS_DENSE_UPDATE_RULE_H_
