#include "ps/dense_update_rule.h"

#include <cmath>
#include <vector>

#include "catch2/catch.hpp"
#include "ps/dense_optimizer.h"

namespace paramserver {
namespace {

// Two groups over 6 parameters: [0, 2) SGD with momentum 0.9, [2, 6) momentum 0 and
// lr 0.5 (no momentum buffer of its own).
std::vector<OptimizerSegment> Segments(const DenseOptimizerOptions& options) {
  OptimizerSegment first{0, 2, -1, options};
  OptimizerSegment second{2, 6, 0, options};
  second.options.momentum = 0;
  second.options.learning_rate = 0.5;
  return {first, second};
}

DenseOptimizerOptions Sgd() {
  DenseOptimizerOptions options = DenseOptimizerDefaults(DenseOptimizerType::kSgd);
  options.learning_rate = 0.1;
  options.momentum = 0.9;
  return options;
}

TEST_CASE("each group's run of the range is updated with its own settings") {
  const DenseOptimizerOptions options = Sgd();
  std::unique_ptr<DenseUpdateRule> rule = MakeDenseUpdateRule(options, 6, Segments(options));
  std::vector<float> values(6, 1.0f);
  const std::vector<float> gradient(6, 1.0f);
  rule->Apply(1, gradient, absl::MakeSpan(values), {});
  rule->Apply(2, gradient, absl::MakeSpan(values), {});
  // Momentum group: buf 1 then 1.9, p = 1 - 0.1 - 0.19. Plain group: p = 1 - 0.5 - 0.5.
  CHECK(values[0] == Approx(0.71).epsilon(1e-6));
  CHECK(values[5] == 0.0f);
  ShardState state;
  state.range = {0, 6};
  rule->SaveState(&state);
  CHECK(state.optimizer == "sgd(momentum_buffer)");
  // One momentum buffer for the range, zeros where the group keeps none.
  REQUIRE(state.slots.size() == 1);
  CHECK(state.slots[0] == std::vector<float>{1.9f, 1.9f, 0, 0, 0, 0});
  CHECK(DenseRuleSlotNames(options) == std::vector<std::string>{"momentum_buffer"});
}

TEST_CASE("a rule with groups resumed from its saved state continues bit for bit") {
  const DenseOptimizerOptions options = Sgd();
  std::unique_ptr<DenseUpdateRule> original = MakeDenseUpdateRule(options, 6, Segments(options));
  std::vector<float> values = {1, 2, 3, 4, 5, 6};
  for (int step = 1; step <= 3; ++step) {
    original->Apply(step, std::vector<float>{0.1f * step, -1, 2, 0.5f, -0.25f, 1},
                    absl::MakeSpan(values), {});
  }
  ShardState state;
  state.range = {0, 6};
  state.step = 3;
  original->SaveState(&state);
  REQUIRE(CheckResumableState(options, state).ok());
  std::unique_ptr<DenseUpdateRule> resumed =
      ResumeDenseUpdateRule(options, &state, Segments(options));
  std::vector<float> resumed_values = values;
  const std::vector<float> gradient = {0.7f, 0.2f, -1, 1, 3, -2};
  original->Apply(4, gradient, absl::MakeSpan(values), {});
  resumed->Apply(4, gradient, absl::MakeSpan(resumed_values), {});
  CHECK(resumed_values == values);
  // Without the groups the saved state is another rule's: refused, naming both.
  ShardState saved;
  saved.range = {0, 6};
  original->SaveState(&saved);
  DenseOptimizerOptions no_momentum = options;
  no_momentum.momentum = 0;
  const absl::Status refused = CheckResumableState(no_momentum, saved);
  CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(refused.message() ==
        "shard 0 was saved with optimizer state sgd(momentum_buffer) (1 arrays per parameter); "
        "the spec's training.optimizer keeps sgd(): resume with the optimizer settings the job "
        "was saved with (its type, and whether it keeps momentum, amsgrad's maximum or a "
        "centered average)");
}

TEST_CASE("the first unsafe element is found in whichever group's run holds it") {
  DenseOptimizerOptions options = Sgd();
  std::vector<OptimizerSegment> segments = Segments(options);
  segments[1].options.learning_rate = 1e10;  // the second run's steps overflow sooner
  std::unique_ptr<DenseUpdateRule> rule = MakeDenseUpdateRule(options, 6, segments);
  const std::vector<float> values(6, 0.0f);
  CHECK(rule->FirstUnsafeElement(1, std::vector<float>{1e30f, 1e30f, 1, 1e30f, 1, 1}, values, {}) ==
        3);
  CHECK(rule->FirstUnsafeElement(1, std::vector<float>{1e30f, 1, 1, 1, 1, 1}, values, {}) == 6);
}

TEST_CASE("a script's settings for a step split the rule's runs and update with their rates") {
  const DenseOptimizerOptions options = Sgd();  // one run over the range: lr 0.1, momentum 0.9
  std::unique_ptr<DenseUpdateRule> rule = MakeDenseUpdateRule(options, 4);
  const auto settings = [&](double first_lr, double second_lr) {
    StepHyperparameters runs = {{0, 1, 0, options}, {1, 4, 1, options}};
    runs[0].options.learning_rate = first_lr;
    runs[1].options.learning_rate = second_lr;
    return runs;
  };
  std::vector<float> values(4, 1.0f);
  const std::vector<float> gradient(4, 1.0f);
  REQUIRE(rule->PrepareFor(settings(0.2, 0.05)).ok());
  rule->Apply(1, gradient, absl::MakeSpan(values), settings(0.2, 0.05));
  // buf = g = 1: p = 1 - lr.
  CHECK(values == std::vector<float>{0.8f, 0.95f, 0.95f, 0.95f});
  REQUIRE(rule->PrepareFor(settings(0.1, 0.01)).ok());
  rule->Apply(2, gradient, absl::MakeSpan(values), settings(0.1, 0.01));
  // buf = 0.9 + 1 = 1.9: p = p - lr * 1.9.
  CHECK(values[0] == Approx(0.8 - 0.19).epsilon(1e-6));
  CHECK(values[3] == Approx(0.95 - 0.019).epsilon(1e-6));
  // Without settings the spec's rate is back, on the same state (buf 0.9 * 1.9 + 1).
  const float before = values[2];
  rule->Apply(3, gradient, absl::MakeSpan(values), {});
  CHECK(values[2] == Approx(before - 0.1 * 2.71).epsilon(1e-6));
  ShardState state;
  state.range = {0, 4};
  rule->SaveState(&state);
  CHECK(state.optimizer == "sgd(momentum_buffer)");
  CHECK(state.slots[0] == std::vector<float>(4, state.slots[0][0]));
  CHECK(state.slots[0][0] == Approx(2.71).epsilon(1e-6));

  // Settings that would keep other state than the servers do are refused, naming them.
  StepHyperparameters no_momentum = settings(0.1, 0.1);
  no_momentum[1].options.momentum = 0;
  const absl::Status refused = rule->PrepareFor(no_momentum);
  CHECK(refused.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(refused.message()),
             Catch::Contains("param_groups[1] keeps optimizer state () where the servers keep "
                             "(momentum_buffer) for parameters [1, 4)"));
}

TEST_CASE("a buffer run adds its changes, an integer buffer's rounded, and keeps no state") {
  const DenseOptimizerOptions options = Sgd();
  // [0, 2) parameters (SGD with momentum), [2, 4) a float buffer, [4, 5) an int64 one.
  OptimizerSegment parameters{0, 2, -1, options};
  OptimizerSegment float_buffer{2, 4, -1, DenseOptimizerDefaults(DenseOptimizerType::kSgd)};
  float_buffer.kind = DenseTensorKind::kFloatBuffer;
  OptimizerSegment integer_buffer{4, 5, -1, DenseOptimizerDefaults(DenseOptimizerType::kSgd)};
  integer_buffer.kind = DenseTensorKind::kIntegerBuffer;
  std::unique_ptr<DenseUpdateRule> rule =
      MakeDenseUpdateRule(options, 5, {parameters, float_buffer, integer_buffer});
  std::vector<float> values = {1, 1, 0.5f, 2, 0};
  // A sync mean of the workers' +1 to num_batches_tracked (their sum times float(1/N))
  // may come out a rounding below 1.
  const float mean_of_ones = std::nextafter(1.0f, 0.0f);
  const std::vector<float> gradient = {1, 1, 0.25f, -1, mean_of_ones};
  // A script's settings over the whole range (a weight decay and a rate the buffers
  // would feel, were they trained) leave the buffers alone.
  StepHyperparameters settings = {{0, 5, 0, options}};
  settings[0].options.weight_decay = 0.5;
  settings[0].options.learning_rate = 0.2;
  REQUIRE(rule->PrepareFor(settings).ok());
  rule->Apply(1, gradient, absl::MakeSpan(values), settings);
  CHECK(values[0] == Approx(1 - 0.2 * (1 + 0.5)).epsilon(1e-6));
  CHECK(values[2] == 0.75f);
  CHECK(values[3] == 1.0f);
  CHECK(values[4] == 1.0f);  // rounded: not 0.99999994
  rule->Apply(2, gradient, absl::MakeSpan(values), {});
  CHECK(values[2] == 1.0f);
  CHECK(values[4] == 2.0f);
  ShardState state;
  state.range = {0, 5};
  rule->SaveState(&state);
  REQUIRE(state.slots.size() == 1);
  CHECK(state.slots[0][2] == 0);  // the buffers keep no momentum
  CHECK(state.slots[0][4] == 0);
  // A change that would take a buffer past float32's range is the first unsafe element.
  std::vector<float> huge = {0, 0, 0, 3e38f, 0};
  values[3] = 3e38f;
  CHECK(rule->FirstUnsafeElement(3, huge, values, {}) == 3);
}

}  // namespace
}  // namespace paramserver
