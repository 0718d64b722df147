#include "worker/trainer.h"

#include "catch2/catch.hpp"
#include "worker/cpu_backend.h"

namespace paramserver {
namespace {

// Records every pull and push; serves fixed parameters.
class RecordingFakePsClient final : public PsClient {
 public:
  explicit RecordingFakePsClient(std::vector<float> params) : params_(std::move(params)) {}
  absl::Status PullAll(int64_t step, absl::Span<float> params) override {
    pulled_steps.push_back(step);
    if (!pull_failures.empty()) {
      absl::Status failure = pull_failures.front();
      pull_failures.erase(pull_failures.begin());
      return failure;
    }
    std::copy(params_.begin(), params_.end(), params.begin());
    return absl::OkStatus();
  }
  absl::Status PushAll(int64_t step, absl::Span<const float> gradient) override {
    pushed_steps.push_back(step);
    pushed_gradients.emplace_back(gradient.begin(), gradient.end());
    if (fail_push_at == step) return absl::UnavailableError("injected");
    return absl::OkStatus();
  }
  absl::StatusOr<ShardMapUpdate> RefreshShardMap() override {
    ++refreshes;
    ShardMapUpdate update;
    if (!updates.empty()) {
      update = updates.front();
      updates.erase(updates.begin());
    }
    return update;
  }
  absl::StatusOr<int64_t> StartStep() override { return 0; }
  std::vector<int64_t> pulled_steps, pushed_steps;
  std::vector<ShardMapUpdate> updates;
  std::vector<absl::Status> pull_failures;  // returned by the next pulls, in order
  int refreshes = 0;
  std::vector<std::vector<float>> pushed_gradients;
  int64_t fail_push_at = -1;

 private:
  std::vector<float> params_;
};

// 20 examples of 3 features; label = index % 2.
LabeledDataset SmallDataset() {
  LabeledDataset d;
  d.example_count = 20;
  d.feature_count = 3;
  for (int i = 0; i < 20; ++i) {
    for (int j = 0; j < 3; ++j) d.features.push_back(static_cast<float>((i * 3 + j) % 7) / 7.0f);
    d.labels.push_back(static_cast<uint8_t>(i % 2));
  }
  return d;
}

TrainerOptions Options(int rank, int workers) {
  TrainerOptions options;
  options.worker_rank = rank;
  options.num_workers = workers;
  options.training.batch_size = 3;
  options.training.epochs = 2;
  options.training.shuffle = false;
  return options;
}

TEST_CASE("the trainer pulls and pushes every step of every epoch, in order") {
  const MlpLayout layout({3, 4, 2});
  const LabeledDataset data = SmallDataset();
  RecordingFakePsClient ps(InitializeMlpParameters(layout, 1));
  CpuBackend backend(layout, 1);
  auto trainer = Trainer::Create(Options(1, 2), layout, &data, nullptr, &ps, &backend);
  REQUIRE(trainer.ok());
  CHECK((*trainer)->total_steps() == 6);  // 10 examples per worker / batch 3 = 3 steps, x 2 epochs
  absl::StatusOr<TrainingSummary> summary = (*trainer)->Run();
  REQUIRE(summary.ok());
  CHECK(summary->steps == 6);
  CHECK(summary->samples == 18);
  CHECK(ps.pulled_steps == std::vector<int64_t>{0, 1, 2, 3, 4, 5});
  CHECK(ps.pushed_steps == std::vector<int64_t>{0, 1, 2, 3, 4, 5});
  CHECK((*trainer)->progress().step() == 6);

  // Rank 1 of 2 owns examples [10, 20); without shuffle its first batch is 10, 11, 12.
  std::vector<float> expected(layout.total_parameters());
  CpuBackend reference(layout, 1);
  REQUIRE(reference
              .ComputeGradients(InitializeMlpParameters(layout, 1),
                                {data.features.data() + 10 * 3, data.labels.data() + 10, 3},
                                absl::MakeSpan(expected))
              .ok());
  CHECK(ps.pushed_gradients[0] == expected);
  CHECK(ps.pushed_gradients[3] == expected);  // epoch 2 starts over, file order
}

TEST_CASE("max_steps caps the run; errors name themselves; Stop cancels") {
  const MlpLayout layout({3, 2});
  const LabeledDataset data = SmallDataset();
  CpuBackend backend(layout, 1);
  {
    RecordingFakePsClient ps(InitializeMlpParameters(layout, 1));
    TrainerOptions options = Options(0, 1);
    options.training.max_steps = 4;
    auto trainer = Trainer::Create(options, layout, &data, nullptr, &ps, &backend);
    REQUIRE(trainer.ok());
    CHECK((*trainer)->total_steps() == 4);
  }
  {
    RecordingFakePsClient ps(InitializeMlpParameters(layout, 1));
    ps.fail_push_at = 2;
    TrainerOptions options = Options(0, 1);
    options.recovery_timeout = absl::Milliseconds(300);
    auto trainer = Trainer::Create(options, layout, &data, nullptr, &ps, &backend);
    REQUIRE(trainer.ok());
    absl::StatusOr<TrainingSummary> failed = (*trainer)->Run();
    CHECK(failed.status().code() == absl::StatusCode::kUnavailable);
    CHECK(std::string(failed.status().message()).find("gave up after") != std::string::npos);
    CHECK(ps.refreshes > 1);  // it kept trying before giving up
  }
  {
    RecordingFakePsClient ps(InitializeMlpParameters(layout, 1));
    auto trainer = Trainer::Create(Options(0, 1), layout, &data, nullptr, &ps, &backend);
    REQUIRE(trainer.ok());
    (*trainer)->Stop();
    CHECK((*trainer)->Run().status().code() == absl::StatusCode::kCancelled);
  }
  TrainerOptions too_big = Options(0, 4);
  too_big.training.batch_size = 6;  // 5 examples per worker
  RecordingFakePsClient ps(InitializeMlpParameters(layout, 1));
  auto refused = Trainer::Create(too_big, layout, &data, nullptr, &ps, &backend);
  REQUIRE_FALSE(refused.ok());
  CHECK(std::string(refused.status().message()).find("batch_size 6 is larger") != std::string::npos);
}

TEST_CASE("after a map change the last push is re-sent, and after a rollback the trainer rewinds") {
  const MlpLayout layout({3, 2});
  const LabeledDataset data = SmallDataset();
  CpuBackend backend(layout, 1);
  RecordingFakePsClient ps(InitializeMlpParameters(layout, 1));
  // Step 2's pull fails once (its server died); the refresh finds a new map. Later,
  // step 4's pull fails and the refresh finds a rollback to step 1.
  ps.pull_failures = {absl::OkStatus(), absl::OkStatus(), absl::UnavailableError("ps-1 is gone")};
  ShardMapUpdate moved;
  moved.epoch_changed = true;
  moved.epoch = 2;
  ps.updates = {moved};
  auto trainer = Trainer::Create(Options(0, 1), layout, &data, nullptr, &ps, &backend);
  REQUIRE(trainer.ok());
  absl::StatusOr<TrainingSummary> summary = (*trainer)->Run();
  REQUIRE(summary.ok());
  // 12 steps (6 per epoch). Pushes: 0, 1, then 1 again (re-sent on the new map), then
  // 2..11; step 2 is pulled twice.
  auto steps = [](std::vector<int64_t> head, int64_t from) {
    for (int64_t s = from; s < 12; ++s) head.push_back(s);
    return head;
  };
  CHECK(ps.pushed_steps == steps({0, 1, 1}, 2));
  CHECK(ps.pulled_steps == steps({0, 1, 2}, 2));

  RecordingFakePsClient rolled(InitializeMlpParameters(layout, 1));
  rolled.pull_failures = {absl::OkStatus(), absl::OkStatus(), absl::OkStatus(), absl::OkStatus(),
                          absl::UnavailableError("ps-0 is gone")};
  ShardMapUpdate rollback;
  rollback.epoch_changed = true;
  rollback.epoch = 2;
  rollback.rewind_to = 1;
  rolled.updates = {rollback};
  auto rewinding = Trainer::Create(Options(0, 1), layout, &data, nullptr, &rolled, &backend);
  REQUIRE(rewinding.ok());
  REQUIRE((*rewinding)->Run().ok());
  CHECK(rolled.pushed_steps == steps({0, 1, 2, 3}, 1));

  RecordingFakePsClient fenced(InitializeMlpParameters(layout, 1));
  fenced.pull_failures = {absl::FailedPreconditionError("worker 0 was declared dead")};
  ShardMapUpdate dead;
  dead.self_active = false;
  fenced.updates = {dead};
  auto refused = Trainer::Create(Options(0, 1), layout, &data, nullptr, &fenced, &backend);
  REQUIRE(refused.ok());
  absl::StatusOr<TrainingSummary> ended = (*refused)->Run();
  REQUIRE_FALSE(ended.ok());
  CHECK(std::string(ended.status().message()).find("declared this worker dead") != std::string::npos);
}

TEST_CASE("Evaluate returns the fraction of test examples classified right") {
  // One linear layer that copies feature 0 to class 0's logit and feature 1 to class 1's.
  const MlpLayout layout({3, 2});
  RecordingFakePsClient ps({1, 0, 0, 0, 1, 0, 0, 0});
  LabeledDataset test;
  test.example_count = 4;
  test.feature_count = 3;
  test.features = {1, 0, 0, 0, 1, 0, 1, 0, 0, 0, 1, 0};
  test.labels = {0, 1, 1, 0};  // two right, two wrong
  const LabeledDataset data = SmallDataset();
  CpuBackend backend(layout, 1);
  TrainerOptions options = Options(0, 1);
  options.evaluate_each_epoch = true;
  auto trainer = Trainer::Create(options, layout, &data, &test, &ps, &backend);
  REQUIRE(trainer.ok());
  std::vector<float> weights;
  absl::StatusOr<double> accuracy = (*trainer)->Evaluate(7, &weights);
  REQUIRE(accuracy.ok());
  CHECK(*accuracy == 0.5);
  CHECK(ps.pulled_steps == std::vector<int64_t>{7});
  CHECK(weights.size() == 8);
}

}  // namespace
}  // namespace paramserver
