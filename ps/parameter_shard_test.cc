// A dense shard under each consistency rule: when pushes apply and pulls wait.
#include "ps/parameter_shard.h"

#include <cmath>
#include <limits>
#include <thread>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "ps/dense_shard_testing.h"
#include "ps/shard_testing.h"

namespace paramserver {
namespace {

using namespace dense_shard_testing;  // NOLINT: the shared helpers of these tests

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

TEST_CASE(
    "sync, backup workers: a step applies with the mean of the first pushes; a late push "
    "changes nothing and is counted") {
  ParameterShardOptions options = Options(TrainingMode::kSync, 3);
  options.backup_workers = 1;
  ParameterShard shard(options, kInitial);
  REQUIRE_FALSE(shard.Push(2, 0, std::vector<float>{1.0f, -4.0f, 0.0f})->duplicate);
  CHECK(shard.counters().applied_updates == 0);
  absl::StatusOr<PushOutcome> second = shard.Push(0, 0, std::vector<float>{3.0f, 2.0f, 0.0f});
  REQUIRE(second.ok());
  CHECK(second->applied_updates == 1);  // 2 of 3 pushed: the step is done
  const std::vector<float> after = PullValues(shard, 1, 1);
  // The mean over the two that pushed: {2, -1, 0}; Adam's first step by hand.
  CHECK(after[0] == Approx(FirstAdamStep(1.0f, 2.0f)));
  CHECK(after[1] == Approx(FirstAdamStep(2.0f, -1.0f)));
  CHECK(after[2] == -3.0f);
  absl::StatusOr<PushOutcome> late = shard.Push(1, 0, std::vector<float>{100.0f, 100.0f, 100.0f});
  REQUIRE(late.ok());
  CHECK(late->late);
  CHECK_FALSE(late->duplicate);
  CHECK(late->applied_updates == 1);
  CHECK(PullValues(shard, 1, 1) == after);
  CHECK(shard.Push(0, 0, std::vector<float>{3.0f, 2.0f, 0.0f})->duplicate);  // a retry
  const ShardCounters counters = shard.counters();
  CHECK(counters.late_pushes == 1);
  CHECK(counters.duplicate_pushes == 1);
  CHECK(counters.accepted_pushes == 2);
  // Clipping needs the same workers on every shard: refused.
  const std::vector<float> ones = {1, 1, 1};
  ShardPush clipped{1, 1, UninitializedFloats(ones.begin(), ones.end()), {}, {}};
  clipped.clip_grad_norm = 1.0;
  absl::StatusOr<PushOutcome> refused = shard.Push(&clipped);
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(refused.status().message(), "training.sync.backup_workers"));
  // A late one too, which changes nothing either way but must not be acknowledged.
  ShardPush late_clipped{1, 0, UninitializedFloats(ones.begin(), ones.end()), {}, {}};
  late_clipped.clip_grad_norm = 1.0;
  CHECK(shard.Push(&late_clipped).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(shard.counters().late_pushes == 1);
}

TEST_CASE(
    "sync, backup workers: a promoted backup takes a repeat of an applied step for a "
    "repeat, not a late push") {
  ParameterShardOptions options = Options(TrainingMode::kSync, 3);
  options.backup_workers = 1;
  ParameterShard primary(options, kInitial);
  absl::StatusOr<std::unique_ptr<ParameterShard>> backup =
      ParameterShard::FromReplica(options, primary.ExportReplica());
  REQUIRE(backup.ok());
  REQUIRE(primary.Push(0, 0, std::vector<float>{1, 1, 1}).ok());
  absl::StatusOr<PushOutcome> completed = primary.Push(1, 0, std::vector<float>{1, 1, 1});
  REQUIRE(completed.ok());
  REQUIRE(completed->log.size() == 1);
  REQUIRE((*backup)->ApplyLogEntry(completed->log[0]).ok());
  // The backup, promoted, is re-sent worker 1's push (its acknowledgement was lost).
  absl::StatusOr<PushOutcome> resent = (*backup)->Push(1, 0, std::vector<float>{1, 1, 1});
  REQUIRE(resent.ok());
  CHECK(resent->duplicate);
  CHECK_FALSE(resent->late);
  CHECK(PullValues(**backup, 1, 1) == PullValues(primary, 1, 1));
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
