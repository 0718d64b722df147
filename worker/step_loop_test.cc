#include "worker/step_loop.h"

#include <deque>
#include <map>
#include <string>
#include <vector>

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

// Answers map refreshes from a script; no pulls or pushes go through it (the model's
// steps are scripted too).
class ScriptedMapClient final : public PsClient {
 public:
  absl::Status Pull(const StepPull&) override { return absl::OkStatus(); }
  absl::StatusOr<bool> Push(const StepPush&) override { return false; }
  absl::StatusOr<ShardMapUpdate> RefreshShardMap() override {
    ++refreshes;
    if (updates.empty()) return ShardMapUpdate{};
    ShardMapUpdate update = updates.front();
    updates.pop_front();
    return update;
  }
  absl::StatusOr<int64_t> StartStep() override { return 0; }
  // The last step's push as the servers answered it: acknowledgements[step], or 2 shards
  // taking it at that step.
  PushAcknowledgement last_push() const override {
    auto scripted = acknowledgements.find(trained_step);
    return scripted != acknowledgements.end() ? scripted->second
                                              : PushAcknowledgement{2, 0, trained_step};
  }
  std::deque<ShardMapUpdate> updates;
  int refreshes = 0;
  std::map<int64_t, PushAcknowledgement> acknowledgements;
  int64_t trained_step = -1;  // the model's last TrainStep
};

// Records what the loop asks of it, in order, as one line per call; each step's
// transfer fails as `transfer_failures` says (one status per try, front first).
class RecordingModel final : public StepModel {
 public:
  explicit RecordingModel(StepLoop* loop, ScriptedMapClient* ps = nullptr) : loop_(loop), ps_(ps) {}
  std::string compute_name() const override { return "fake"; }
  absl::StatusOr<StepResult> TrainStep(const StepInput& in, TrainingSummary*) override {
    const absl::Span<const int64_t> examples = loop_->BatchExamples(in.position);
    calls.push_back("step " + std::to_string(in.step) + " first example " +
                    std::to_string(examples.front()));
    if (ps_ != nullptr) ps_->trained_step = in.step;
    if (in.step == fail_at) return absl::InternalError("the compute failed");
    StepResult result;
    result.loss = 0.5f;
    if (!transfer_failures.empty() && in.step == transfer_failures.front().first) {
      result.transfer = transfer_failures.front().second;
      transfer_failures.pop_front();
    }
    return result;
  }
  void ForgetPrefetched() override { calls.push_back("forget"); }
  absl::Status ResendLastPush() override {
    calls.push_back("resend");
    return resend_result;
  }
  void Rewound(int64_t step) override { calls.push_back("rewound to " + std::to_string(step)); }
  absl::Status EvaluateEpoch(int64_t step, int epoch, std::optional<int64_t>* rewind) override {
    calls.push_back("evaluate after " + std::to_string(step) + " (epoch " + std::to_string(epoch) +
                    ")");
    if (evaluation_rewind.has_value()) {
      *rewind = evaluation_rewind;
      evaluation_rewind.reset();
    }
    return absl::OkStatus();
  }

  std::vector<std::string> calls;
  std::deque<std::pair<int64_t, absl::Status>> transfer_failures;  // (step, status)
  absl::Status resend_result;
  std::optional<int64_t> evaluation_rewind;
  int64_t fail_at = -1;

 private:
  StepLoop* const loop_;
  ScriptedMapClient* const ps_;
};

// 20 examples, 2 workers, batch 3: 3 steps per epoch on each worker's 10.
StepLoopOptions Options(int rank, int epochs) {
  StepLoopOptions options;
  options.worker_rank = rank;
  options.num_workers = 2;
  options.training.batch_size = 3;
  options.training.epochs = epochs;
  options.training.shuffle = false;
  options.recovery_timeout = absl::Seconds(30);
  return options;
}

TEST_CASE(
    "the step loop runs every step of every epoch on the worker's part, evaluating at "
    "each epoch's end but the last") {
  ScriptedMapClient ps;
  StepLoopOptions options = Options(/*rank=*/1, /*epochs=*/2);
  options.evaluate_each_epoch = true;
  REQUIRE(StepLoop::StepsPerEpoch(options, 20).value() == 3);
  StepLoop loop(options, 20, 3, &ps);
  RecordingModel model(&loop);
  const absl::StatusOr<TrainingSummary> summary = loop.Run(&model);
  REQUIRE(summary.ok());
  CHECK(summary->steps == 6);
  CHECK(summary->samples == 18);
  // Rank 1 of 2 owns examples [10, 20): batches start at 10, 13, 16 in file order.
  CHECK(model.calls ==
        std::vector<std::string>{"step 0 first example 10", "step 1 first example 13",
                                 "step 2 first example 16", "evaluate after 3 (epoch 0)",
                                 "step 3 first example 10", "step 4 first example 13",
                                 "step 5 first example 16"});
  CHECK(loop.progress().step() == 6);
  CHECK(ps.refreshes == 0);
}

TEST_CASE(
    "backup workers: a push late on every shard trains no samples; once the servers are past "
    "the next step the loop goes on at theirs, evaluating at an epoch's end it passed") {
  ScriptedMapClient ps;
  ps.acknowledgements[1] = {2, 2, 2};  // late, the servers at the next step: no jump
  ps.acknowledgements[2] = {2, 2, 7};  // late, the servers at step 7: past epoch 1's end
  StepLoopOptions options = Options(0, /*epochs=*/3);
  options.evaluate_each_epoch = true;
  options.training.backup_workers = 1;
  StepLoop loop(options, 20, 3, &ps);
  RecordingModel model(&loop, &ps);
  const absl::StatusOr<TrainingSummary> summary = loop.Run(&model);
  REQUIRE(summary.ok());
  CHECK(model.calls ==
        std::vector<std::string>{"step 0 first example 0", "step 1 first example 3",
                                 "step 2 first example 6", "evaluate after 3 (epoch 0)", "forget",
                                 "evaluate after 7 (epoch 1)", "step 7 first example 3",
                                 "step 8 first example 6"});
  CHECK(summary->steps == 9);
  CHECK(summary->steps_run == 5);
  CHECK(summary->samples == 3 * 3);  // steps 0, 7 and 8: the late ones trained nothing

  // A jump to the last step: the summary says the job's end.
  ScriptedMapClient to_end;
  to_end.acknowledgements[0] = {2, 2, 9};
  StepLoop short_loop(options, 20, 3, &to_end);
  RecordingModel short_model(&short_loop, &to_end);
  const absl::StatusOr<TrainingSummary> ended = short_loop.Run(&short_model);
  REQUIRE(ended.ok());
  CHECK(short_model.calls == std::vector<std::string>{"step 0 first example 0", "forget"});
  CHECK(ended->steps == 9);

  // Without backup workers the servers' answers are not looked at.
  options.training.backup_workers = 0;
  ScriptedMapClient plain;
  plain.acknowledgements[0] = {2, 2, 9};
  StepLoop plain_loop(options, 20, 3, &plain);
  RecordingModel plain_model(&plain_loop, &plain);
  REQUIRE(plain_loop.Run(&plain_model).ok());
  CHECK(plain_model.calls.size() == 9 + 2);  // every step, two evaluations
}

TEST_CASE(
    "a failed transfer is retried on the refreshed map: the same step while the map is "
    "unchanged, after re-sending the last push when it changed") {
  ScriptedMapClient ps;
  ps.updates = {ShardMapUpdate{}, ShardMapUpdate{/*epoch_changed=*/true, /*epoch=*/2}};
  StepLoop loop(Options(0, 1), 20, 3, &ps);
  RecordingModel model(&loop);
  model.transfer_failures = {{1, absl::UnavailableError("server gone")},
                             {1, absl::UnavailableError("server gone")}};
  REQUIRE(loop.Run(&model).ok());
  CHECK(model.calls == std::vector<std::string>{"step 0 first example 0", "step 1 first example 3",
                                                "forget", "step 1 first example 3", "forget",
                                                "resend", "step 1 first example 3",
                                                "step 2 first example 6"});
  CHECK(ps.refreshes == 2);
}

TEST_CASE("after a rollback the loop goes back to the servers' step") {
  ScriptedMapClient ps;
  ShardMapUpdate rolled_back{/*epoch_changed=*/true, /*epoch=*/3};
  rolled_back.rewind_to = 1;
  ps.updates = {rolled_back};
  StepLoop loop(Options(0, 1), 20, 3, &ps);
  RecordingModel model(&loop);
  model.transfer_failures = {{2, absl::UnavailableError("rolled back")}};
  REQUIRE(loop.Run(&model).ok());
  CHECK(model.calls == std::vector<std::string>{"step 0 first example 0", "step 1 first example 3",
                                                "step 2 first example 6", "forget", "rewound to 1",
                                                "step 1 first example 3",
                                                "step 2 first example 6"});
}

TEST_CASE("a rollback seen by the epoch's evaluation sends the loop back") {
  ScriptedMapClient ps;
  StepLoopOptions options = Options(0, 2);
  options.evaluate_each_epoch = true;
  StepLoop loop(options, 20, 3, &ps);
  RecordingModel model(&loop);
  model.evaluation_rewind = 2;
  REQUIRE(loop.Run(&model).ok());
  CHECK(model.calls ==
        std::vector<std::string>{"step 0 first example 0", "step 1 first example 3",
                                 "step 2 first example 6", "evaluate after 3 (epoch 0)", "forget",
                                 "step 2 first example 6", "evaluate after 3 (epoch 0)",
                                 "step 3 first example 0", "step 4 first example 3",
                                 "step 5 first example 6"});
}

TEST_CASE(
    "the loop stops: at the model's error, at an error no map change cures, at a resend "
    "that fails for good, after its recovery time, when stopped") {
  ScriptedMapClient ps;
  SECTION("the model's error ends the run as it is") {
    StepLoop loop(Options(0, 1), 20, 3, &ps);
    RecordingModel model(&loop);
    model.fail_at = 1;
    const absl::StatusOr<TrainingSummary> summary = loop.Run(&model);
    CHECK(summary.status() == absl::InternalError("the compute failed"));
  }
  SECTION("a transfer error that a map change cannot cure is returned") {
    StepLoop loop(Options(0, 1), 20, 3, &ps);
    RecordingModel model(&loop);
    model.transfer_failures = {{0, absl::InvalidArgumentError("bad push")}};
    CHECK(loop.Run(&model).status() == absl::InvalidArgumentError("bad push"));
    CHECK(ps.refreshes == 0);
  }
  SECTION("a re-sent push refused for good is returned; one that may be cured is not") {
    ps.updates = {ShardMapUpdate{true, 2}, ShardMapUpdate{true, 3}};
    StepLoop loop(Options(0, 1), 20, 3, &ps);
    RecordingModel model(&loop);
    model.transfer_failures = {{1, absl::UnavailableError("moved")}};
    model.resend_result = absl::UnavailableError("moved again");
    REQUIRE(loop.Run(&model).ok());
    StepLoop second(Options(0, 1), 20, 3, &ps);
    RecordingModel refused(&second);
    refused.transfer_failures = {{1, absl::UnavailableError("moved")}};
    refused.resend_result = absl::InvalidArgumentError("refused");
    CHECK(second.Run(&refused).status() == absl::InvalidArgumentError("refused"));
  }
  SECTION("recovery gives up after recovery_timeout, saying so") {
    StepLoopOptions options = Options(0, 1);
    options.recovery_timeout = absl::ZeroDuration();
    StepLoop loop(options, 20, 3, &ps);
    RecordingModel model(&loop);
    model.transfer_failures = {{0, absl::UnavailableError("gone")},
                               {0, absl::UnavailableError("gone")}};
    const absl::Status status = loop.Run(&model).status();
    CHECK(status.code() == absl::StatusCode::kUnavailable);
    CHECK(std::string(status.message()).find("gave up after") != std::string::npos);
  }
  SECTION("Stop() ends the run with CANCELLED at the next step") {
    StepLoop loop(Options(0, 1), 20, 3, &ps);
    loop.Stop();
    RecordingModel model(&loop);
    CHECK(loop.Run(&model).status().code() == absl::StatusCode::kCancelled);
    CHECK(model.calls.empty());
  }
}

TEST_CASE("the step loop refuses a batch larger than a worker's share, and caps at max_steps") {
  StepLoopOptions options = Options(0, 3);
  options.training.batch_size = 11;  // 10 examples each
  const absl::StatusOr<int64_t> refused = StepLoop::StepsPerEpoch(options, 20);
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(refused.status().message()).find("training.batch_size 11") !=
        std::string::npos);
  ScriptedMapClient ps;
  options = Options(0, 3);
  options.training.max_steps = 4;
  StepLoop loop(options, 20, 3, &ps);
  CHECK(loop.total_steps() == 4);
  RecordingModel model(&loop);
  REQUIRE(loop.Run(&model).value().steps == 4);
}

}  // namespace
}  // namespace paramserver
