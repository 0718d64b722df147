// A dense shard's log kept or not, and the gradients it refuses for their values.
#include <cmath>
#include <limits>
#include <thread>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "ps/dense_shard_testing.h"
#include "ps/parameter_shard.h"
#include "ps/shard_testing.h"

namespace paramserver {
namespace {

using namespace dense_shard_testing;  // NOLINT: the shared helpers of these tests

TEST_CASE("without a log sink or hand_back_log, entries are numbered but not kept") {
  ParameterShardOptions options = Options(TrainingMode::kAsync, 1);
  options.hand_back_log = false;
  ParameterShard shard(options, kInitial);
  absl::StatusOr<PushOutcome> pushed = shard.Push(0, 0, std::vector<float>{1.0f, 1.0f, 1.0f});
  REQUIRE(pushed.ok());
  CHECK(pushed->log.empty());
  CHECK(pushed->log_index == 1);
  CHECK(pushed->applied_updates == 1);
}

bool Contains(const absl::Status& status, const std::string& text) {
  return absl::StrContains(status.message(), text);
}

TEST_CASE("a gradient whose square overflows float32 is refused naming the element") {
  auto refusals = std::make_shared<GradientRefusalCounts>();
  ParameterShardOptions options = Options(TrainingMode::kAsync, 1);
  options.refusals = refusals;
  ParameterShard shard(options, kInitial);
  const absl::Status huge = shard.Push(0, 0, std::vector<float>{1, 1e20f, 1}).status();
  CHECK(huge.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(huge, "shard 3: gradient[1] of worker 0 for step 0 is 1e+20"));
  CHECK(Contains(huge, "out of float32's range"));
  // 3.5e19^2 = 1.225e39 > FLT_MAX = 3.4028e38: refused too, nothing applied.
  const absl::Status just_over = shard.Push(0, 0, std::vector<float>{1, 1, -3.5e19f}).status();
  CHECK(just_over.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(just_over, "shard 3: gradient[2] of worker 0 for step 0 is -3.5e+19"));
  CHECK(shard.counters().applied_updates == 0);
  CHECK(shard.log_index() == 0);
  CHECK(PullValues(shard, 0, 0) == kInitial);
  CHECK(shard.counters().rejected_overflow == 2);
  CHECK(shard.counters().rejected_pushes == 2);
  CHECK(refusals->count(GradientRefusal::kOverflow) == 2);
  CHECK(refusals->count(GradientRefusal::kNonFinite) == 0);
  // 1.8e19^2 = 3.24e38 fits: accepted as step 0, the state finite, each parameter moved
  // by lr = 0.01 against its gradient's sign (Adam's first step).
  absl::StatusOr<PushOutcome> fits = shard.Push(0, 0, std::vector<float>{1.8e19f, 0, -1.8e19f});
  REQUIRE(fits.ok());
  CHECK_FALSE(fits->duplicate);
  const ShardState state = shard.Snapshot();
  for (const std::vector<float>* floats : {&state.values, &state.slots[0], &state.slots[1]})
    for (float x : *floats) CHECK(std::isfinite(x));
  CHECK(state.values[0] == Approx(0.99f));
  CHECK(state.values[1] == 2.0f);
  CHECK(state.values[2] == Approx(-2.99f));
  CHECK(state.slots[1][0] == Approx(3.24e35));  // (1 - 0.999) * 1.8e19^2
  // A NaN is counted as non-finite, not as overflow.
  CHECK_FALSE(shard.Push(0, 1, std::vector<float>{std::nanf(""), 0, 0}).ok());
  CHECK(refusals->count(GradientRefusal::kNonFinite) == 1);
  CHECK(refusals->total() == 3);
}

TEST_CASE("training.max_gradient_norm bounds each push's L2 norm on the shard") {
  auto refusals = std::make_shared<GradientRefusalCounts>();
  ParameterShardOptions options = Options(TrainingMode::kAsync, 1);
  options.max_gradient_norm = 5.0;
  options.refusals = refusals;
  ParameterShard shard(options, kInitial);
  // |(3, 4.001, 0)| = sqrt(9 + 16.008) = 5.0008 > 5: refused, naming the shard, the norm and the
  // bound.
  const absl::Status over = shard.Push(0, 0, std::vector<float>{3, 4.001f, 0}).status();
  CHECK(over.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(over, "shard 3: the gradient of worker 0 for step 0 has an L2 norm of 5.0008"));
  CHECK(Contains(over, "above training.max_gradient_norm 5"));
  CHECK(shard.counters().applied_updates == 0);
  CHECK(shard.counters().rejected_norm == 1);
  CHECK(refusals->count(GradientRefusal::kNorm) == 1);
  // |(3, 3.999, 0)| = sqrt(9 + 15.992) = 4.9992: accepted and applied.
  absl::StatusOr<PushOutcome> under = shard.Push(0, 0, std::vector<float>{3, 3.999f, 0});
  REQUIRE(under.ok());
  CHECK(under->applied_updates == 1);
  CHECK(PullValues(shard, 0, 1)[0] == Approx(FirstAdamStep(1.0f, 3.0f)));
  CHECK(refusals->total() == 1);
}

TEST_CASE("sync: after a refused push the same rank's valid push takes its place in the step") {
  auto refusals = std::make_shared<GradientRefusalCounts>();
  ParameterShardOptions options = Options(TrainingMode::kSync, 2);
  options.refusals = refusals;
  ParameterShard shard(options, kInitial);
  ParameterShard undisturbed(Options(TrainingMode::kSync, 2), kInitial);
  const std::vector<float> g0 = {1.0f, -4.0f, 0.0f}, g1 = {3.0f, 2.0f, 0.0f};
  const absl::Status refused = shard.Push(0, 0, std::vector<float>{1.0f, 1e20f, 0.0f}).status();
  REQUIRE(refused.code() == absl::StatusCode::kInvalidArgument);
  CHECK(Contains(refused, "gradient[1] of worker 0 for step 0 is 1e+20"));
  // Not seen: the step still waits for rank 0, and rank 0's push is new, not a repeat.
  absl::StatusOr<PulledValues> waiting = shard.Pull(1, 1, Soon());
  REQUIRE(waiting.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(Contains(waiting.status(), "workers [0, 1]"));
  absl::StatusOr<PushOutcome> valid = shard.Push(0, 0, g0);
  REQUIRE(valid.ok());
  CHECK_FALSE(valid->duplicate);
  CHECK(shard.counters().duplicate_pushes == 0);
  CHECK(shard.counters().accepted_pushes == 1);
  absl::StatusOr<PushOutcome> last = shard.Push(1, 0, g1);
  REQUIRE(last.ok());
  CHECK(last->applied_updates == 1);
  REQUIRE(undisturbed.Push(0, 0, g0).ok());
  REQUIRE(undisturbed.Push(1, 0, g1).ok());
  const std::vector<float> after = PullValues(shard, 0, 1);
  // The mean {2, -1, 0}, one Adam step: p - lr * g / (|g| + eps), lr 0.01.
  CHECK(after[0] == Approx(0.99f).epsilon(1e-6));
  CHECK(after[1] == Approx(2.01f).epsilon(1e-6));
  CHECK(after[2] == -3.0f);
  CHECK(after == PullValues(undisturbed, 0, 1));  // bit-identical to the undisturbed step
  ExpectSameState(shard, undisturbed);
  CHECK(refusals->count(GradientRefusal::kOverflow) == 1);
}

TEST_CASE("a backup applying a logged push uses the primary's overflow rule") {
  // Async: a backup applies each logged push through the same checks as its primary.
  ParameterShard backup(Options(TrainingMode::kAsync, 1), kInitial);
  ShardMutation entry;
  entry.index = 1;
  entry.kind = ShardMutation::Kind::kPush;
  entry.worker_rank = 0;
  entry.step = 0;
  entry.gradient = {1.0f, 3.5e19f, 1.0f};
  const absl::Status refused = backup.ApplyLogEntry(entry).status();
  CHECK(refused.code() == absl::StatusCode::kInternal);  // the primary never logs one
  CHECK(Contains(refused, "gradient[1] of worker 0 for step 0 is 3.5e+19"));
  CHECK(backup.log_index() == 0);
  CHECK(backup.Snapshot().values == kInitial);
  // A replica that refused its primary's entry is no copy of it: it takes no more.
  ShardMutation next = entry;
  next.gradient = {1.0f, 1.0f, 1.0f};
  CHECK(backup.ApplyLogEntry(next).status().code() == absl::StatusCode::kInternal);
  // Below the bound, the same entry applies.
  ParameterShard healthy(Options(TrainingMode::kAsync, 1), kInitial);
  entry.gradient = {1.0f, 1.8e19f, 1.0f};
  REQUIRE(healthy.ApplyLogEntry(entry).ok());
  CHECK(healthy.log_index() == 1);
}

}  // namespace
}  // namespace paramserver
