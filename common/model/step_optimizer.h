// A step's own hyperparameters for a dense shard: what a script's
// paramserver.DistributedOptimizer sends with each push (its param_groups at that step),
// in place of the spec's training.optimizer settings and lr_schedule. Their wire form is
// proto StepOptimizer; this reads it (checking everything a peer could get wrong), writes
// it, and tells two steps' apart.
#ifndef PARAMSERVER_COMMON_MODEL_STEP_OPTIMIZER_H_
#define PARAMSERVER_COMMON_MODEL_STEP_OPTIMIZER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/cluster_spec.h"
#include "common/model/model_layout.h"
#include "common/model/optimizer_groups.h"
#include "proto/parameter_server.pb.h"

namespace paramserver {

// Runs covering a dense range in order, offsets from its start, each with its group's
// settings for one update (`group`: the script's param_groups index). Empty: the spec's.
using StepHyperparameters = std::vector<OptimizerSegment>;

// `runs`, of the spec's `type`, into *proto.
void StepHyperparametersToProto(DenseOptimizerType type, const StepHyperparameters& runs,
                                StepOptimizer* proto);

// A peer's StepOptimizer for a range of `size` parameters whose servers keep `spec`'s
// type (spec's initial_accumulator_value is kept: it only sets up the state).
// INVALID_ARGUMENT naming the field, and the run's group, for another type, runs that do
// not cover [0, size) in order, or a value that is not finite or that torch.optim (or a
// finite state) refuses: a negative lr, weight_decay, momentum or lr_decay; betas or
// alpha outside [0, 1); dampening outside [0, 1]; eps <= 0; nesterov without momentum
// or with dampening.
absl::StatusOr<StepHyperparameters> StepHyperparametersFromProto(const StepOptimizer& proto,
                                                                 const DenseOptimizerOptions& spec,
                                                                 int64_t size);

// OK if a script's `step` settings (runs over the whole dense vector of `layout`, as
// StepHyperparametersFromProto reads them, each run's initial_accumulator_value the
// script's) may drive servers that keep `spec`'s state (training.optimizer and its
// groups): on every parameter (the settings over buffers are not used) the same slots
// (DenseOptimizerSlotNames: momentum on or off, amsgrad, centered) and adagrad's
// initial_accumulator_value, and no spec lr_schedule (the script's optimizer sets the rates).
// INVALID_ARGUMENT naming the param group, the first tensor and both settings otherwise. REQUIRES:
// OptimizerSegments(spec, layout) ok.
absl::Status CheckStepKeepsSpecState(const StepHyperparameters& step,
                                     const DenseOptimizerOptions& spec, const ModelLayout& layout);

// The first difference between two steps' hyperparameters, as "group 1's lr: 0.1 and
// 0.2" (or how their runs differ), or "" when they are alike bit for bit.
std::string DescribeHyperparameterDifference(const StepHyperparameters& a,
                                             const StepHyperparameters& b);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_MODEL_STEP_OPTIMIZER_H_
