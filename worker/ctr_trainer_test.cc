#include "worker/ctr_trainer.h"

#include <cmath>
#include <deque>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"

namespace paramserver {
namespace {

using Ids = std::vector<std::vector<int64_t>>;
using Rows = std::vector<std::vector<float>>;

constexpr int kDim = 2;

// Records every call as a line; serves rows whose values name the row: (step, id).
class RecordingRowsClient final : public PsClient {
 public:
  absl::Status Pull(const StepPull& pull) override {
    if (pull.into.ids.empty()) return absl::InternalError("a ctr trainer pulls with rows");
    calls.push_back(absl::StrCat("pull ", pull.step));
    Fill(pull.step, pull.into);
    return absl::OkStatus();
  }
  absl::StatusOr<bool> Push(const StepPush& push) override {
    if (push.ids.empty()) return absl::InternalError("a ctr trainer pushes with rows");
    calls.push_back(push.next.has_value()
                        ? absl::StrCat("push ", push.step, " and pull ", push.step + 1)
                        : absl::StrCat("push ", push.step));
    const absl::Status pushed =
        Record(push.step, push.gradient, Ids(push.ids.begin(), push.ids.end()),
               Rows(push.row_gradients.begin(), push.row_gradients.end()));
    if (!pushed.ok()) return pushed;
    if (!push.next.has_value()) return false;
    Fill(push.step + 1, *push.next);
    return true;
  }
  absl::StatusOr<ShardMapUpdate> RefreshShardMap() override {
    calls.push_back("refresh");
    if (updates.empty()) return ShardMapUpdate{};
    ShardMapUpdate update = updates.front();
    updates.pop_front();
    return update;
  }
  absl::StatusOr<int64_t> StartStep() override { return 0; }

  // The MLP all `step`, each row named by (step, id).
  static void Fill(int64_t step, const StepValues& into) {
    std::fill(into.params.begin(), into.params.end(), static_cast<float>(step));
    Rows rows = RowsFor(step, Ids(into.ids.begin(), into.ids.end()));
    std::move(rows.begin(), rows.end(), into.rows.begin());
  }

  static Rows RowsFor(int64_t step, const Ids& ids) {
    Rows rows(ids.size());
    for (size_t t = 0; t < ids.size(); ++t) {
      for (int64_t id : ids[t]) rows[t].insert(rows[t].end(), kDim, step * 100.0f + id);
    }
    return rows;
  }

  std::vector<std::string> calls;
  std::vector<Ids> pushed_ids;             // per push, in order
  std::vector<float> pushed_first_values;  // each push's dense_gradient[0]
  std::deque<ShardMapUpdate> updates;
  int64_t fail_push_at = -1;  // once

 private:
  absl::Status Record(int64_t step, absl::Span<const float> gradient, const Ids& ids,
                      const Rows& row_gradients) {
    if (step == fail_push_at) {
      fail_push_at = -1;
      return absl::UnavailableError("the server is gone");
    }
    for (size_t t = 0; t < ids.size(); ++t)
      REQUIRE(row_gradients[t].size() == ids[t].size() * kDim);
    pushed_ids.push_back(ids);
    pushed_first_values.push_back(gradient.empty() ? NAN : gradient[0]);
    return absl::OkStatus();
  }
};

// A compute that checks what it is given and makes a gradient saying which MLP and
// rows it saw: dense_gradient[i] = the MLP's value + 1000 x the number of computes.
class CheckingCompute final : public CtrCompute {
 public:
  std::string name() const override { return "checking"; }
  absl::StatusOr<CtrStepResult> Step(absl::Span<const float> mlp, const CtrBatchView& batch,
                                     const BatchRows& rows, const Rows& pulled,
                                     bool /*backward*/) override {
    ++computes;
    // The rows handed over are those of the batch's ids, as the client served them for
    // the step the MLP is of.
    const int64_t step = static_cast<int64_t>(mlp[0]);
    REQUIRE(pulled == RecordingRowsClient::RowsFor(step, rows.unique_ids));
    seen_first_dense.push_back(batch.dense[0]);
    CtrStepResult result;
    result.loss = losses.empty() ? 0.25 : losses.front();
    if (!losses.empty()) losses.pop_front();
    result.dense_gradient.assign(mlp.size(), mlp[0] + 1000.0f * computes);
    for (const std::vector<int64_t>& ids : rows.unique_ids)
      result.row_gradients.emplace_back(ids.size() * kDim, 1.0f);
    return result;
  }
  int computes = 0;
  std::vector<float> seen_first_dense;
  std::deque<double> losses;
};

CtrModelShape Shape() { return {/*dense=*/1, /*categorical=*/2, kDim, {1 + 2 * kDim, 1}}; }

// 12 examples: dense value = index; field 0's id = index % 2, field 1's = index % 3.
CtrDataset Data() {
  CtrDataset data;
  data.dense_features = 1;
  data.categorical_features = 2;
  data.example_count = 12;
  for (int i = 0; i < 12; ++i) {
    data.dense.push_back(static_cast<float>(i));
    data.ids.push_back(i % 2);
    data.ids.push_back(i % 3);
    data.labels.push_back(static_cast<float>(i % 2));
  }
  return data;
}

CtrTrainerOptions Options() {
  CtrTrainerOptions options;
  options.training.batch_size = 3;
  options.training.epochs = 1;
  options.training.shuffle = false;
  options.shape = Shape();
  return options;
}

// The unique ids per field of examples [begin, begin + 3), ascending: worked out here.
Ids BatchIds(int begin) {
  std::set<int64_t> first, second;
  for (int i = begin; i < begin + 3; ++i) {
    first.insert(i % 2);
    second.insert(i % 3);
  }
  return {{first.begin(), first.end()}, {second.begin(), second.end()}};
}

TEST_CASE(
    "the ctr trainer pulls once, then each push brings the next batch's MLP and rows, "
    "the epoch's last push alone") {
  const CtrDataset data = Data();
  RecordingRowsClient ps;
  CheckingCompute compute;
  auto trainer = CtrTrainer::Create(Options(), &data, nullptr, &ps, &compute);
  REQUIRE(trainer.ok());
  CHECK((*trainer)->total_steps() == 4);
  const absl::StatusOr<TrainingSummary> summary = (*trainer)->Run();
  REQUIRE(summary.ok());
  CHECK(summary->steps == 4);
  CHECK(summary->samples == 12);
  CHECK(ps.calls == std::vector<std::string>{"pull 0", "push 0 and pull 1", "push 1 and pull 2",
                                             "push 2 and pull 3", "push 3"});
  CHECK(ps.pushed_ids == std::vector<Ids>{BatchIds(0), BatchIds(3), BatchIds(6), BatchIds(9)});
  // Each step computed on the MLP its own step brought (the value is the step).
  CHECK(ps.pushed_first_values == std::vector<float>{1000, 2001, 3002, 4003});
  CHECK(compute.seen_first_dense == std::vector<float>{0, 3, 6, 9});
  CHECK((*trainer)->progress().step() == 4);
}

TEST_CASE(
    "after a failed push the ctr trainer re-sends its last acknowledged push on the new "
    "map, then the failed one as it was, without computing it again") {
  const CtrDataset data = Data();
  RecordingRowsClient ps;
  ps.fail_push_at = 1;
  ps.updates = {ShardMapUpdate{/*epoch_changed=*/true, /*epoch=*/2}};
  CheckingCompute compute;
  auto trainer = CtrTrainer::Create(Options(), &data, nullptr, &ps, &compute);
  REQUIRE(trainer.ok());
  REQUIRE((*trainer)->Run().ok());
  CHECK(ps.calls == std::vector<std::string>{"pull 0", "push 0 and pull 1", "push 1 and pull 2",
                                             "refresh", "push 0", "push 1 and pull 2",
                                             "push 2 and pull 3", "push 3"});
  CHECK(ps.pushed_ids ==
        std::vector<Ids>{BatchIds(0), BatchIds(0), BatchIds(3), BatchIds(6), BatchIds(9)});
  CHECK(ps.pushed_first_values == std::vector<float>{1000, 1000, 2001, 3002, 4003});
  CHECK(compute.computes == 4);
}

TEST_CASE(
    "a ctr trainer whose loss is not finite stops before pushing it, saying what to "
    "lower") {
  const CtrDataset data = Data();
  RecordingRowsClient ps;
  CheckingCompute compute;
  compute.losses = {0.5, std::numeric_limits<double>::infinity()};
  auto trainer = CtrTrainer::Create(Options(), &data, nullptr, &ps, &compute);
  REQUIRE(trainer.ok());
  const absl::Status status = (*trainer)->Run().status();
  CHECK(status.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(status.message()) ==
        "step 1: the loss is inf; lower the learning rates (training.optimizer, "
        "training.embedding_optimizer)");
  CHECK(ps.calls == std::vector<std::string>{"pull 0", "push 0 and pull 1"});
}

TEST_CASE(
    "the ctr trainer refuses data of another width, a batch larger than a worker's part "
    "and evaluation without a test set") {
  const CtrDataset data = Data();
  RecordingRowsClient ps;
  CheckingCompute compute;
  CtrTrainerOptions options = Options();
  options.shape = {2, 2, kDim, {2 + 2 * kDim, 1}};
  CHECK(
      std::string(CtrTrainer::Create(options, &data, nullptr, &ps, &compute).status().message()) ==
      "the data has 1 dense and 2 categorical features per example; the model takes 2 and 2");
  options = Options();
  options.num_workers = 5;
  CHECK(CtrTrainer::Create(options, &data, nullptr, &ps, &compute).status().code() ==
        absl::StatusCode::kInvalidArgument);
  options = Options();
  options.evaluate_each_epoch = true;
  CHECK(
      std::string(CtrTrainer::Create(options, &data, nullptr, &ps, &compute).status().message()) ==
      "evaluation needs a test set");
}

}  // namespace
}  // namespace paramserver
