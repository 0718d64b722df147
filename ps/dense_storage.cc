#include "ps/dense_storage.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"

namespace paramserver {

DenseStorage::DenseStorage(int shard_id, ParameterRange range, std::vector<float> values,
                           std::unique_ptr<DenseUpdateRule> rule)
    : shard_id_(shard_id),
      range_(range),
      values_(std::make_shared<std::vector<float>>(std::move(values))),
      rule_(std::move(rule)) {}

absl::Status DenseStorage::CheckGradientShape(const CheckedRowIds& rows,
                                              absl::Span<const float> gradient) const {
  if (!rows.view().ids.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", shard_id_, " holds dense parameters; ids name embedding rows"));
  }
  if (static_cast<int64_t>(gradient.size()) != range_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", shard_id_, " has ", range_.size(),
                                                   " parameters; the gradient has ",
                                                   gradient.size()));
  }
  return absl::OkStatus();
}

size_t DenseStorage::FirstUnsafeElement(int64_t step, RowIdsView,
                                        const StepHyperparameters& settings,
                                        absl::Span<const float> gradient) {
  return rule_->FirstUnsafeElement(step, gradient, *values_, settings);
}

absl::Status DenseStorage::PrepareFor(const StepHyperparameters& settings) {
  return rule_->PrepareFor(settings);
}

absl::Status DenseStorage::Apply(int64_t step, RowIdsView, const StepHyperparameters& settings,
                                 absl::Span<const float> gradient) {
  if (values_.use_count() > 1) {
    // A reply is still sending this version: the update goes to another buffer.
    std::shared_ptr<std::vector<float>> next;
    if (retired_ != nullptr && retired_.use_count() == 1) {
      std::atomic_thread_fence(std::memory_order_acquire);  // its last reader is done with it
      next = std::move(retired_);
    } else {
      next = std::make_shared<std::vector<float>>(values_->size());
    }
    std::copy(values_->begin(), values_->end(), next->begin());
    retired_ = std::exchange(values_, std::move(next));
  } else {
    std::atomic_thread_fence(std::memory_order_acquire);
  }
  rule_->Apply(step, gradient, absl::MakeSpan(*values_), settings);
  return absl::OkStatus();
}

void DenseStorage::Mean(const std::vector<const CheckedRowIds*>&,
                        const std::vector<absl::Span<const float>>& gradients, CheckedRowIds*,
                        std::vector<float>* mean) const {
  mean->assign(values_->size(), 0.0f);
  for (absl::Span<const float> g : gradients) {
    for (size_t i = 0; i < mean->size(); ++i) (*mean)[i] += g[i];
  }
  const float scale = 1.0f / static_cast<float>(gradients.size());
  for (float& x : *mean) x *= scale;
}

void DenseStorage::AppendValues(RowIdsView, WireDtype encoding, std::string* bytes) const {
  AppendEncoded(encoding, *values_, bytes);
}

void DenseStorage::Save(int64_t step, RowOrder, ShardState* state) const {
  state->step = step;
  state->values = *values_;
  rule_->SaveState(state);
}

void DenseStorage::SetValues(absl::Span<const float> values) {
  std::copy(values.begin(), values.end(), values_->begin());
}

}  // namespace paramserver
