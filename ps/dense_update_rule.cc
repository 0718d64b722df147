#include "ps/dense_update_rule.h"

#include <utility>

#include "ps/adam_optimizer.h"

namespace paramserver {
namespace {

class AdamRule final : public DenseUpdateRule {
 public:
  explicit AdamRule(AdamOptimizer adam) : adam_(std::move(adam)) {}

  // AdamOptimizer counts its own steps: `step` is always its next one.
  void Apply(int64_t, absl::Span<const float> gradient, absl::Span<float> values) override {
    adam_.Apply(gradient, values);
  }
  size_t FirstUnsafeElement(int64_t, absl::Span<const float> gradient) const override {
    return adam_.FirstUnsafeElement(gradient);
  }
  void SaveState(ShardState* state) const override {
    state->first_moment = adam_.first_moment();
    state->second_moment = adam_.second_moment();
  }

 private:
  AdamOptimizer adam_;
};

}  // namespace

std::unique_ptr<DenseUpdateRule> MakeAdamRule(const AdamOptions& options, int64_t size) {
  return std::make_unique<AdamRule>(AdamOptimizer(options, size));
}

std::unique_ptr<DenseUpdateRule> MakeAdamRule(const AdamOptions& options, int64_t applied_updates,
                                              std::vector<float> first_moment,
                                              std::vector<float> second_moment) {
  return std::make_unique<AdamRule>(
      AdamOptimizer(options, applied_updates, std::move(first_moment), std::move(second_moment)));
}

}  // namespace paramserver
