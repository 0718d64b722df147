#include "common/model/step_optimizer.h"

#include <cmath>
#include <string>

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

DenseOptimizerOptions Sgd() {
  DenseOptimizerOptions o = DenseOptimizerDefaults(DenseOptimizerType::kSgd);
  o.learning_rate = 0.1;
  o.momentum = 0.9;
  return o;
}

StepHyperparameters TwoGroups() {
  StepHyperparameters runs(2);
  runs[0].begin = 0;
  runs[0].end = 6;
  runs[0].group = 0;
  runs[0].options = Sgd();
  runs[0].options.weight_decay = 0.01;
  runs[1].begin = 6;
  runs[1].end = 10;
  runs[1].group = 1;
  runs[1].options = Sgd();
  runs[1].options.learning_rate = 0.05;
  runs[1].options.nesterov = true;
  return runs;
}

TEST_CASE("a step's hyperparameters go through their wire form unchanged") {
  StepOptimizer proto;
  StepHyperparametersToProto(DenseOptimizerType::kSgd, TwoGroups(), &proto);
  CHECK(proto.type() == "sgd");
  absl::StatusOr<StepHyperparameters> back = StepHyperparametersFromProto(proto, Sgd(), 10);
  REQUIRE(back.ok());
  CHECK(DescribeHyperparameterDifference(*back, TwoGroups()).empty());
  CHECK((*back)[1].options.learning_rate == 0.05);
  CHECK((*back)[1].options.nesterov);
  CHECK((*back)[0].options.weight_decay == 0.01);
}

TEST_CASE("a peer's step hyperparameters are checked, naming the group and the field") {
  const auto refusal = [](StepOptimizer proto, int64_t size = 10) {
    absl::StatusOr<StepHyperparameters> read = StepHyperparametersFromProto(proto, Sgd(), size);
    REQUIRE(!read.ok());
    CHECK(read.status().code() == absl::StatusCode::kInvalidArgument);
    return std::string(read.status().message());
  };
  StepOptimizer good;
  StepHyperparametersToProto(DenseOptimizerType::kSgd, TwoGroups(), &good);

  StepOptimizer other_type = good;
  other_type.set_type("adam");
  CHECK_THAT(refusal(other_type), Catch::Contains("'adam'") && Catch::Contains("state of sgd"));

  CHECK_THAT(refusal(good, 12), Catch::Contains("cover 10 of the range's 12"));
  StepOptimizer gap = good;
  gap.mutable_runs(1)->set_begin(7);
  CHECK_THAT(refusal(gap), Catch::Contains("param_groups[1] covers [7, 10)"));
  StepOptimizer past_end = good;
  past_end.mutable_runs(1)->set_end(11);
  CHECK_THAT(refusal(past_end), Catch::Contains("[6, 11)"));

  StepOptimizer negative_lr = good;
  negative_lr.mutable_runs(1)->set_lr(-0.1);
  CHECK_THAT(refusal(negative_lr), Catch::Contains("param_groups[1]'s lr is -0.1"));
  StepOptimizer nan_decay = good;
  nan_decay.mutable_runs(0)->set_weight_decay(std::nan(""));
  CHECK_THAT(refusal(nan_decay), Catch::Contains("param_groups[0]'s weight_decay is nan"));
  StepOptimizer beta_one = good;
  beta_one.mutable_runs(0)->set_beta1(1.0);
  CHECK_THAT(refusal(beta_one), Catch::Contains("betas[0] is 1: it must be in [0, 1)"));
  StepOptimizer zero_eps = good;
  zero_eps.mutable_runs(0)->set_eps(0);
  CHECK_THAT(refusal(zero_eps), Catch::Contains("eps is 0: it must be finite and > 0"));
  StepOptimizer nesterov_damped = good;
  nesterov_damped.mutable_runs(1)->set_dampening(0.5);
  CHECK_THAT(refusal(nesterov_damped), Catch::Contains("param_groups[1] sets nesterov"));
  // A rate of 0 is torch's to allow (a schedule may reach it).
  StepOptimizer zero_lr = good;
  zero_lr.mutable_runs(0)->set_lr(0);
  CHECK(StepHyperparametersFromProto(zero_lr, Sgd(), 10).ok());
}

// Tensors "w" (6 values) and "b" (4): TwoGroups' runs, one tensor each.
ModelLayout WeightAndBias() {
  absl::StatusOr<ModelLayout> layout = ModelLayout::Create({{"w", {2, 3}}, {"b", {4}}}, {});
  REQUIRE(layout.ok());
  return *layout;
}

TEST_CASE("a script's settings must keep, tensor by tensor, the state the spec keeps") {
  const ModelLayout layout = WeightAndBias();
  CHECK(CheckStepKeepsSpecState(TwoGroups(), Sgd(), layout).ok());

  StepHyperparameters no_momentum = TwoGroups();
  no_momentum[1].options.momentum = 0;
  no_momentum[1].options.nesterov = false;
  const absl::Status dropped = CheckStepKeepsSpecState(no_momentum, Sgd(), layout);
  CHECK(dropped.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(dropped.message()),
             Catch::StartsWith("param_groups[1] keeps optimizer state (none) where the servers "
                               "keep (momentum_buffer) for tensor 'b', as training.optimizer "
                               "sets it"));

  DenseOptimizerOptions spec_with_group = Sgd();
  spec_with_group.groups.push_back({{"b"}, Sgd()});
  spec_with_group.groups[0].options.momentum = 0;
  CHECK(CheckStepKeepsSpecState(no_momentum, spec_with_group, layout).ok());
  CHECK_THAT(std::string(CheckStepKeepsSpecState(TwoGroups(), spec_with_group, layout).message()),
             Catch::Contains("for tensor 'b', as training.optimizer.groups[0] sets it"));

  DenseOptimizerOptions adagrad = DenseOptimizerDefaults(DenseOptimizerType::kAdagrad);
  adagrad.initial_accumulator_value = 0.1;
  StepHyperparameters accumulators = TwoGroups();
  for (OptimizerSegment& run : accumulators) run.options = adagrad;
  CHECK(CheckStepKeepsSpecState(accumulators, adagrad, layout).ok());
  accumulators[0].options.initial_accumulator_value = 0;
  CHECK_THAT(std::string(CheckStepKeepsSpecState(accumulators, adagrad, layout).message()),
             Catch::StartsWith("param_groups[0] sets initial_accumulator_value 0 where the "
                               "servers' is 0.1 for tensor 'w'"));

  DenseOptimizerOptions scheduled = Sgd();
  scheduled.lr_schedule.warmup_steps = 5;
  CHECK_THAT(std::string(CheckStepKeepsSpecState(TwoGroups(), scheduled, layout).message()),
             Catch::Contains("the spec sets training.optimizer.lr_schedule"));
}

TEST_CASE("two steps' hyperparameters are told apart by the first differing setting") {
  StepHyperparameters other = TwoGroups();
  other[1].options.learning_rate = 0.07;
  CHECK(DescribeHyperparameterDifference(TwoGroups(), other) == "group 1's lr: 0.05 and 0.07");
  other = TwoGroups();
  other[0].options.nesterov = true;
  CHECK(DescribeHyperparameterDifference(TwoGroups(), other) ==
        "group 0's nesterov: False and True");
  other = TwoGroups();
  other[0].end = other[1].begin = 5;
  CHECK_THAT(DescribeHyperparameterDifference(TwoGroups(), other),
             Catch::Contains("[0, 6) in group 0 and [0, 5) in group 0"));
  CHECK_THAT(DescribeHyperparameterDifference(TwoGroups(), {}), Catch::Contains("the spec's"));
  // -0.0 and 0.0 are different bits: torch would compute with either, the servers with one.
  other = TwoGroups();
  other[0].options.dampening = -0.0;
  CHECK(!DescribeHyperparameterDifference(TwoGroups(), other).empty());
}

}  // namespace
}  // namespace paramserver
