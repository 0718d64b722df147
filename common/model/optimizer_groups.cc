#include "common/model/optimizer_groups.h"

#include <fnmatch.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace paramserver {

std::vector<std::string> DenseOptimizerSlotNames(const DenseOptimizerOptions& options) {
  switch (options.type) {
    case DenseOptimizerType::kSgd:
      if (options.momentum > 0) return {"momentum_buffer"};
      return {};
    case DenseOptimizerType::kAdam:
    case DenseOptimizerType::kAdamW:
      if (options.amsgrad) return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
      return {"exp_avg", "exp_avg_sq"};
    case DenseOptimizerType::kAdagrad:
      return {"sum"};
    case DenseOptimizerType::kRmsprop: {
      std::vector<std::string> names = {"square_avg"};
      if (options.momentum > 0) names.push_back("momentum_buffer");
      if (options.centered) names.push_back("grad_avg");
      return names;
    }
  }
  return {};
}

absl::StatusOr<std::vector<OptimizerSegment>> OptimizerSegments(
    const DenseOptimizerOptions& options, const ModelLayout& layout) {
  const std::vector<DenseOptimizerGroup>& groups = options.groups;
  // Which group each pattern of each group matched, and each tensor's group.
  std::vector<std::vector<bool>> pattern_used(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) pattern_used[g].assign(groups[g].params.size(), false);
  DenseOptimizerOptions own = options;
  own.groups.clear();
  std::vector<OptimizerSegment> segments;
  // Extends the last segment over `tensor` if it is of the same group and kind, or starts
  // one with `settings`.
  const auto add = [&](const TensorSlot& tensor, int group, const DenseOptimizerOptions& settings) {
    if (!segments.empty() && segments.back().kind == tensor.kind &&
        segments.back().group == group && segments.back().end == tensor.offset) {
      segments.back().end = tensor.offset + tensor.size();
      return;
    }
    OptimizerSegment& segment = segments.emplace_back();
    segment.begin = tensor.offset;
    segment.end = tensor.offset + tensor.size();
    segment.group = group;
    segment.kind = tensor.kind;
    segment.options = settings;
  };
  DenseOptimizerOptions stateless;  // a buffer's: SGD without momentum keeps no state
  stateless.type = DenseOptimizerType::kSgd;
  for (const TensorSlot& tensor : layout.dense_tensors()) {
    if (tensor.is_buffer()) {
      add(tensor, -1, stateless);
      continue;
    }
    int group = -1;
    std::string claimed_by;
    for (size_t g = 0; g < groups.size(); ++g) {
      for (size_t p = 0; p < groups[g].params.size(); ++p) {
        const std::string& pattern = groups[g].params[p];
        if (fnmatch(pattern.c_str(), tensor.name.c_str(), 0) != 0) continue;
        pattern_used[g][p] = true;
        if (group >= 0 && group != static_cast<int>(g)) {
          return absl::InvalidArgumentError(
              absl::StrCat("training.optimizer.groups: tensor '", tensor.name,
                           "' is claimed by group ", group, " (", claimed_by, ") and group ", g,
                           " ('", pattern, "'): a tensor may be in one group only"));
        }
        group = static_cast<int>(g);
        claimed_by = absl::StrCat("'", pattern, "'");
      }
    }
    add(tensor, group, group < 0 ? own : groups[group].options);
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t p = 0; p < groups[g].params.size(); ++p) {
      if (pattern_used[g][p]) continue;
      std::string names;
      for (const TensorSlot& tensor : layout.dense_tensors()) {
        if (tensor.is_buffer()) continue;
        if (names.size() > 200) {
          absl::StrAppend(&names, ", ...");
          break;
        }
        absl::StrAppend(&names, names.empty() ? "" : ", ", tensor.name);
      }
      return absl::InvalidArgumentError(
          absl::StrCat("training.optimizer.groups: group ", g, "'s pattern '", groups[g].params[p],
                       "' matches no tensor of the model (its tensors: ", names, ")"));
    }
  }
  return segments;
}

std::vector<OptimizerSegment> SegmentsWithin(const std::vector<OptimizerSegment>& segments,
                                             ParameterRange range) {
  std::vector<OptimizerSegment> within;
  for (const OptimizerSegment& segment : segments) {
    const int64_t begin = std::max(segment.begin, range.begin);
    const int64_t end = std::min(segment.end, range.end);
    if (begin >= end) continue;
    OptimizerSegment& cut = within.emplace_back(segment);
    cut.begin = begin - range.begin;
    cut.end = end - range.begin;
  }
  return within;
}

}  // namespace paramserver
