// The consistency rule alone, without a shard: which pushes are new, which repeat, and
// when pulls may proceed, in each mode.
#include "ps/consistency_gate.h"

#include "absl/strings/match.h"
#include "catch2/catch.hpp"

namespace paramserver {
namespace {

using Verdict = ConsistencyGate::Verdict;

TEST_CASE("a sync gate completes a step once every active worker pushed it") {
  ConsistencyGate gate(/*shard_id=*/4, TrainingMode::kSync, /*num_workers=*/3, 0, 0);
  CHECK(gate.Judge(1, 0, /*applied_updates=*/0).value() == Verdict::kNew);
  gate.Take(1, 0);
  CHECK(gate.Judge(1, 0, 0).value() == Verdict::kRepeat);  // the same (worker, step) again
  CHECK(gate.CompleteStepContributors().empty());
  CHECK(gate.AnyPending());
  CHECK_FALSE(gate.PullMayProceed(1, 0));
  CHECK(gate.DescribeWait(1, 0) ==
        "shard 4 is at step 0 and a pull for step 1 waits for the step-0 pushes of workers [0, 2]");
  gate.Take(0, 0);
  gate.Take(2, 0);
  CHECK(gate.CompleteStepContributors() == std::vector<int>{0, 1, 2});
  gate.EndStep();
  CHECK_FALSE(gate.AnyPending());
  CHECK(gate.PullMayProceed(1, /*applied_updates=*/1));
  // An earlier step is a repeat; a later one is ahead of the shard.
  CHECK(gate.Judge(0, 0, 1).value() == Verdict::kRepeat);
  absl::StatusOr<Verdict> ahead = gate.Judge(0, 2, 1);
  CHECK(ahead.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(absl::StrContains(ahead.status().message(), "is ahead of it"));
  CHECK(gate.StartStep(2, 1) == 1);
}

TEST_CASE("a sync gate drops the pending gradient of a worker made inactive") {
  ConsistencyGate gate(0, TrainingMode::kSync, 2, 0, 0);
  gate.Take(1, 0);
  gate.SetActive({true, false});
  CHECK_FALSE(gate.received(1));
  CHECK_FALSE(gate.AnyPending());
  CHECK(gate.CheckMayPush(1, 0).code() == absl::StatusCode::kFailedPrecondition);
  gate.Take(0, 0);
  CHECK(gate.CompleteStepContributors() == std::vector<int>{0});  // the one active worker
  gate.SetActive({false, false});
  CHECK(gate.CompleteStepContributors().empty());  // none active: no step to apply
}

TEST_CASE(
    "a sync gate with backup workers completes a step with the first pushes, late ones dropped") {
  ConsistencyGate gate(1, TrainingMode::kSync, /*num_workers=*/4, 0, 0, /*backup_workers=*/1);
  gate.Take(3, 0);
  gate.Take(0, 0);
  CHECK(gate.CompleteStepContributors().empty());  // 2 of the 3 needed
  CHECK(gate.DescribeWait(1, 0) ==
        "shard 1 is at step 0 and a pull for step 1 waits for the step-0 pushes of 1 more of "
        "workers [1, 2]");
  gate.Take(2, 0);
  CHECK(gate.CompleteStepContributors() == std::vector<int>{0, 2, 3});
  gate.EndStep();
  // Worker 1's push of step 0 comes after the step completed: late; worker 2's again: a
  // repeat of the one taken.
  CHECK(gate.Judge(1, 0, /*applied_updates=*/1).value() == Verdict::kLate);
  CHECK(gate.Judge(2, 0, 1).value() == Verdict::kRepeat);
  // One worker declared dead: 2 of the 3 active are needed; two dead: 1 of 2 (never 0).
  gate.SetActive({true, true, true, false});
  gate.Take(1, 1);
  CHECK(gate.CompleteStepContributors().empty());
  gate.Take(2, 1);
  CHECK(gate.CompleteStepContributors() == std::vector<int>{1, 2});
  gate.EndStep();
  CHECK(gate.Judge(1, 1, 2).value() == Verdict::kRepeat);
  CHECK(gate.Judge(0, 1, 2).value() == Verdict::kLate);
  gate.SetActive({true, true, false, false});
  CHECK(gate.CompleteStepContributors().empty());  // nobody pushed step 2 yet
  gate.Take(0, 2);
  CHECK(gate.CompleteStepContributors() == std::vector<int>{0});
}

TEST_CASE("a sync replica assumes every worker pushed the steps its primary applied") {
  ConsistencyGate gate(1, TrainingMode::kSync, 3, 0, /*applied_updates=*/5, 1);
  // A gate resumed at step 5: a push of an earlier step repeats one taken before.
  CHECK(gate.Judge(2, 4, 5).value() == Verdict::kRepeat);
  CHECK(gate.Judge(2, 6, 7).value() == Verdict::kLate);  // steps 5 and 6 went on without it
  gate.AssumePushedBefore(7);
  CHECK(gate.Judge(2, 6, 7).value() == Verdict::kRepeat);
  // Without backup workers every active worker's push is still needed, and a push of an
  // applied step is a repeat, even of a rank that was inactive for it.
  ConsistencyGate all(1, TrainingMode::kSync, 3, 0, 0);
  all.Take(0, 0);
  all.Take(1, 0);
  CHECK(all.CompleteStepContributors().empty());
  all.SetActive({true, true, false});
  CHECK(all.CompleteStepContributors() == std::vector<int>{0, 1});
  all.EndStep();
  all.SetActive({true, true, true});
  CHECK(all.Judge(2, 0, 1).value() == Verdict::kRepeat);
}

TEST_CASE("an async gate takes each worker's steps in order and bounds how far ahead") {
  ConsistencyGate gate(2, TrainingMode::kAsync, 2, 0, 0);
  CHECK(gate.Judge(0, 5, 0).value() == Verdict::kNew);  // a gap: pushes lost to a restore
  gate.Take(0, 5);
  CHECK(gate.pushed_steps() == std::vector<int64_t>{6, 0});
  CHECK(gate.Judge(0, 5, 1).value() == Verdict::kRepeat);
  CHECK(gate.Judge(0, 3, 1).value() == Verdict::kRepeat);
  absl::StatusOr<Verdict> far =
      gate.Judge(1, ConsistencyGate::kMaxAsyncStepLead, 1);  // its next step is 0
  CHECK(far.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(gate.Judge(1, ConsistencyGate::kMaxAsyncStepLead - 1, 1).value() == Verdict::kNew);
  // A worker starts at the slowest active worker's next step, counting its own.
  CHECK(gate.StartStep(0, 1) == 0);
  gate.SetActive({true, false});
  CHECK(gate.StartStep(0, 1) == 6);
  CHECK(gate.PullMayProceed(1000, 0));  // async pulls never wait
}

TEST_CASE("an ssp gate lets a pull run at most `staleness` steps ahead of the slowest") {
  ConsistencyGate gate(7, TrainingMode::kSsp, 2, /*staleness=*/1, 0);
  for (int64_t s = 0; s < 3; ++s) gate.Take(0, s);  // worker 0 pushed steps 0..2
  CHECK(gate.PullMayProceed(1, 0));                 // worker 1 at 0: 0 >= 1 - 1
  CHECK_FALSE(gate.PullMayProceed(2, 0));
  CHECK(gate.DescribeWait(2, 0) ==
        "shard 7: a pull for step 2 (staleness 1) waits for workers [1] to push step 0");
  gate.Take(1, 0);
  CHECK(gate.PullMayProceed(2, 0));
  gate.SetActive({true, false});  // the slow worker gone: it bounds nobody
  CHECK(gate.PullMayProceed(4, 0));
}

TEST_CASE(
    "a gate resumed from a checkpoint counts each async worker's share of its updates, "
    "and each sync worker's every step") {
  ConsistencyGate gate(0, TrainingMode::kAsync, 4, 0, /*applied_updates=*/41);
  CHECK(gate.pushed_steps() == std::vector<int64_t>{10, 10, 10, 10});
  ConsistencyGate sync(0, TrainingMode::kSync, 4, 0, 41);
  CHECK(sync.pushed_steps() == std::vector<int64_t>{41, 41, 41, 41});
}

TEST_CASE("a gate refuses unknown ranks and negative steps") {
  ConsistencyGate gate(0, TrainingMode::kSync, 2, 0, 0);
  CHECK(gate.CheckWorker(2).code() == absl::StatusCode::kInvalidArgument);
  CHECK(gate.CheckWorker(-1).code() == absl::StatusCode::kInvalidArgument);
  CHECK(gate.CheckWorker(1).ok());
  CHECK(gate.CheckMayPush(1, -1).code() == absl::StatusCode::kInvalidArgument);
  CHECK(gate.CheckMayPush(1, 0).ok());
}

}  // namespace
}  // namespace paramserver
