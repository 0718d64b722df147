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

TEST_CASE("a buffer's change is neither clipped nor counted in the step's norm") {
  ParameterShardOptions options = SgdOptions(2);
  // Element 0 and 1 are parameters; element 2 is a buffer (a running mean).
  OptimizerSegment parameters{0, 2, -1, options.optimizer};
  OptimizerSegment buffer{2, 3, -1, DenseOptimizerDefaults(DenseOptimizerType::kSgd)};
  buffer.kind = DenseTensorKind::kFloatBuffer;
  options.optimizer_segments = {parameters, buffer};
  options.max_gradient_norm = 4;  // the buffer's change of 10 alone would pass it
  ParameterShard shard(options, kInitial);
  REQUIRE(PushClipped(shard, 0, 0, {1, 2, 10}, 1.0).ok());
  REQUIRE(PushClipped(shard, 1, 0, {3, 2, 12}, 1.0).ok());
  // mean (2, 2, 11): the parameters' sum of squares is 8.
  absl::StatusOr<double> sum = shard.AwaitStepSumSquares(0, Soon());
  REQUIRE(sum.ok());
  CHECK(*sum == 8.0);
  absl::StatusOr<PushOutcome> applied = shard.ApplyClippedStep(0, 0.25f);
  REQUIRE(applied.ok());
  CHECK(applied->log[0].gradient == std::vector<float>{0.5f, 0.5f, 11});
  // Parameters: p - 0.5 * (0.25 * 2); the buffer: its value plus the mean change.
  const std::vector<float> pulled = PullValues(shard, 1, 1);
  CHECK(pulled[0] == 0.75f);
  CHECK(pulled[1] == 1.75f);
  CHECK(pulled[2] == kInitial[2] + 11);
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

// Both workers push `step` with `gradients[rank]`, clipped to 1, and it is applied with
// `coefficient`; the log entries go to *log.
void ClippedStepOf(ParameterShard& shard, int64_t step,
                   const std::vector<std::vector<float>>& gradients, float coefficient,
                   std::vector<ShardMutation>* log = nullptr) {
  for (int rank = 0; rank < static_cast<int>(gradients.size()); ++rank)
    REQUIRE(PushClipped(shard, rank, step, gradients[rank], 1.0).ok());
  REQUIRE(shard.AwaitStepSumSquares(step, Soon()).ok());
  absl::StatusOr<PushOutcome> applied = shard.ApplyClippedStep(step, coefficient);
  REQUIRE(applied.ok());
  if (log != nullptr) log->insert(log->end(), applied->log.begin(), applied->log.end());
}

// What a worker re-sending step 1 after a failover is told, by a shard two steps on.
void ExpectRememberedSteps(ParameterShard& shard) {
  CHECK(*shard.AwaitStepSumSquares(1, Soon()) == 9.0);
  CHECK(*shard.AwaitStepSumSquares(0, Soon()) == 12.0);
  CHECK(*shard.AwaitStepSumSquares(2, Soon()) == 0.0);  // skipped
  CHECK_THAT(std::string(shard.ApplyClippedStep(1, 1.0f).status().message()),
             Catch::Contains("step 1 was clipped by 0.5, not 1"));
  CHECK(shard.ApplyClippedStep(1, 0.5f)->duplicate);
  CHECK(shard.ApplyClippedStep(2, 1.0f)->duplicate);
}

// fault_tolerance_test's kill -9 found this: worker 0 applied step S on the shards still
// up, worker 1's push of step S + 1 failed on the dead server, and worker 1, re-sending
// its last step (S) to every shard, was told 0 by the shards already past it (they
// remembered only their last clipped step): its norm came out too small, its
// coefficient 1, and the promoted backup, which had applied S by 0.905, refused it.
TEST_CASE("a step re-sent once shards moved past it is told its own sum, on every copy") {
  ParameterShard shard(SgdOptions(2), kInitial);
  std::vector<ShardMutation> log;
  ClippedStepOf(shard, 0, {{1, 2, 2}, {3, 2, 2}}, 0.25f, &log);  // sum 12
  ClippedStepOf(shard, 1, {{0, 0, 4}, {0, 0, 2}}, 0.5f, &log);   // sum 9
  REQUIRE(PushClipped(shard, 0, 2, {1, 1, 1}, 1.0).ok());
  ShardPush skip{1, 2, UninitializedFloats(), {}, {}, /*skip=*/true};
  absl::StatusOr<PushOutcome> skipped = shard.Push(&skip);  // step 2: skipped
  REQUIRE(skipped.ok());
  log.insert(log.end(), skipped->log.begin(), skipped->log.end());
  REQUIRE(PushClipped(shard, 0, 3, {2, 0, 0}, 1.0).ok());  // step 3 being collected
  REQUIRE(PushClipped(shard, 1, 1, {0, 0, 2}, 1.0)->duplicate);
  ExpectRememberedSteps(shard);
  // A backup that replayed the log, and a new replica copied over the wire.
  ParameterShard backup(SgdOptions(2), kInitial);
  for (const ShardMutation& entry : log) REQUIRE(backup.ApplyLogEntry(entry).ok());
  ExpectRememberedSteps(backup);
  const ParameterShardOptions options = SgdOptions(2);
  absl::StatusOr<ReplicaState> state =
      ReplicaStateFromProto(ReplicaStateToProto(shard.ExportReplica()),
                            {options.range, options.num_workers, nullptr, &options.optimizer});
  REQUIRE(state.ok());
  absl::StatusOr<std::unique_ptr<ParameterShard>> copy =
      ParameterShard::FromReplica(options, *std::move(state));
  REQUIRE(copy.ok());
  ExpectRememberedSteps(**copy);
}

TEST_CASE("a step older than the remembered ones, or before a restore, is refused, not 0") {
  ParameterShard shard(SgdOptions(2), kInitial);
  for (int64_t step = 0; step <= kRememberedSyncSteps; ++step)
    ClippedStepOf(shard, step, {{1, 0, 0}, {1, 0, 0}}, 1.0f);
  const absl::StatusOr<double> forgotten = shard.AwaitStepSumSquares(0, Soon());
  CHECK(forgotten.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(forgotten.status().message()),
             Catch::Contains("step 0 was applied here before the 4 steps it remembers"));
  CHECK(*shard.AwaitStepSumSquares(1, Soon()) == 1.0);
  ParameterShard restored(SgdOptions(2), shard.Snapshot());
  CHECK(restored.AwaitStepSumSquares(kRememberedSyncSteps, Soon()).status().code() ==
        absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("a replica state's remembered steps are checked before they are trusted") {
  ParameterShard shard(SgdOptions(2), kInitial);
  ClippedStepOf(shard, 0, {{1, 2, 2}, {3, 2, 2}}, 0.25f);
  ClippedStepOf(shard, 1, {{0, 0, 4}, {0, 0, 2}}, 0.5f);
  const ParameterShardOptions options = SgdOptions(2);
  const ReplicaExpectation expected{options.range, options.num_workers, nullptr,
                                    &options.optimizer};
  const auto refused = [&](const std::function<void(ShardReplicaState&)>& spoil) {
    ShardReplicaState proto = ReplicaStateToProto(shard.ExportReplica());
    REQUIRE(proto.recent_steps_size() == 2);
    spoil(proto);
    absl::StatusOr<ReplicaState> state = ReplicaStateFromProto(proto, expected);
    CHECK_THAT(std::string(state.status().message()),
               Catch::Contains("recent clipped steps out of range"));
  };
  refused([](ShardReplicaState& p) { p.mutable_recent_steps(1)->set_step(0); });  // order
  refused([](ShardReplicaState& p) { p.mutable_recent_steps(1)->set_step(2); });  // not applied
  refused([](ShardReplicaState& p) { p.mutable_recent_steps(0)->set_coefficient(1.5f); });
  refused([](ShardReplicaState& p) { p.mutable_recent_steps(0)->set_sum_squares(-1); });
  refused([](ShardReplicaState& p) {
    p.mutable_recent_steps(0)->set_coefficient(0);  // skipped, with a sum
  });
  refused([](ShardReplicaState& p) {
    for (int i = 0; i < kRememberedSyncSteps; ++i) *p.add_recent_steps() = p.recent_steps(0);
  });
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
