// A dense shard updated with a script's settings for each step (a push's
// StepHyperparameters): applied as sent, carried by the log and the replica, and in sync
// mode refused when two workers' differ.
#include <string>
#include <vector>

#include "catch2/catch.hpp"
#include "ps/dense_shard_testing.h"
#include "ps/parameter_shard.h"
#include "ps/shard_testing.h"

namespace paramserver {
namespace {

using namespace dense_shard_testing;  // NOLINT: the shared helpers of these tests

ParameterShardOptions SgdOptions(TrainingMode mode, int workers) {
  ParameterShardOptions options = Options(mode, workers);
  options.optimizer = DenseOptimizerDefaults(DenseOptimizerType::kSgd);
  options.optimizer.learning_rate = 0.01;
  return options;
}

// The whole 3-parameter range in group 0 at rate `lr`.
StepHyperparameters AtRate(double lr) {
  OptimizerSegment run;
  run.begin = 0;
  run.end = 3;
  run.group = 0;
  run.options = DenseOptimizerDefaults(DenseOptimizerType::kSgd);
  run.options.learning_rate = lr;
  return {run};
}

absl::StatusOr<PushOutcome> PushWith(ParameterShard& shard, int rank, int64_t step,
                                     std::vector<float> gradient, StepHyperparameters settings) {
  ShardPush push{
      rank, step, UninitializedFloats(gradient.begin(), gradient.end()), {}, std::move(settings)};
  return shard.Push(&push);
}

TEST_CASE("async: each push updates with the rate it carries, and its log entry carries it") {
  ParameterShard primary(SgdOptions(TrainingMode::kAsync, 1), kInitial);
  ParameterShard backup(SgdOptions(TrainingMode::kAsync, 1), kInitial);
  absl::StatusOr<PushOutcome> first = PushWith(primary, 0, 0, {1, 1, 1}, AtRate(0.5));
  REQUIRE(first.ok());
  absl::StatusOr<PushOutcome> second = PushWith(primary, 0, 1, {1, 2, 4}, AtRate(0.25));
  REQUIRE(second.ok());
  // p - 0.5 * 1 - 0.25 * g
  CHECK(PullValues(primary, 0, 2) == std::vector<float>{0.25f, 1.0f, -4.5f});
  // Without settings the spec's rate applies again.
  REQUIRE(primary.Push(0, 2, std::vector<float>{100, 0, 0}).ok());
  CHECK(PullValues(primary, 0, 3)[0] == -0.75f);
  for (const absl::StatusOr<PushOutcome>* outcome : {&first, &second}) {
    REQUIRE((*outcome)->log.size() == 1);
    CHECK(!(*outcome)->log[0].settings.empty());
    REQUIRE(backup.ApplyLogEntry((*outcome)->log[0]).ok());
  }
  CHECK(PullValues(backup, 0, 2) == std::vector<float>{0.25f, 1.0f, -4.5f});
}

TEST_CASE("sync: two workers' different settings for a step are refused, and neither applies") {
  ParameterShard shard(SgdOptions(TrainingMode::kSync, 2), kInitial);
  REQUIRE(PushWith(shard, 0, 0, {1, 1, 1}, AtRate(0.1)).ok());
  absl::StatusOr<PushOutcome> differing = PushWith(shard, 1, 0, {1, 1, 1}, AtRate(0.2));
  REQUIRE(differing.status().code() == absl::StatusCode::kInvalidArgument);
  const std::string message(differing.status().message());
  CHECK_THAT(message, Catch::Contains("sync step 0: workers 0 and 1") &&
                          Catch::Contains("group 0's lr: 0.1 and 0.2"));
  // The first worker's wait for the step ends with the same error, not a timeout.
  absl::StatusOr<PulledValues> waiting = shard.Pull(0, 1, absl::Now() + absl::Seconds(30));
  REQUIRE(waiting.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(waiting.status().message()) == message);
  CHECK(shard.counters().applied_updates == 0);
  CHECK(PullValues(shard, 0, 0) == kInitial);

  // A worker that pushes the step again with the agreed settings completes it.
  REQUIRE(PushWith(shard, 1, 0, {3, 3, 3}, AtRate(0.1)).ok());
  // mean gradient 2: p - 0.1 * 2
  const std::vector<float> after = PullValues(shard, 0, 1);
  CHECK(after[0] == Approx(0.8).epsilon(1e-6));
  CHECK(after[2] == Approx(-3.2).epsilon(1e-6));
  // The next step starts fresh: other settings than the last step's are fine.
  REQUIRE(PushWith(shard, 0, 1, {1, 1, 1}, AtRate(0.3)).ok());
  REQUIRE(PushWith(shard, 1, 1, {1, 1, 1}, AtRate(0.3)).ok());
  CHECK(PullValues(shard, 1, 2)[0] == Approx(0.5).epsilon(1e-6));
}

TEST_CASE("sync: a push with settings and one without are told apart") {
  ParameterShard shard(SgdOptions(TrainingMode::kSync, 2), kInitial);
  REQUIRE(shard.Push(0, 0, std::vector<float>{1, 1, 1}).ok());
  absl::StatusOr<PushOutcome> with = PushWith(shard, 1, 0, {1, 1, 1}, AtRate(0.01));
  REQUIRE(with.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(with.status().message()),
             Catch::Contains("the first push trains with the spec's settings"));
}

TEST_CASE("settings that would keep other state than the servers' are refused") {
  ParameterShardOptions options = SgdOptions(TrainingMode::kAsync, 1);
  options.optimizer.momentum = 0.9;  // the servers keep a momentum buffer
  ParameterShard shard(options, kInitial);
  absl::StatusOr<PushOutcome> refused = PushWith(shard, 0, 0, {1, 1, 1}, AtRate(0.1));
  REQUIRE(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(refused.status().message()),
             Catch::Contains("shard 3: worker 0's push for step 0: param_groups[0] keeps "
                             "optimizer state () where the servers keep (momentum_buffer)"));
  CHECK(shard.counters().rejected_pushes == 1);
  CHECK(PullValues(shard, 0, 0) == kInitial);
}

TEST_CASE(
    "sync: a replica made mid-step keeps the step's settings and the log's sync step "
    "carries them") {
  ParameterShard primary(SgdOptions(TrainingMode::kSync, 2), kInitial);
  REQUIRE(PushWith(primary, 0, 0, {1, 1, 1}, AtRate(0.1)).ok());
  absl::StatusOr<std::unique_ptr<ParameterShard>> replica =
      ParameterShard::FromReplica(SgdOptions(TrainingMode::kSync, 2), primary.ExportReplica());
  REQUIRE(replica.ok());
  // The replica, promoted, refuses a differing push as its primary would.
  CHECK(PushWith(**replica, 1, 0, {1, 1, 1}, AtRate(0.2)).status().code() ==
        absl::StatusCode::kInvalidArgument);
  REQUIRE(PushWith(**replica, 1, 0, {1, 1, 1}, AtRate(0.1)).ok());
  absl::StatusOr<PushOutcome> completed = PushWith(primary, 1, 0, {1, 1, 1}, AtRate(0.1));
  REQUIRE(completed.ok());
  REQUIRE(completed->log.size() == 1);
  CHECK(completed->log[0].settings.size() == 1);
  ExpectSameState(primary, **replica);
  CHECK(PullValues(primary, 0, 1)[0] == Approx(0.9).epsilon(1e-6));
}

}  // namespace
}  // namespace paramserver
