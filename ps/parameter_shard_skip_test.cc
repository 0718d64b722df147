// Steps a worker skips (ShardPush::skip: its loss scaler found the gradient not finite):
// in sync mode the whole step is skipped, whatever the others pushed, and the optimizer
// goes on as if it had not been (its update count unchanged); in async mode the push
// alone applies nothing. Replicas, replica states and snapshots agree.
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "ps/dense_shard_testing.h"
#include "ps/parameter_shard.h"
#include "ps/shard_testing.h"

namespace paramserver {
namespace {

using namespace dense_shard_testing;  // NOLINT: the shared helpers of these tests

absl::StatusOr<PushOutcome> Skip(ParameterShard& shard, int rank, int64_t step) {
  ShardPush push{rank, step, UninitializedFloats(), {}, {}, /*skip=*/true};
  return shard.Push(&push);
}

// Adam's second step, by hand: t = 2 with gradient g both times (m_hat = g, v_hat = g^2).
// Whether a step was skipped in between or not, the second update is this one.
float TwoAdamSteps(float p, float g) { return FirstAdamStep(FirstAdamStep(p, g), g); }

TEST_CASE("sync: one worker's skip skips the step on the shard; the next update is Adam's second") {
  ParameterShard shard(Options(TrainingMode::kSync, 2), kInitial);
  REQUIRE(shard.Push(0, 0, std::vector<float>{1, 1, 1}).ok());
  REQUIRE(shard.Push(1, 0, std::vector<float>{1, 1, 1}).ok());
  // Step 1: worker 1 overflowed; worker 0's gradient is dropped with it.
  REQUIRE(shard.Push(0, 1, std::vector<float>{50, 50, 50}).ok());
  absl::StatusOr<PushOutcome> skipped = Skip(shard, 1, 1);
  REQUIRE(skipped.ok());
  CHECK(skipped->applied_updates == 2);  // the step is done: pulls of step 2 proceed
  REQUIRE(skipped->log.size() == 1);
  CHECK(skipped->log[0].skipped);
  CHECK(skipped->log[0].step == 1);
  CHECK(skipped->log[0].gradient.empty());
  const std::vector<float> after_skip = PullValues(shard, 0, 2);
  CHECK(after_skip[0] == FirstAdamStep(1.0f, 1.0f));
  CHECK(shard.counters().skipped_steps == 1);
  // Step 2 is the optimizer's second update (bias corrections of t = 2).
  REQUIRE(shard.Push(0, 2, std::vector<float>{1, 1, 1}).ok());
  REQUIRE(shard.Push(1, 2, std::vector<float>{1, 1, 1}).ok());
  const std::vector<float> values = PullValues(shard, 1, 3);
  for (size_t i = 0; i < kInitial.size(); ++i) CHECK(values[i] == TwoAdamSteps(kInitial[i], 1.0f));
  // The snapshot says how many steps were skipped; a shard resumed from it goes on alike.
  ShardState snapshot = shard.Snapshot();
  CHECK(snapshot.step == 3);
  CHECK(snapshot.skipped_steps == 1);
  ParameterShard resumed(Options(TrainingMode::kSync, 2), snapshot);
  CHECK(resumed.Snapshot().skipped_steps == 1);
  for (ParameterShard* s : {&shard, &resumed}) {
    REQUIRE(s->Push(0, 3, std::vector<float>{2, 2, 2}).ok());
    REQUIRE(s->Push(1, 3, std::vector<float>{2, 2, 2}).ok());
  }
  CHECK(PullValues(resumed, 0, 4) == PullValues(shard, 0, 4));
}

TEST_CASE("sync: a backup replays a skipped step, and a replica made mid-step keeps a skip") {
  ParameterShard primary(Options(TrainingMode::kSync, 2), kInitial);
  ParameterShard backup(Options(TrainingMode::kSync, 2), kInitial);
  REQUIRE(Skip(primary, 0, 0).ok());
  absl::StatusOr<std::unique_ptr<ParameterShard>> replica =
      ParameterShard::FromReplica(Options(TrainingMode::kSync, 2), primary.ExportReplica());
  REQUIRE(replica.ok());
  absl::StatusOr<PushOutcome> completed = primary.Push(1, 0, std::vector<float>{1, 1, 1});
  REQUIRE(completed.ok());
  REQUIRE(completed->log.size() == 1);
  REQUIRE(backup.ApplyLogEntry(completed->log[0]).ok());
  // The replica holds worker 0's skip: worker 1's push completes the step there too.
  REQUIRE((*replica)->Push(1, 0, std::vector<float>{1, 1, 1}).ok());
  for (ParameterShard* s : {&primary, &backup, replica->get()}) {
    CHECK(s->counters().applied_updates == 1);
    CHECK(s->counters().skipped_steps == 1);
    CHECK(PullValues(*s, 0, 1) == kInitial);
  }
  ExpectSameState(primary, backup);
  ExpectSameState(primary, **replica);
}

TEST_CASE("async: a skipping push applies nothing but counts as the worker's step") {
  ParameterShard primary(Options(TrainingMode::kAsync, 1), kInitial);
  ParameterShard backup(Options(TrainingMode::kAsync, 1), kInitial);
  absl::StatusOr<PushOutcome> skipped = Skip(primary, 0, 0);
  REQUIRE(skipped.ok());
  CHECK(skipped->applied_updates == 0);
  REQUIRE(skipped->log.size() == 1);
  CHECK(skipped->log[0].skipped);
  REQUIRE(backup.ApplyLogEntry(skipped->log[0]).ok());
  CHECK(Skip(primary, 0, 0)->duplicate);  // a retry of it changes nothing
  absl::StatusOr<PushOutcome> next = primary.Push(0, 1, std::vector<float>{1, 1, 1});
  REQUIRE(next.ok());
  REQUIRE(backup.ApplyLogEntry(next->log[0]).ok());
  for (ParameterShard* s : {&primary, &backup}) {
    CHECK(PullValues(*s, 0, 2)[0] == FirstAdamStep(1.0f, 1.0f));
    CHECK(s->counters().skipped_steps == 1);
    CHECK(s->counters().applied_updates == 1);
  }
}

TEST_CASE("a skipping push that carries a gradient is refused, and the step stays open") {
  ParameterShard shard(Options(TrainingMode::kSync, 1), kInitial);
  std::vector<float> gradient = {1, 1, 1};
  ShardPush push{0, 0, UninitializedFloats(gradient.begin(), gradient.end()), {}, {}, true};
  absl::StatusOr<PushOutcome> refused = shard.Push(&push);
  REQUIRE(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(refused.status().message()),
             Catch::Contains("skips the step but carries 3 gradient values"));
  CHECK(shard.counters().applied_updates == 0);
  REQUIRE(shard.Push(0, 0, gradient).ok());
  CHECK(shard.counters().applied_updates == 1);
  CHECK(shard.counters().skipped_steps == 0);
}

}  // namespace
}  // namespace paramserver
