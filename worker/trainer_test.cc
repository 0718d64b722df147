#include "worker/trainer.h"

#include "catch2/catch.hpp"
#include "common/base/status_macros.h"
#include "worker/cpu_backend.h"

namespace paramserver {
namespace {

// Records every pull and push; serves fixed parameters.
class RecordingFakePsClient final : public PsClient {
 public:
  explicit RecordingFakePsClient(std::vector<float> params) : params_(std::move(params)) {}
  absl::Status Pull(const StepPull& pull) override {
    pulled_steps.push_back(pull.step);
    if (!pull_failures.empty()) {
      absl::Status failure = pull_failures.front();
      pull_failures.erase(pull_failures.begin());
      return failure;
    }
    std::copy(params_.begin(), params_.end(), pull.into.params.begin());
    return absl::OkStatus();
  }
  // Brings nothing back: the next step pulls.
  absl::StatusOr<bool> Push(const StepPush& push) override {
    pushed_steps.push_back(push.step);
    pushed_gradients.emplace_back(push.gradient.begin(), push.gradient.end());
    if (fail_push_at == push.step) return absl::UnavailableError("injected");
    return false;
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
  CHECK(std::string(refused.status().message()).find("batch_size 6 is larger") !=
        std::string::npos);
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

  // Declared dead (stopped past the failure timeout): the servers refuse its calls and
  // the map counts it out until its heartbeats register it again; then it goes on at
  // the slot's present step.
  RecordingFakePsClient fenced(InitializeMlpParameters(layout, 1));
  const absl::Status not_a_member = absl::PermissionDeniedError("no member is named 'worker-0'");
  fenced.pull_failures = {not_a_member, not_a_member, not_a_member};
  ShardMapUpdate dead;
  dead.self_active = false;
  ShardMapUpdate readmitted;
  readmitted.epoch_changed = true;
  readmitted.epoch = 4;
  readmitted.rejoined = true;
  readmitted.rewind_to = 9;
  fenced.updates = {dead, dead, readmitted};
  auto fenced_trainer = Trainer::Create(Options(0, 1), layout, &data, nullptr, &fenced, &backend);
  REQUIRE(fenced_trainer.ok());
  REQUIRE((*fenced_trainer)->Run().ok());
  CHECK(fenced.refreshes == 3);
  CHECK(fenced.pushed_steps == steps({}, 9));

  // A refusal no map change explains (the map still counts it in, unchanged) ends it.
  RecordingFakePsClient refused_ps(InitializeMlpParameters(layout, 1));
  refused_ps.pull_failures = {not_a_member};
  auto refused = Trainer::Create(Options(0, 1), layout, &data, nullptr, &refused_ps, &backend);
  REQUIRE(refused.ok());
  absl::StatusOr<TrainingSummary> ended = (*refused)->Run();
  REQUIRE_FALSE(ended.ok());
  CHECK(ended.status().code() == absl::StatusCode::kPermissionDenied);
  CHECK(refused_ps.refreshes == 1);
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

// Serves version v of the parameters (the initial ones scaled by 1 + v/100) for step v,
// and, for a push with pull_next, version step + 1 in the reply.
class VersionedFakePsClient final : public PsClient {
 public:
  explicit VersionedFakePsClient(std::vector<float> base) : base_(std::move(base)) {}
  std::vector<float> Version(int64_t v) const {
    std::vector<float> values = base_;
    for (float& x : values) x *= 1.0f + static_cast<float>(v) / 100.0f;
    return values;
  }
  absl::Status Pull(const StepPull& pull) override {
    pulled_steps.push_back(pull.step);
    const std::vector<float> values = Version(pull.step);
    std::copy(values.begin(), values.end(), pull.into.params.begin());
    return absl::OkStatus();
  }
  absl::StatusOr<bool> Push(const StepPush& push) override {
    pushed_steps.push_back(push.step);
    pushed_gradients.emplace_back(push.gradient.begin(), push.gradient.end());
    if (!push.next.has_value()) return false;
    const std::vector<float> values = Version(push.step + 1);
    std::copy(values.begin(), values.end(), push.next->params.begin());
    return true;
  }
  // Records what each streamed push was told, then pushes at Finish (the default).
  std::unique_ptr<StreamedPush> StartStreamedPush(const StepPush& push) override;
  absl::StatusOr<ShardMapUpdate> RefreshShardMap() override { return ShardMapUpdate(); }
  absl::StatusOr<int64_t> StartStep() override { return 0; }
  std::vector<int64_t> pulled_steps, pushed_steps;
  std::vector<std::vector<float>> pushed_gradients;
  std::vector<std::vector<int64_t>> ready_froms;  // per streamed push, its Ready calls
  bool every_ready_part_unchanged_at_finish = true;

 private:
  std::vector<float> base_;
};

class RecordingStreamedPush final : public StreamedPush {
 public:
  RecordingStreamedPush(VersionedFakePsClient* client, std::unique_ptr<StreamedPush> inner,
                        absl::Span<const float> gradient)
      : client_(client), inner_(std::move(inner)), gradient_(gradient) {
    client_->ready_froms.emplace_back();
  }
  void Ready(int64_t from) override {
    client_->ready_froms.back().push_back(from);
    parts_.emplace_back(gradient_.begin() + from, gradient_.end());
    inner_->Ready(from);
  }
  absl::StatusOr<bool> Finish() override {
    for (const std::vector<float>& part : parts_) {
      if (!std::equal(part.begin(), part.end(), gradient_.end() - part.size())) {
        client_->every_ready_part_unchanged_at_finish = false;
      }
    }
    return inner_->Finish();
  }
  int64_t early_buckets() const override { return inner_->early_buckets(); }

 private:
  VersionedFakePsClient* const client_;
  const std::unique_ptr<StreamedPush> inner_;
  const absl::Span<const float> gradient_;
  std::vector<std::vector<float>> parts_;
};

std::unique_ptr<StreamedPush> VersionedFakePsClient::StartStreamedPush(const StepPush& push) {
  return std::make_unique<RecordingStreamedPush>(this, PsClient::StartStreamedPush(push),
                                                 push.gradient);
}

// Trains 12 steps (2 epochs of 6) of rank 0 of 1 against `ps` on the CPU backend.
TrainingSummary RunOneWorker(const TrainerOptions& options, const MlpLayout& layout,
                             const LabeledDataset& data, PsClient* ps) {
  CpuBackend backend(layout, 1);
  auto trainer = Trainer::Create(options, layout, &data, nullptr, ps, &backend);
  REQUIRE(trainer.ok());
  REQUIRE((*trainer)->total_steps() == 12);
  absl::StatusOr<TrainingSummary> summary = (*trainer)->Run();
  REQUIRE(summary.ok());
  return *summary;
}

TEST_CASE(
    "async overlap: step t+1's gradient is computed on step t's values while step t's push flies") {
  const MlpLayout layout({3, 4, 2});
  const LabeledDataset data = SmallDataset();
  CpuBackend reference(layout, 1);
  // Rank 0 of 1, batch 3, no shuffle: step s of an epoch takes examples 3s, 3s+1, 3s+2
  // (6 steps per epoch of 20 examples).
  auto gradient_on = [&](const std::vector<float>& params, int64_t step) {
    std::vector<float> gradient(layout.total_parameters());
    const int64_t first = 3 * (step % 6);
    REQUIRE(reference
                .ComputeGradients(params,
                                  {data.features.data() + first * 3, data.labels.data() + first, 3},
                                  absl::MakeSpan(gradient))
                .ok());
    return gradient;
  };
  for (bool overlap : {true, false}) {
    VersionedFakePsClient ps(InitializeMlpParameters(layout, 1));
    TrainerOptions options = Options(0, 1);
    options.training.mode = TrainingMode::kAsync;
    options.training.overlap = overlap;
    const TrainingSummary summary = RunOneWorker(options, layout, data, &ps);
    INFO("overlap " << overlap);
    CHECK(ps.pulled_steps ==
          std::vector<int64_t>{0});  // every later step's values came with a push
    CHECK(ps.pushed_steps == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
    CHECK(summary.samples == 36);
    for (int64_t step = 0; step < 12; ++step) {
      // With overlap a step inside an epoch uses the values of the step before it (one
      // more step of staleness); an epoch's first step, computed after the epoch
      // boundary's ordinary push, uses its own.
      const bool stale = overlap && step % 6 != 0;
      INFO("step " << step);
      CHECK(ps.pushed_gradients[step] == gradient_on(ps.Version(stale ? step - 1 : step), step));
    }
  }
}

TEST_CASE("a streamed push gets each step's gradient last layer first, and nothing else changes") {
  const MlpLayout layout(
      {3, 4, 2});  // fc1.weight [0, 12), fc1.bias [12, 16), fc2.weight [16, 24), fc2.bias [24, 26)
  const LabeledDataset data = SmallDataset();
  std::vector<std::vector<float>> gradients_unstreamed;
  for (int64_t push_bucket_kb : {0, 1024}) {
    VersionedFakePsClient ps(InitializeMlpParameters(layout, 1));
    TrainerOptions options = Options(0, 1);
    options.training.mode = TrainingMode::kSync;
    options.training.push_bucket_kb = push_bucket_kb;
    RunOneWorker(options, layout, data, &ps);
    INFO("push_bucket_kb " << push_bucket_kb);
    CHECK(ps.pulled_steps ==
          std::vector<int64_t>{0});  // every later step's values came with a push
    CHECK(ps.pushed_steps == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
    if (push_bucket_kb == 0) {
      CHECK(ps.ready_froms.empty());
      gradients_unstreamed = ps.pushed_gradients;
      continue;
    }
    // The same gradients, on the same values.
    CHECK(ps.pushed_gradients == gradients_unstreamed);
    REQUIRE(ps.ready_froms.size() == 12);
    for (const std::vector<int64_t>& froms : ps.ready_froms)
      CHECK(froms == std::vector<int64_t>{24, 16, 12, 0});
    CHECK(ps.every_ready_part_unchanged_at_finish);
  }
}

}  // namespace
}  // namespace paramserver
