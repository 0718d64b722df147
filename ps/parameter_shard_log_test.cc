// A dense shard's active set, checkpoints, log and replicas, and a torch model's first values.
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

TEST_CASE("sync: declaring a worker dead completes the step with the live workers' mean") {
  ParameterShard shard(Options(TrainingMode::kSync, 3), kInitial);
  REQUIRE(shard.Push(0, 0, std::vector<float>{2, 2, 2}).ok());
  REQUIRE(shard.Push(2, 0, std::vector<float>{4, -6, 0}).ok());
  CHECK(shard.counters().applied_updates == 0);  // waiting for worker 1
  shard.SetActiveWorkers({true, false, true});
  CHECK(shard.counters().applied_updates == 1);
  std::vector<float> values = PullValues(shard, 0, 1);
  CHECK(values[0] == Approx(FirstAdamStep(1.0f, 3.0f)));   // mean of 2 and 4
  CHECK(values[1] == Approx(FirstAdamStep(2.0f, -2.0f)));  // mean of 2 and -6
  CHECK(shard.Push(1, 1, std::vector<float>{1, 1, 1}).status().code() ==
        absl::StatusCode::kFailedPrecondition);
  // The next steps need only workers 0 and 2; a worker that comes back counts again.
  REQUIRE(shard.Push(0, 1, std::vector<float>{1, 1, 1}).ok());
  REQUIRE(shard.Push(2, 1, std::vector<float>{1, 1, 1}).ok());
  CHECK(shard.counters().applied_updates == 2);
  shard.SetActiveWorkers({true, true, true});
  REQUIRE(shard.Push(0, 2, std::vector<float>{1, 1, 1}).ok());
  REQUIRE(shard.Push(2, 2, std::vector<float>{1, 1, 1}).ok());
  CHECK(shard.counters().applied_updates == 2);
  REQUIRE(shard.Push(1, 2, std::vector<float>{1, 1, 1}).ok());
  CHECK(shard.counters().applied_updates == 3);
}

TEST_CASE("ssp: the slowest-worker bound ignores dead workers") {
  ParameterShard shard(Options(TrainingMode::kSsp, 2, /*staleness=*/0), kInitial);
  REQUIRE(shard.Push(0, 0, std::vector<float>{1, 1, 1}).ok());
  CHECK(shard.Pull(0, 1, Soon()).status().code() == absl::StatusCode::kDeadlineExceeded);
  shard.SetActiveWorkers({true, false});
  CHECK(shard.Pull(0, 1, Soon()).ok());
}

TEST_CASE(
    "checkpoint snapshots come at multiples of the interval, and a shard resumes from one "
    "exactly") {
  ParameterShardOptions options = Options(TrainingMode::kAsync, 1);
  options.checkpoint_every_steps = 2;
  ParameterShard shard(options, kInitial);
  const std::vector<float> g = {0.3f, -0.1f, 0.2f};
  CHECK_FALSE(shard.Push(0, 0, g)->checkpoint.has_value());
  absl::StatusOr<PushOutcome> second = shard.Push(0, 1, g);
  REQUIRE(second->checkpoint.has_value());
  CHECK(second->checkpoint->step == 2);
  CHECK(second->checkpoint->values == PullValues(shard, 0, 0));
  // An on-demand checkpoint asked for twice is written once; one already passed is refused.
  CHECK(shard.ScheduleCheckpointAt(3));
  CHECK(shard.ScheduleCheckpointAt(3));
  CHECK_FALSE(shard.ScheduleCheckpointAt(2));
  ParameterShard resumed(options, *second->checkpoint);
  absl::StatusOr<PushOutcome> third = shard.Push(0, 2, g);
  REQUIRE(third.ok());
  CHECK(third->checkpoint.has_value());  // the scheduled step 3
  REQUIRE(resumed.Push(0, 2, g).ok());
  CHECK(PullValues(resumed, 0, 0) == PullValues(shard, 0, 0));  // bit-identical
  REQUIRE(shard.Push(0, 3, g)->checkpoint.has_value());         // 4 updates: periodic
  CHECK_FALSE(shard.Push(0, 4, g)->checkpoint.has_value());     // 5: neither periodic nor scheduled
  CHECK(resumed.counters().applied_updates == 3);
}

TEST_CASE("a hybrid job's table writes a scheduled checkpoint at its next update") {
  // Its count is pushes, not the job's step a checkpoint is scheduled at.
  ParameterShardOptions options = Options(TrainingMode::kAsync, 1);
  options.checkpoint_at_next_update = true;
  ParameterShard shard(options, kInitial);
  const std::vector<float> g = {0.3f, -0.1f, 0.2f};
  REQUIRE(shard.Push(0, 0, g).ok());
  REQUIRE(shard.Push(0, 1, g).ok());
  CHECK(shard.ScheduleCheckpointAt(1));  // a step its count passed: not refused
  absl::StatusOr<PushOutcome> next = shard.Push(0, 2, g);
  REQUIRE(next.ok());
  REQUIRE(next->checkpoint.has_value());
  CHECK(next->checkpoint->step == 3);
  CHECK_FALSE(shard.Push(0, 3, g)->checkpoint.has_value());
}

void Forward(const std::vector<ShardMutation>& log, ParameterShard& backup) {
  for (const ShardMutation& mutation : log) {
    absl::StatusOr<int64_t> applied = backup.ApplyLogEntry(mutation);
    REQUIRE(applied.ok());
    CHECK(*applied == mutation.index);
  }
}

TEST_CASE(
    "sync: the log has one entry per completed step, carrying the mean; a backup replays it "
    "exactly") {
  ParameterShard primary(Options(TrainingMode::kSync, 2), kInitial);
  ParameterShard backup(Options(TrainingMode::kSync, 2), kInitial);
  absl::StatusOr<PushOutcome> first = primary.Push(0, 0, std::vector<float>{1.0f, -4.0f, 0.5f});
  REQUIRE(first.ok());
  CHECK(first->log.empty());  // a step in progress is not an entry yet
  absl::StatusOr<PushOutcome> second = primary.Push(1, 0, std::vector<float>{3.0f, 2.0f, 0.25f});
  REQUIRE(second.ok());
  REQUIRE(second->log.size() == 1);
  const ShardMutation& step = second->log[0];
  CHECK(step.kind == ShardMutation::Kind::kSyncStep);
  CHECK(step.index == 1);
  CHECK(step.step == 0);
  CHECK(step.gradient == std::vector<float>{2.0f, -1.0f, 0.375f});  // the mean, by hand
  Forward(second->log, backup);
  ExpectSameState(primary, backup);

  // A repeat changes nothing; an entry beyond the next leaves a gap and is refused.
  CHECK(*backup.ApplyLogEntry(step) == 1);
  ShardMutation ahead = step;
  ahead.index = 3;
  CHECK(backup.ApplyLogEntry(ahead).status().code() == absl::StatusCode::kFailedPrecondition);
  ExpectSameState(primary, backup);
}

TEST_CASE(
    "async: a step far past the worker's next one is refused; a gap within the window is not") {
  ParameterShard shard(Options(TrainingMode::kAsync, 2), kInitial);
  const std::vector<float> gradient = {0.1f, 0.1f, 0.1f};
  for (int64_t step : {std::numeric_limits<int64_t>::max(), int64_t{1000000000000000},
                       ParameterShard::kMaxAsyncStepLead}) {
    INFO(step);
    absl::StatusOr<PushOutcome> refused = shard.Push(0, step, gradient);
    CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(refused.status().message(), "its next step is 0"));
  }
  CHECK(shard.counters().applied_updates == 0);
  // The next step, then a gap just inside the window (pushes lost to a restore).
  REQUIRE(shard.Push(0, 0, gradient).ok());
  REQUIRE(shard.Push(0, ParameterShard::kMaxAsyncStepLead, gradient).ok());
  CHECK(shard.counters().applied_updates == 2);
  // The worker is not silenced: its next step is accepted, an old one is a duplicate.
  CHECK_FALSE(shard.Push(0, ParameterShard::kMaxAsyncStepLead + 1, gradient)->duplicate);
  CHECK(shard.Push(0, 5, gradient)->duplicate);
}

TEST_CASE(
    "async: each push is one entry; a backup replaying the log in order matches bit for bit") {
  ParameterShard primary(Options(TrainingMode::kAsync, 2), kInitial);
  ParameterShard backup(Options(TrainingMode::kAsync, 2), kInitial);
  std::vector<ShardMutation> log;
  for (int step = 0; step < 5; ++step) {
    for (int worker = 0; worker < 2; ++worker) {
      absl::StatusOr<PushOutcome> pushed = primary.Push(
          worker, step, std::vector<float>{0.1f * step - worker, 1.0f / (step + 1), 0.5f * worker});
      REQUIRE(pushed.ok());
      REQUIRE(pushed->log.size() == 1);
      CHECK(pushed->log[0].kind == ShardMutation::Kind::kPush);
      log.push_back(pushed->log[0]);
    }
  }
  absl::StatusOr<PushOutcome> repeat = primary.Push(1, 4, std::vector<float>{9.0f, 9.0f, 9.0f});
  REQUIRE(repeat.ok());
  CHECK(repeat->duplicate);
  CHECK(repeat->log.empty());
  CHECK(repeat->log_index == 10);  // its original is at or before it
  Forward(log, backup);
  ExpectSameState(primary, backup);
  // The backup keeps the record of applied pushes: promoted, it refuses the repeat too.
  absl::StatusOr<PushOutcome> after_promotion =
      backup.Push(1, 4, std::vector<float>{9.0f, 9.0f, 9.0f});
  REQUIRE(after_promotion.ok());
  CHECK(after_promotion->duplicate);
}

TEST_CASE("a backup never completes a sync step by itself when the active set changes") {
  ParameterShard primary(Options(TrainingMode::kSync, 2), kInitial);
  REQUIRE(primary.Push(0, 0, std::vector<float>{1.0f, 1.0f, 1.0f}).ok());
  // A new backup copies the state with worker 0's push pending.
  absl::StatusOr<std::unique_ptr<ParameterShard>> backup =
      ParameterShard::FromReplica(Options(TrainingMode::kSync, 2), primary.ExportReplica());
  REQUIRE(backup.ok());
  // Worker 1 dies: the primary completes step 0 with worker 0 alone and logs both.
  ActiveWorkersOutcome changed = primary.SetActiveWorkers({true, false});
  REQUIRE(changed.log.size() == 2);
  CHECK(changed.log[0].kind == ShardMutation::Kind::kActiveWorkers);
  CHECK(changed.log[1].kind == ShardMutation::Kind::kSyncStep);
  REQUIRE((*backup)->ApplyLogEntry(changed.log[0]).ok());
  CHECK((*backup)->Snapshot().step == 0);  // waits for the primary's word
  REQUIRE((*backup)->ApplyLogEntry(changed.log[1]).ok());
  ExpectSameState(primary, **backup);
}

TEST_CASE(
    "a replica copied mid-step continues the primary's log exactly, and rejects a state that does "
    "not fit") {
  ParameterShard primary(Options(TrainingMode::kSync, 2), kInitial);
  REQUIRE(primary.Push(0, 0, std::vector<float>{1.0f, 2.0f, 3.0f}).ok());
  REQUIRE(primary.Push(1, 0, std::vector<float>{-1.0f, 0.5f, 1.0f}).ok());
  REQUIRE(primary.Push(1, 1, std::vector<float>{0.5f, 0.5f, 0.5f}).ok());
  const ReplicaState replica = primary.ExportReplica();
  CHECK(replica.log_index == 1);
  CHECK(replica.pending_received == std::vector<bool>{false, true});
  absl::StatusOr<std::unique_ptr<ParameterShard>> copy =
      ParameterShard::FromReplica(Options(TrainingMode::kSync, 2), replica);
  REQUIRE(copy.ok());
  ExpectSameState(primary, **copy);
  // Promoted, the copy completes step 1 with the pending push it copied, as the primary does.
  absl::StatusOr<PushOutcome> on_primary = primary.Push(0, 1, std::vector<float>{2.0f, 2.0f, 2.0f});
  absl::StatusOr<PushOutcome> on_copy = (*copy)->Push(0, 1, std::vector<float>{2.0f, 2.0f, 2.0f});
  REQUIRE(on_primary.ok());
  REQUIRE(on_copy.ok());
  ExpectSameState(primary, **copy);

  ReplicaState wrong_workers = replica;
  wrong_workers.active.push_back(true);
  CHECK(
      ParameterShard::FromReplica(Options(TrainingMode::kSync, 2), wrong_workers).status().code() ==
      absl::StatusCode::kInvalidArgument);
  ParameterShardOptions other_range = Options(TrainingMode::kSync, 2);
  other_range.range = {10, 14};
  CHECK(ParameterShard::FromReplica(other_range, replica).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE(
    "a torch model's shard waits for its initial values: pulls wait, pushes are refused, the "
    "first values stand, and backups get them through the log or a copy") {
  std::unique_ptr<ParameterShard> primary =
      ParameterShard::AwaitingInitialValues(Options(TrainingMode::kSync, 2));
  std::unique_ptr<ParameterShard> backup =
      ParameterShard::AwaitingInitialValues(Options(TrainingMode::kSync, 2));
  CHECK(primary->awaiting_initial_values());
  absl::StatusOr<PulledValues> early = primary->Pull(0, 0, Soon());
  REQUIRE(early.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(absl::StrContains(early.status().message(),
                          "shard 3 has no values yet: it waits for the worker that declared the "
                          "model to set them"));
  absl::StatusOr<PushOutcome> refused = primary->Push(0, 0, std::vector<float>{1, 1, 1});
  CHECK(refused.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(refused.status().message(), "has no values yet"));
  // A copy taken now (a new backup) is waiting too.
  absl::StatusOr<std::unique_ptr<ParameterShard>> early_copy =
      ParameterShard::FromReplica(Options(TrainingMode::kSync, 2), primary->ExportReplica());
  REQUIRE(early_copy.ok());
  CHECK((*early_copy)->awaiting_initial_values());

  CHECK(primary->SetInitialValues(std::vector<float>{1.0f, 2.0f}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(primary->SetInitialValues(std::vector<float>{1.0f, NAN, 2.0f}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  absl::StatusOr<PushOutcome> set = primary->SetInitialValues(kInitial);
  REQUIRE(set.ok());
  CHECK_FALSE(set->duplicate);
  REQUIRE(set->checkpoint.has_value());  // the step-0 state to write
  CHECK(set->checkpoint->values == kInitial);
  REQUIRE(set->log.size() == 1);
  CHECK(set->log[0].kind == ShardMutation::Kind::kInitialValues);
  absl::StatusOr<PushOutcome> again = primary->SetInitialValues(std::vector<float>{9, 9, 9});
  REQUIRE(again.ok());
  CHECK(again->duplicate);
  CHECK(PullValues(*primary, 1, 0) == kInitial);  // the first values stand

  // A backup applying the log, and the copy taken before, end up identical.
  REQUIRE(backup->ApplyLogEntry(set->log[0]).ok());
  REQUIRE((*early_copy)->ApplyLogEntry(set->log[0]).ok());
  ExpectSameState(*primary, *backup);
  ExpectSameState(*primary, **early_copy);
  CHECK_FALSE(backup->awaiting_initial_values());
  // Applied twice, the entry is a repeat; on a shard with values, a divergence.
  CHECK(backup->ApplyLogEntry(set->log[0]).ok());
  ShardMutation late = set->log[0];
  late.index = backup->log_index() + 1;
  CHECK(backup->ApplyLogEntry(late).status().code() == absl::StatusCode::kInternal);
  // Training goes on from the values set.
  REQUIRE(primary->Push(0, 0, std::vector<float>{2.0f, 0.0f, 0.0f}).ok());
  REQUIRE(primary->Push(1, 0, std::vector<float>{2.0f, 0.0f, 0.0f}).ok());
  CHECK(PullValues(*primary, 0, 1)[0] == Approx(FirstAdamStep(1.0f, 2.0f)));
}

TEST_CASE("sync: AwaitStepApplied returns once the step completes, or names the missing workers") {
  ParameterShard shard(Options(TrainingMode::kSync, 2), kInitial);
  REQUIRE(shard.Push(0, 0, std::vector<float>{1.0f, 1.0f, 1.0f}).ok());
  absl::StatusOr<int64_t> waited = shard.AwaitStepApplied(0, Soon());
  REQUIRE(waited.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::string(waited.status().message()).find("workers [1]") != std::string::npos);
  std::thread last([&shard] { (void)shard.Push(1, 0, std::vector<float>{1.0f, 1.0f, 1.0f}); });
  absl::StatusOr<int64_t> released = shard.AwaitStepApplied(0, absl::Now() + absl::Seconds(10));
  last.join();
  REQUIRE(released.ok());
  CHECK(*released == 1);
}

}  // namespace
}  // namespace paramserver
