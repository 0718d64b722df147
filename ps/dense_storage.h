// A shard's range of the dense parameter vector: its values, which a pull may share
// without a copy (copy on write), and the update rule that changes them.
#ifndef PARAMSERVER_PS_DENSE_STORAGE_H_
#define PARAMSERVER_PS_DENSE_STORAGE_H_

#include <memory>
#include <string>
#include <vector>

#include "common/wire/shard_layout.h"
#include "ps/dense_update_rule.h"
#include "ps/shard_storage.h"

namespace paramserver {

// Thread-compatible, as ShardStorage. Only a copy of Share()'s pointer made under the
// shard's lock shares the values, which is what lets Apply tell whether one does.
class DenseStorage final : public ShardStorage {
 public:
  // REQUIRES: values.size() == range.size(), rule of as many parameters.
  DenseStorage(int shard_id, ParameterRange range, std::vector<float> values,
               std::unique_ptr<DenseUpdateRule> rule);

  absl::Status CheckGradientShape(const CheckedRowIds& rows,
                                  absl::Span<const float> gradient) const override;
  size_t FirstUnsafeElement(int64_t step, RowIdsView rows, const StepHyperparameters& settings,
                            absl::Span<const float> gradient) override;
  std::string DescribeElement(RowIdsView, size_t) const override { return ""; }
  // Writes the present version in place when nobody shares it, else a new one (the
  // shared one never changes). Never fails.
  absl::Status Apply(int64_t step, RowIdsView rows, const StepHyperparameters& settings,
                     absl::Span<const float> gradient) override;
  absl::Status PrepareFor(const StepHyperparameters& settings) override;
  void Mean(const std::vector<const CheckedRowIds*>& rows,
            const std::vector<absl::Span<const float>>& gradients, CheckedRowIds* mean_rows,
            std::vector<float>* mean) const override;
  void AppendValues(RowIdsView rows, WireDtype encoding, std::string* bytes) const override;
  void Save(int64_t step, RowOrder order, ShardState* state) const override;

  // The present version, which no later update changes.
  std::shared_ptr<const std::vector<float>> Share() const { return values_; }
  const std::vector<float>& values() const { return *values_; }
  // Overwrites the values (a torch job's first ones). REQUIRES: nobody shares them
  // (no pull has seen any), values.size() == the range's.
  void SetValues(absl::Span<const float> values);

 private:
  const int shard_id_;
  const ParameterRange range_;
  // The values as of the last update.
  std::shared_ptr<std::vector<float>> values_;
  // The version an update replaced while it was shared: its buffer is the next one's
  // once its readers let go (a fresh buffer would fault in every page).
  std::shared_ptr<std::vector<float>> retired_;
  std::unique_ptr<DenseUpdateRule> rule_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_PS_DENSE_STORAGE_H_
