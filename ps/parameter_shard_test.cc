#include "ps/parameter_shard.h"

#include <cmath>
#include <limits>
#include <thread>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "ps/shard_testing.h"

namespace paramserver {
namespace {

// Returns once a pull is inside the shard's wait (CHECKs it within 30 s), so that what
// the test does next happens to a waiting pull, not before it started.
void AwaitOneWaitingPull(const ParameterShard& shard) {
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (shard.waiting_pulls() == 0 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
  CHECK(shard.waiting_pulls() == 1);
}

ParameterShardOptions Options(TrainingMode mode, int workers, int staleness = 0) {
  ParameterShardOptions options;
  options.hand_back_log = true;  // the log tests read each call's entries
  options.shard_id = 3;
  options.range = {10, 13};
  options.mode = mode;
  options.num_workers = workers;
  options.staleness = staleness;
  options.adam.learning_rate = 0.01;
  options.adam.epsilon = 1e-8;
  return options;
}

const std::vector<float> kInitial = {1.0f, 2.0f, -3.0f};

absl::Time Soon() { return absl::Now() + absl::Milliseconds(50); }

std::vector<float> PullValues(ParameterShard& shard, int worker, int64_t step) {
  absl::StatusOr<PulledValues> pulled = shard.Pull(worker, step, Soon());
  REQUIRE(pulled.ok());
  return pulled->values;
}

// Adam's first step moves p by -lr * g / (|g| + eps): derived by hand from the formula
// (m_hat = g, v_hat = g^2 at t = 1).
float FirstAdamStep(float p, float g, double lr = 0.01, double eps = 1e-8) {
  return static_cast<float>(p - lr * g / (std::fabs(g) + eps));
}

TEST_CASE("sync: a step applies once every worker pushed, with the mean gradient") {
  ParameterShard shard(Options(TrainingMode::kSync, 2), kInitial);
  REQUIRE(shard.Push(0, 0, std::vector<float>{1.0f, -4.0f, 0.0f}).ok());
  CHECK(PullValues(shard, 0, 0) == kInitial);  // step 0 needs no update

  absl::StatusOr<PulledValues> early = shard.Pull(0, 1, Soon());
  REQUIRE(early.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::string(early.status().message()).find("workers [1]") != std::string::npos);

  absl::StatusOr<PushOutcome> second = shard.Push(1, 0, std::vector<float>{3.0f, 2.0f, 0.0f});
  REQUIRE(second.ok());
  CHECK(second->applied_updates == 1);
  std::vector<float> after = PullValues(shard, 1, 1);
  // mean gradient = {2, -1, 0}
  CHECK(after[0] == Approx(FirstAdamStep(1.0f, 2.0f)));
  CHECK(after[1] == Approx(FirstAdamStep(2.0f, -1.0f)));
  CHECK(after[2] == -3.0f);
}

TEST_CASE("sync: a pull waiting for the step is released by the last push") {
  ParameterShard shard(Options(TrainingMode::kSync, 2), kInitial);
  REQUIRE(shard.Push(0, 0, std::vector<float>{1, 1, 1}).ok());
  absl::StatusOr<PulledValues> pulled;
  std::thread waiter([&] { pulled = shard.Pull(0, 1, absl::Now() + absl::Seconds(10)); });
  AwaitOneWaitingPull(shard);
  REQUIRE(shard.Push(1, 0, std::vector<float>{1, 1, 1}).ok());
  waiter.join();
  REQUIRE(pulled.ok());
  CHECK(pulled->applied_updates == 1);
  CHECK(pulled->values[0] == Approx(FirstAdamStep(1.0f, 1.0f)));
}

TEST_CASE("sync: a repeated push is acknowledged once and applied once") {
  ParameterShard shard(Options(TrainingMode::kSync, 2), kInitial);
  const std::vector<float> g0 = {1, 2, 3}, g1 = {3, 2, 1};
  REQUIRE_FALSE(shard.Push(0, 0, g0)->duplicate);
  CHECK(shard.Push(0, 0, g0)->duplicate);  // handler called twice before the step applies
  CHECK(shard.counters().applied_updates == 0);
  REQUIRE_FALSE(shard.Push(1, 0, g1)->duplicate);
  CHECK(shard.counters().applied_updates == 1);
  CHECK(shard.Push(1, 0, g1)->duplicate);  // and after it applied
  CHECK(shard.counters().applied_updates == 1);
  CHECK(shard.counters().duplicate_pushes == 2);
  ParameterShard reference(Options(TrainingMode::kSync, 2), kInitial);
  REQUIRE(reference.Push(0, 0, g0).ok());
  REQUIRE(reference.Push(1, 0, g1).ok());
  CHECK(PullValues(shard, 0, 1) == PullValues(reference, 0, 1));
}

TEST_CASE("sync: the result does not depend on the order pushes arrive in") {
  const std::vector<float> g0 = {0.1f, 0.7f, -0.3f}, g1 = {0.2f, -0.9f, 1e-3f},
                           g2 = {5.0f, 1e-7f, 0.33f};
  ParameterShard forward(Options(TrainingMode::kSync, 3), kInitial);
  ParameterShard backward(Options(TrainingMode::kSync, 3), kInitial);
  for (int step = 0; step < 5; ++step) {
    REQUIRE(forward.Push(0, step, g0).ok());
    REQUIRE(forward.Push(1, step, g1).ok());
    REQUIRE(forward.Push(2, step, g2).ok());
    REQUIRE(backward.Push(2, step, g2).ok());
    REQUIRE(backward.Push(1, step, g1).ok());
    REQUIRE(backward.Push(0, step, g0).ok());
  }
  CHECK(PullValues(forward, 0, 5) == PullValues(backward, 0, 5));  // bit-identical
}

TEST_CASE("sync: a push ahead of the shard's step is refused") {
  ParameterShard shard(Options(TrainingMode::kSync, 2), kInitial);
  absl::StatusOr<PushOutcome> ahead = shard.Push(0, 1, std::vector<float>{1, 1, 1});
  REQUIRE(ahead.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(ahead.status().message()).find("shard 3 is at step 0") != std::string::npos);
}

TEST_CASE("bad pushes are refused with the reason and leave the weights untouched") {
  ParameterShard shard(Options(TrainingMode::kAsync, 2), kInitial);
  absl::StatusOr<PushOutcome> unknown = shard.Push(2, 0, std::vector<float>{1, 1, 1});
  REQUIRE(unknown.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(unknown.status().message()).find("unknown worker rank 2") != std::string::npos);
  absl::StatusOr<PushOutcome> short_gradient = shard.Push(0, 0, std::vector<float>{1, 1});
  REQUIRE(short_gradient.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(
      std::string(short_gradient.status().message()).find("has 3 parameters; the gradient has 2") !=
      std::string::npos);
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    absl::StatusOr<PushOutcome> nonfinite = shard.Push(0, 0, std::vector<float>{1, bad, 1});
    REQUIRE(nonfinite.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(nonfinite.status().message()).find("gradient[1]") != std::string::npos);
  }
  CHECK(shard.counters().rejected_nonfinite == 2);
  CHECK(shard.counters().rejected_pushes == 4);
  CHECK(shard.counters().applied_updates == 0);
  CHECK(PullValues(shard, 0, 0) == kInitial);
  CHECK(shard.Pull(-1, 0, Soon()).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("async: every push is one update, applied at once; pulls never wait") {
  ParameterShard shard(Options(TrainingMode::kAsync, 2), kInitial);
  REQUIRE(shard.Push(1, 0, std::vector<float>{1, 1, 1}).ok());
  CHECK(PullValues(shard, 0, 100)[0] == Approx(FirstAdamStep(1.0f, 1.0f)));
  REQUIRE(shard.Push(1, 1, std::vector<float>{1, 1, 1}).ok());
  CHECK(shard.Push(1, 1, std::vector<float>{1, 1, 1})->duplicate);
  CHECK(shard.Push(1, 0, std::vector<float>{1, 1, 1})->duplicate);
  REQUIRE(shard.Push(0, 0, std::vector<float>{1, 1, 1}).ok());
  CHECK(shard.counters().applied_updates == 3);
}

TEST_CASE(
    "shared pulls: a version held by a reply never changes; an update writes in place once nobody "
    "holds it") {
  ParameterShard shard(Options(TrainingMode::kAsync, 1), kInitial);
  std::shared_ptr<const std::vector<float>> first;
  PulledValues info;
  REQUIRE(shard.PullShared(0, 0, Soon(), &first, &info).ok());
  CHECK(*first == kInitial);
  CHECK(info.applied_updates == 0);
  CHECK(info.values.empty());
  const float* first_storage = first->data();

  // Held: the update goes elsewhere and the held version keeps the old values.
  REQUIRE(shard.Push(0, 0, std::vector<float>{1, 1, 1}).ok());
  CHECK(*first == kInitial);
  std::shared_ptr<const std::vector<float>> second;
  REQUIRE(shard.PullShared(0, 1, Soon(), &second, nullptr).ok());
  CHECK((*second)[0] == Approx(FirstAdamStep(1.0f, 1.0f)));
  CHECK(second->data() != first_storage);
  CHECK(*second == PullValues(shard, 0, 1));  // what a copying pull returns

  // Released: the next update is in place, in the same buffer.
  const std::vector<float> before = *second;
  const float* second_storage = second->data();
  second.reset();
  REQUIRE(shard.Push(0, 1, std::vector<float>{1, 1, 1}).ok());
  std::shared_ptr<const std::vector<float>> third;
  REQUIRE(shard.PullShared(0, 2, Soon(), &third, nullptr).ok());
  CHECK(third->data() == second_storage);
  CHECK((*third)[0] < before[0]);  // moved again against a positive gradient

  // A version replaced while held is reused once its reader lets go: no fresh buffer.
  first.reset();
  REQUIRE(shard.Push(0, 2, std::vector<float>{1, 1, 1}).ok());  // third is held
  std::shared_ptr<const std::vector<float>> fourth;
  REQUIRE(shard.PullShared(0, 3, Soon(), &fourth, nullptr).ok());
  CHECK(fourth->data() == first_storage);
  CHECK(*fourth == PullValues(shard, 0, 3));
  CHECK(shard.counters().applied_updates == 3);
}

TEST_CASE("ssp: a worker more than `staleness` steps ahead of the slowest waits") {
  ParameterShard shard(Options(TrainingMode::kSsp, 2, /*staleness=*/1), kInitial);
  const std::vector<float> g = {1, 1, 1};
  REQUIRE(shard.Push(0, 0, g).ok());
  CHECK(shard.Pull(0, 1, Soon()).ok());  // 1 step ahead of worker 1: allowed
  REQUIRE(shard.Push(0, 1, g).ok());
  absl::StatusOr<PulledValues> blocked = shard.Pull(0, 2, Soon());
  REQUIRE(blocked.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::string(blocked.status().message()).find("workers [1]") != std::string::npos);
  REQUIRE(shard.Push(1, 0, g).ok());
  absl::StatusOr<PulledValues> released = shard.Pull(0, 2, Soon());
  REQUIRE(released.ok());
  CHECK(released->applied_updates == 3);
}

TEST_CASE("Close releases waiting pulls with UNAVAILABLE") {
  ParameterShard shard(Options(TrainingMode::kSync, 2), kInitial);
  absl::StatusOr<PulledValues> pulled;
  std::thread waiter([&] { pulled = shard.Pull(0, 1, absl::Now() + absl::Seconds(30)); });
  // Step 1 needs both workers' pushes: the pull can only wait. Close once it is waiting.
  AwaitOneWaitingPull(shard);
  shard.Close("test");
  waiter.join();
  CHECK(pulled.status().code() == absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace paramserver

namespace paramserver {
namespace {

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

namespace paramserver {
namespace {

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
  for (const std::vector<float>* floats :
       {&state.values, &state.first_moment, &state.second_moment})
    for (float x : *floats) CHECK(std::isfinite(x));
  CHECK(state.values[0] == Approx(0.99f));
  CHECK(state.values[1] == 2.0f);
  CHECK(state.values[2] == Approx(-2.99f));
  CHECK(state.second_moment[0] == Approx(3.24e35));  // (1 - 0.999) * 1.8e19^2
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
  entry.gradient = {1.0f, 1.8e19f, 1.0f};
  REQUIRE(backup.ApplyLogEntry(entry).ok());
  CHECK(backup.log_index() == 1);
}

}  // namespace
}  // namespace paramserver
