// Clipped sync steps (ShardPush::clip_grad_norm): the shard holds the step once every
// push is in, tells its sum of squares, and applies it with the coefficient the workers
// bring; replicas, backups and repeats agree.
#include <cmath>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "ps/dense_shard_testing.h"
#include "ps/parameter_shard.h"
#include "ps/shard_replicator.h"
#include "ps/shard_testing.h"

namespace paramserver {
namespace {

using namespace dense_shard_testing;  // NOLINT: the shared helpers of these tests

ParameterShardOptions SgdOptions(int workers) {
  ParameterShardOptions options = Options(TrainingMode::kSync, workers);
  options.optimizer = DenseOptimizerDefaults(DenseOptimizerType::kSgd);
  options.optimizer.learning_rate = 0.5;
  return options;
}

absl::StatusOr<PushOutcome> PushClipped(ParameterShard& shard, int rank, int64_t step,
                                        std::vector<float> gradient, double clip) {
  ShardPush push{rank, step, UninitializedFloats(gradient.begin(), gradient.end()), {}, {}};
  push.clip_grad_norm = clip;
  return shard.Push(&push);
}

TEST_CASE("a clipped step is held until its coefficient comes, then applied scaled") {
  ParameterShard shard(SgdOptions(2), kInitial);
  REQUIRE(PushClipped(shard, 0, 0, {1, 2, 2}, 1.0).ok());
  // Not every push is in: the sum of squares is not known yet.
  CHECK(shard.AwaitStepSumSquares(0, Soon()).status().code() ==
        absl::StatusCode::kDeadlineExceeded);
  CHECK(shard.ApplyClippedStep(0, 0.5f).status().code() == absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<PushOutcome> last = PushClipped(shard, 1, 0, {3, 2, 2}, 1.0);
  REQUIRE(last.ok());
  CHECK(last->log.empty());  // held, not applied
  CHECK(shard.counters().applied_updates == 0);
  // mean (2, 2, 2): sum of squares 12, as every worker is told.
  absl::StatusOr<double> sum = shard.AwaitStepSumSquares(0, Soon());
  REQUIRE(sum.ok());
  CHECK(*sum == 12.0);
  // A pull of step 1 waits for the coefficient.
  CHECK(shard.Pull(0, 1, Soon()).status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(shard.ApplyClippedStep(0, 1.5f).status().code() == absl::StatusCode::kInvalidArgument);
  absl::StatusOr<PushOutcome> applied = shard.ApplyClippedStep(0, 0.25f);
  REQUIRE(applied.ok());
  REQUIRE(applied->log.size() == 1);
  CHECK(applied->log[0].clip_coefficient == 0.25f);
  CHECK(applied->log[0].step_sum_squares == 12.0);
  CHECK(applied->log[0].gradient == std::vector<float>{0.5f, 0.5f, 0.5f});
  // p - 0.5 * (0.25 * 2)
  CHECK(PullValues(shard, 1, 1) == std::vector<float>{0.75f, 1.75f, -3.25f});
  // The other worker's apply: the same coefficient is a repeat; another is refused.
  absl::StatusOr<PushOutcome> again = shard.ApplyClippedStep(0, 0.25f);
  REQUIRE(again.ok());
  CHECK(again->duplicate);
  CHECK_THAT(std::string(shard.ApplyClippedStep(0, 0.5f).status().message()),
             Catch::Contains("was clipped by 0.25, not 0.5"));
  // A repeated push of the step is told the same sum.
  REQUIRE(PushClipped(shard, 1, 0, {3, 2, 2}, 1.0)->duplicate);
  CHECK(*shard.AwaitStepSumSquares(0, Soon()) == 12.0);
  CHECK(shard.counters().applied_updates == 1);
}

TEST_CASE("workers that clip a sync step differently are refused by name") {
  ParameterShard shard(SgdOptions(2), kInitial);
  REQUIRE(PushClipped(shard, 0, 0, {1, 1, 1}, 1.0).ok());
  absl::StatusOr<PushOutcome> other = PushClipped(shard, 1, 0, {1, 1, 1}, 2.0);
  REQUIRE(other.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(other.status().message()),
             Catch::Contains("sync step 0: workers 0 and 1 pushed it with different "
                             "clip_grad_norm (1 and 2)"));
  CHECK_THAT(std::string(PushClipped(shard, 1, 0, {1, 1, 1}, 0).status().message()),
             Catch::Contains("different clip_grad_norm (1 and 0)"));
  ParameterShard async(Options(TrainingMode::kAsync, 1), kInitial);
  CHECK_THAT(std::string(PushClipped(async, 0, 0, {1, 1, 1}, 1.0).status().message()),
             Catch::Contains("only a sync job's dense shards hold a step for that"));
  CHECK_THAT(std::string(PushClipped(async, 0, 0, {1, 1, 1}, -1).status().message()),
             Catch::Contains("clips to a norm of -1: it must be finite and > 0"));
}

TEST_CASE("a held step survives a replica copy; backups replay its scaled mean") {
  ParameterShard primary(SgdOptions(2), kInitial);
  ParameterShard backup(SgdOptions(2), kInitial);
  REQUIRE(PushClipped(primary, 0, 0, {1, 2, 2}, 1.0).ok());
  REQUIRE(PushClipped(primary, 1, 0, {3, 2, 2}, 1.0).ok());
  absl::StatusOr<std::unique_ptr<ParameterShard>> copy =
      ParameterShard::FromReplica(SgdOptions(2), primary.ExportReplica());
  REQUIRE(copy.ok());
  // The copy (a promoted backup) holds the step as its primary did.
  CHECK(*(*copy)->AwaitStepSumSquares(0, Soon()) == 12.0);
  REQUIRE((*copy)->ApplyClippedStep(0, 0.25f).ok());
  absl::StatusOr<PushOutcome> applied = primary.ApplyClippedStep(0, 0.25f);
  REQUIRE(applied.ok());
  REQUIRE(backup.ApplyLogEntry(applied->log[0]).ok());
  ExpectSameState(primary, backup);
  ExpectSameState(primary, **copy);
  // The backup, promoted, tells a repeated push the sum the primary told.
  REQUIRE(PushClipped(backup, 0, 0, {1, 2, 2}, 1.0)->duplicate);
  CHECK(*backup.AwaitStepSumSquares(0, Soon()) == 12.0);
  CHECK(backup.ApplyClippedStep(0, 0.25f)->duplicate);
}

TEST_CASE("a clipped step a worker skips is skipped, and its pushes are told a sum of 0") {
  ParameterShard shard(SgdOptions(2), kInitial);
  REQUIRE(PushClipped(shard, 0, 0, {1, 2, 2}, 1.0).ok());
  ShardPush skip{1, 0, UninitializedFloats(), {}, {}, /*skip=*/true};
  REQUIRE(shard.Push(&skip).ok());
  CHECK(*shard.AwaitStepSumSquares(0, Soon()) == 0.0);
  CHECK(shard.ApplyClippedStep(0, 1.0f)->duplicate);
  CHECK(PullValues(shard, 0, 1) == kInitial);
  CHECK(shard.counters().skipped_steps == 1);
}

TEST_CASE("a held step travels in the replica state as it was told, whoever leaves after") {
  ParameterShard primary(SgdOptions(2), kInitial);
  REQUIRE(PushClipped(primary, 0, 0, {1, 2, 2}, 1.0).ok());
  REQUIRE(PushClipped(primary, 1, 0, {3, 2, 2}, 1.0).ok());
  primary.SetActiveWorkers({true, false});  // worker 1 declared dead after the hold
  const ParameterShardOptions options = SgdOptions(2);
  absl::StatusOr<ReplicaState> state =
      ReplicaStateFromProto(ReplicaStateToProto(primary.ExportReplica()),
                            {options.range, options.num_workers, nullptr, &options.optimizer});
  REQUIRE(state.ok());
  CHECK(state->held);
  absl::StatusOr<std::unique_ptr<ParameterShard>> copy =
      ParameterShard::FromReplica(options, *std::move(state));
  REQUIRE(copy.ok());
  CHECK(*(*copy)->AwaitStepSumSquares(0, Soon()) == 12.0);
  REQUIRE((*copy)->ApplyClippedStep(0, 0.25f).ok());
  REQUIRE(primary.ApplyClippedStep(0, 0.25f).ok());
  CHECK(PullValues(**copy, 0, 1) == PullValues(primary, 0, 1));
}

}  // namespace
}  // namespace paramserver
