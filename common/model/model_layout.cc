#include "common/model/model_layout.h"

#include <cmath>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/safetensors.h"

namespace paramserver {

int64_t TensorSlot::size() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<ModelLayout> ModelLayout::Create(const std::vector<DenseTensorSpec>& dense,
                                                std::vector<EmbeddingTableSlot> embeddings) {
  constexpr int64_t kMaxParameters = int64_t{1} << 62;
  ModelLayout layout;
  std::set<std::string> names;
  for (const DenseTensorSpec& spec : dense) {
    if (spec.name.empty() || !names.insert(spec.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("the model's tensor name '", spec.name, "' is empty or repeated"));
    }
    int64_t size = 1;
    for (int64_t d : spec.shape) {
      if (d < 1 || size > kMaxParameters / d) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", spec.name, "' has shape [",
                                                       absl::StrJoin(spec.shape, ", "),
                                                       "]: every dimension must be >= 1"));
      }
      size *= d;
    }
    if (layout.dense_parameters_ > kMaxParameters - size) {
      return absl::InvalidArgumentError(
          absl::StrCat("the model has more than 2^62 parameters at tensor '", spec.name, "'"));
    }
    const bool buffer = spec.kind != DenseTensorKind::kParameter;
    if (!buffer && layout.trained_parameters_ != layout.dense_parameters_) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter '", spec.name,
                       "' follows a buffer: every buffer must follow every parameter"));
    }
    layout.dense_.push_back({spec.name, spec.shape, layout.dense_parameters_, spec.kind});
    layout.dense_parameters_ += size;
    if (!buffer) layout.trained_parameters_ = layout.dense_parameters_;
  }
  for (const EmbeddingTableSlot& table : embeddings) {
    if (table.name.empty() || !names.insert(table.name).second || table.dim < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "embedding table '", table.name, "' (dim ", table.dim,
          "): names must be non-empty and distinct from every other tensor's, dim >= 1"));
    }
    const std::optional<SettingProblem> problem = FindTableSettingsProblem(table.settings);
    if (problem.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("embedding table '", table.name,
                                                     "': ", problem->key, ": ", problem->problem));
    }
  }
  layout.embeddings_ = std::move(embeddings);
  return layout;
}

absl::StatusOr<std::vector<float>> LoadDenseParameters(const ModelLayout& layout,
                                                       const std::string& path) {
  PS_ASSIGN_OR_RETURN(std::vector<NamedTensor> tensors, ReadSafetensorsFile(path));
  std::vector<float> params(layout.dense_parameters());
  for (const TensorSlot& slot : layout.dense_tensors()) {
    const NamedTensor* found = nullptr;
    for (const NamedTensor& t : tensors) {
      if (t.name == slot.name) found = &t;
    }
    if (found == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", slot.name, "' is missing; the model needs it"));
    }
    const bool integer = slot.kind == DenseTensorKind::kIntegerBuffer;
    if (found->dtype != TensorDtype::kF32 && !integer) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", slot.name, "' must be F32, it is I64"));
    }
    if (found->shape != slot.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor '", slot.name, "' has shape [", absl::StrJoin(found->shape, ", "),
          "], the model needs [", absl::StrJoin(slot.shape, ", "), "]"));
    }
    if (found->dtype == TensorDtype::kF32) {
      std::copy(found->values.begin(), found->values.end(), params.begin() + slot.offset);
      continue;
    }
    for (size_t i = 0; i < found->int_values.size(); ++i) {
      const int64_t value = found->int_values[i];
      if (value < -kMaxExactIntegerBuffer || value > kMaxExactIntegerBuffer) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": integer buffer '", slot.name, "' holds ", value,
                         ": the servers hold integer buffers exactly up to 2^24"));
      }
      params[slot.offset + i] = static_cast<float>(value);
    }
  }
  return params;
}

std::vector<NamedTensor> DenseTensorsOf(const ModelLayout& layout,
                                        const std::vector<float>& params) {
  std::vector<NamedTensor> tensors;
  for (const TensorSlot& slot : layout.dense_tensors()) {
    const auto begin = params.begin() + slot.offset;
    const auto end = begin + slot.size();
    if (slot.kind != DenseTensorKind::kIntegerBuffer) {
      tensors.push_back({slot.name, slot.shape, std::vector<float>(begin, end)});
      continue;
    }
    NamedTensor& tensor = tensors.emplace_back();
    tensor.name = slot.name;
    tensor.shape = slot.shape;
    tensor.dtype = TensorDtype::kI64;
    for (auto value = begin; value != end; ++value)
      tensor.int_values.push_back(static_cast<int64_t>(std::llround(*value)));
  }
  return tensors;
}

absl::Status SaveDenseParameters(const ModelLayout& layout, const std::vector<float>& params,
                                 const std::string& path) {
  return WriteSafetensorsFile(path, DenseTensorsOf(layout, params));
}

}  // namespace paramserver
