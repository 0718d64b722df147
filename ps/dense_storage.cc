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

namespace {

// The loops of the mean, on pointers that alias nothing, so that they vectorise.
void StartSum(const float* __restrict g, size_t n, float* __restrict sum) {
  for (size_t i = 0; i < n; ++i) sum[i] = 0.0f + g[i];  // 0 + -0 is +0, as summing from 0 gives
}
void AddTo(const float* __restrict g, size_t n, float* __restrict sum) {
  for (size_t i = 0; i < n; ++i) sum[i] += g[i];
}
void Scale(float scale, size_t n, float* __restrict sum) {
  for (size_t i = 0; i < n; ++i) sum[i] *= scale;
}
void ScaledSum(const float* __restrict g, float scale, size_t n, float* __restrict mean) {
  for (size_t i = 0; i < n; ++i) mean[i] = (0.0f + g[i]) * scale;
}

}  // namespace

void DenseStorage::Mean(const std::vector<const CheckedRowIds*>&,
                        const std::vector<absl::Span<const float>>& gradients, CheckedRowIds*,
                        std::vector<float>* mean) const {
  // Each element is ((0 + g_0) + g_1 + ...) * (1 / n), summed in the order given: the
  // same bits as a pass over the whole buffer per gradient, done a block at a time so
  // that the sum stays in cache (one pass in all for one worker).
  const size_t size = values_->size();
  mean->resize(size);
  const float scale = 1.0f / static_cast<float>(gradients.size());
  float* out = mean->data();
  if (gradients.size() == 1) {
    ScaledSum(gradients[0].data(), scale, size, out);
    return;
  }
  constexpr size_t kBlock = 4096;  // 16 KB of sums
  for (size_t begin = 0; begin < size; begin += kBlock) {
    const size_t n = std::min(kBlock, size - begin);
    StartSum(gradients[0].data() + begin, n, out + begin);
    for (size_t g = 1; g < gradients.size(); ++g)
      AddTo(gradients[g].data() + begin, n, out + begin);
    Scale(scale, n, out + begin);
  }
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
