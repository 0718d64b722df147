#include "ps/dense_update_rule.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ps/dense_optimizer.h"

namespace paramserver {
namespace {

class ElementwiseRule final : public DenseUpdateRule {
 public:
  explicit ElementwiseRule(DenseOptimizer optimizer) : optimizer_(std::move(optimizer)) {}

  // The optimizer counts its own steps: `step` is always its next one.
  void Apply(int64_t, absl::Span<const float> gradient, absl::Span<float> values) override {
    optimizer_.Apply(gradient, values);
  }
  size_t FirstUnsafeElement(int64_t, absl::Span<const float> gradient,
                            absl::Span<const float> values) const override {
    return optimizer_.FirstUnsafeElement(gradient, values);
  }
  void SaveState(ShardState* state) const override {
    state->optimizer = std::string(DenseOptimizerName(optimizer_.options().type));
    state->slots = optimizer_.slots();
  }

 private:
  DenseOptimizer optimizer_;
};

}  // namespace

std::unique_ptr<DenseUpdateRule> MakeDenseUpdateRule(const DenseOptimizerOptions& options,
                                                     int64_t size) {
  return std::make_unique<ElementwiseRule>(DenseOptimizer(options, size));
}

absl::Status CheckResumableState(const DenseOptimizerOptions& options, const ShardState& state) {
  const std::string name(DenseOptimizerName(options.type));
  const std::vector<std::string> slots = DenseOptimizerSlotNames(options);
  if (state.optimizer != name || state.slots.size() != slots.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", state.shard_id, " was saved with optimizer '", state.optimizer, "' (",
        state.slots.size(), " state arrays per parameter); the spec's training.optimizer is ", name,
        ", which keeps ", slots.size(), slots.empty() ? "" : " (", absl::StrJoin(slots, ", "),
        slots.empty() ? "" : ")", ": resume with the optimizer the job was saved with"));
  }
  for (size_t k = 0; k < slots.size(); ++k) {
    if (static_cast<int64_t>(state.slots[k].size()) != state.range.size()) {
      return absl::FailedPreconditionError(
          absl::StrCat("shard ", state.shard_id, ": its ", slots[k], " holds ",
                       state.slots[k].size(), " floats for ", state.range.size(), " parameters"));
    }
  }
  return absl::OkStatus();
}

std::unique_ptr<DenseUpdateRule> ResumeDenseUpdateRule(const DenseOptimizerOptions& options,
                                                       ShardState* state) {
  return std::make_unique<ElementwiseRule>(
      DenseOptimizer(options, state->step, std::move(state->slots)));
}

}  // namespace paramserver
