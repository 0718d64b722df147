// training.optimizer.groups resolved against a model: which settings each run of the
// flat parameter vector trains with. Parameter groups as torch.optim's param_groups: a
// group names its tensors by pattern and overrides any setting of the optimizer's type;
// a tensor no group names trains with the optimizer's own settings.
#ifndef PARAMSERVER_COMMON_MODEL_OPTIMIZER_GROUPS_H_
#define PARAMSERVER_COMMON_MODEL_OPTIMIZER_GROUPS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/cluster_spec.h"
#include "common/model/model_layout.h"
#include "common/wire/shard_layout.h"

namespace paramserver {

// The per-parameter state `options` keeps, named by torch's state keys, in slot order:
//   sgd      momentum_buffer (when momentum > 0)
//   adam     exp_avg, exp_avg_sq, then max_exp_avg_sq with amsgrad (adamw the same)
//   adagrad  sum
//   rmsprop  square_avg, then momentum_buffer (momentum > 0), then grad_avg (centered)
std::vector<std::string> DenseOptimizerSlotNames(const DenseOptimizerOptions& options);

// A run of consecutive dense parameters [begin, end) that share their settings.
struct OptimizerSegment {
  int64_t begin = 0;
  int64_t end = 0;
  int group = -1;                 // index in options.groups; -1: the optimizer's own settings
  DenseOptimizerOptions options;  // its groups empty
  // A run of one kind of the model's buffers (ModelLayout::trained_parameters() on) has
  // no optimizer and no state: an update adds its "gradient" (the workers' change to the
  // buffer) to the values, an integer buffer's rounded to the nearest integer. group is
  // -1; options are plain SGD (no momentum: no slots) and unused.
  DenseTensorKind kind = DenseTensorKind::kParameter;
  bool is_buffer() const { return kind != DenseTensorKind::kParameter; }
};

// The segments covering every dense tensor of `layout`, in order, adjacent tensors of
// one group merged, the buffers in segments of their own. A parameter is in the group
// whose pattern (shell-style: * and ?, as fnmatch) matches its name; patterns are not
// matched against buffers. INVALID_ARGUMENT naming both for a pattern that matches no
// parameter, and for a parameter two groups' patterns match (naming the patterns).
absl::StatusOr<std::vector<OptimizerSegment>> OptimizerSegments(
    const DenseOptimizerOptions& options, const ModelLayout& layout);

// `segments` cut to `range`, their offsets made relative to range.begin.
std::vector<OptimizerSegment> SegmentsWithin(const std::vector<OptimizerSegment>& segments,
                                             ParameterRange range);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_MODEL_OPTIMIZER_GROUPS_H_
