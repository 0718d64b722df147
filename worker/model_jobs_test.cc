// The three jobs a worker trains (MlpJob, CtrJob, ScriptJob) against a fake PS client
// serving fixed values: each loads its data, names its servers' model, trains, evaluates
// the final weights and writes them, and refuses what it must.
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "catch2/catch.hpp"
#include "common/checkpoint/safetensors.h"
#include "common/config/cluster_spec.h"
#include "common/model/model_layout.h"
#include "common/testing/temp_dir.h"
#include "worker/cpu_backend.h"
#include "worker/ctr_job.h"
#include "worker/mlp_job.h"
#include "worker/script_job.h"

namespace paramserver {
namespace {

// Serves `params` for every pull (and zero rows for every row pull); takes every push.
class FixedValuesClient final : public PsClient {
 public:
  explicit FixedValuesClient(std::vector<float> params) : params_(std::move(params)) {}
  absl::Status Pull(const StepPull& pull) override {
    const StepValues& into = pull.into;
    if (into.params.size() != params_.size()) return absl::InternalError("wrong size");
    std::copy(params_.begin(), params_.end(), into.params.begin());
    for (size_t t = 0; t < into.ids.size(); ++t) {
      into.rows[t].assign(into.ids[t].size() * row_dim, 0.0f);
    }
    return absl::OkStatus();
  }
  // Brings nothing back: the next step pulls.
  absl::StatusOr<bool> Push(const StepPush&) override {
    ++pushes;
    return false;
  }
  absl::StatusOr<ShardMapUpdate> RefreshShardMap() override { return ShardMapUpdate{}; }
  absl::StatusOr<int64_t> StartStep() override { return 0; }
  int pushes = 0;
  int row_dim = 0;

 private:
  std::vector<float> params_;
};

std::string BigEndian(uint32_t v) {
  return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                     static_cast<char>(v >> 8), static_cast<char>(v)};
}

// IDX files of `n` 2x2 images (pixel values from the index) and labels index % 2.
void WriteIdx(const TempDir& dir, const std::string& prefix, uint32_t n, DataSection* files,
              bool test) {
  std::string pixels, labels;
  for (uint32_t i = 0; i < n; ++i) {
    for (uint32_t p = 0; p < 4; ++p) pixels.push_back(static_cast<char>((i * 37 + p * 91) % 256));
    labels.push_back(static_cast<char>(i % 2));
  }
  const std::string images = dir.WriteFile(
      prefix + "-images", BigEndian(0x803) + BigEndian(n) + BigEndian(2) + BigEndian(2) + pixels);
  const std::string label_file =
      dir.WriteFile(prefix + "-labels", BigEndian(0x801) + BigEndian(n) + labels);
  (test ? files->test_images : files->train_images) = images;
  (test ? files->test_labels : files->train_labels) = label_file;
}

ClusterSpec MlpSpec() {
  ClusterSpec spec;
  spec.model.type = ModelType::kMlp;
  spec.model.layers = {4, 3, 2};
  spec.training.batch_size = 2;
  spec.training.epochs = 1;
  spec.training.shuffle = false;
  return spec;
}

// The tensor of `tensors` named `name` (a safetensors file keeps them by name).
const NamedTensor& Named(const std::vector<NamedTensor>& tensors, const std::string& name) {
  for (const NamedTensor& tensor : tensors) {
    if (tensor.name == name) return tensor;
  }
  FAIL("no tensor " << name);
  return tensors.front();
}

JobEnvironment EnvironmentFor(PsClient* ps) {
  JobEnvironment environment;
  environment.rank = 0;  // one epoch: no evaluation after it (it is the final one's)
  environment.num_workers = 1;
  environment.ps = ps;
  return environment;
}

TEST_CASE(
    "an mlp job trains on its IDX files, evaluates the servers' weights on the test set "
    "and writes them") {
  TempDir dir;
  DataSection files;
  WriteIdx(dir, "train", 8, &files, /*test=*/false);
  WriteIdx(dir, "test", 6, &files, /*test=*/true);
  MlpJob job(MlpSpec());
  const MlpLayout layout({4, 3, 2});
  CHECK(job.figure() == EvaluationFigure::kAccuracy);
  CHECK(job.server_model().dense_parameters == layout.total_parameters());
  CHECK(job.server_model().embedding_dims.empty());
  REQUIRE(job.LoadTrainingData(files, "cpu").ok());
  CHECK(job.EvaluateFinal(4).status().code() == absl::StatusCode::kFailedPrecondition);
  REQUIRE(job.LoadTestSet(files).ok());
  const std::vector<float> served = InitializeMlpParameters(layout, 7);
  FixedValuesClient ps(served);
  REQUIRE(job.CreateLoop(EnvironmentFor(&ps)).ok());
  REQUIRE(job.loop() != nullptr);
  const absl::StatusOr<TrainingSummary> trained = job.loop()->Run();
  REQUIRE(trained.ok());
  CHECK(trained->steps == 4);  // 8 examples, batch 2
  CHECK(ps.pushes == 4);
  CHECK(job.WriteFinalWeights(4, dir.File("early.safetensors")).code() ==
        absl::StatusCode::kFailedPrecondition);

  const absl::StatusOr<FinalEvaluation> evaluated = job.EvaluateFinal(4);
  REQUIRE(evaluated.ok());
  // The reference: the served weights scored on the test set by a backend of our own.
  const absl::StatusOr<LabeledDataset> test =
      LoadIdxDataset(files.test_images, files.test_labels, 4, 2);
  REQUIRE(test.ok());
  CpuBackend reference(layout, 1);
  const int64_t correct =
      reference.CountCorrect(served, {test->features.data(), test->labels.data(), 6}).value();
  CHECK(evaluated->result.test_accuracy() == static_cast<double>(correct) / 6);
  CHECK(evaluated->summary_line ==
        absl::StrFormat("test_accuracy=%.4f", static_cast<double>(correct) / 6));
  CHECK(evaluated->scalars.size() == 1);

  const std::string path = dir.File("final.safetensors");
  REQUIRE(job.WriteFinalWeights(4, path).ok());
  CHECK(LoadDenseParameters(layout.model(), path).value() == served);
}

TEST_CASE("an mlp job names the file it cannot read, and the batch too large for its part") {
  TempDir dir;
  DataSection files;
  WriteIdx(dir, "train", 8, &files, false);
  files.train_labels = dir.File("no-such-labels");
  MlpJob job(MlpSpec());
  const absl::Status missing = job.LoadTrainingData(files, "cpu");
  CHECK(!missing.ok());
  CHECK(std::string(missing.message()).find("no-such-labels") != std::string::npos);

  WriteIdx(dir, "train", 8, &files, false);
  ClusterSpec spec = MlpSpec();
  spec.training.batch_size = 9;
  MlpJob too_big(spec);
  REQUIRE(too_big.LoadTrainingData(files, "cpu").ok());
  FixedValuesClient ps(std::vector<float>(MlpLayout({4, 3, 2}).total_parameters()));
  CHECK(too_big.CreateLoop(EnvironmentFor(&ps)).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE(
    "a ctr job trains on its Criteo file and, with every weight zero, scores AUC 0.5 and "
    "log loss ln 2; its weights file holds the MLP and the tables") {
  TempDir dir;
  std::string lines;
  for (int i = 0; i < 8; ++i)
    lines += std::to_string(i % 2) + "\t" + std::to_string(i) + "\ta" + std::to_string(i % 3) +
             "\tb" + std::to_string(i % 4) + "\n";
  DataSection files;
  files.format = DataFormat::kCriteo;
  files.train = {dir.WriteFile("train.tsv", lines)};
  files.test = {dir.WriteFile("test.tsv", lines)};
  ClusterSpec spec = MlpSpec();
  spec.model.type = ModelType::kCtr;
  spec.model.dense_features = 1;
  spec.model.categorical_features = 2;
  spec.model.embedding_dim = 2;
  spec.model.layers = {1 + 2 * 2, 3, 1};
  CtrJob job(spec);
  CHECK(job.figure() == EvaluationFigure::kAuc);
  const ServerModel model = job.server_model();
  CHECK(model.dense_parameters == MlpLayout({5, 3, 1}).total_parameters());
  CHECK(model.embedding_dims == std::vector<int>{2, 2});
  REQUIRE(job.LoadTrainingData(files, "cpu").ok());
  REQUIRE(job.LoadTestSet(files).ok());
  FixedValuesClient ps(std::vector<float>(model.dense_parameters, 0.0f));
  ps.row_dim = 2;
  JobEnvironment environment = EnvironmentFor(&ps);
  std::vector<TableRows> tables(2);
  tables[0].ids = {1, 2};
  tables[0].rows = {0.5f, 0.25f, -1, 2};
  tables[1].ids = {7};
  tables[1].rows = {3, 4};
  environment.export_tables = [&](int64_t) -> absl::StatusOr<std::vector<TableRows>> {
    return tables;
  };
  REQUIRE(job.CreateLoop(environment).ok());
  REQUIRE(job.loop()->Run().ok());
  CHECK(ps.pushes == 4);
  const absl::StatusOr<FinalEvaluation> evaluated = job.EvaluateFinal(4);
  REQUIRE(evaluated.ok());
  CHECK(evaluated->result.ctr());
  CHECK(evaluated->result.test_auc() == 0.5);
  CHECK(std::abs(evaluated->result.test_logloss() - std::log(2.0)) < 1e-6);
  const std::string path = dir.File("final.safetensors");
  REQUIRE(job.WriteFinalWeights(4, path).ok());
  const absl::StatusOr<std::vector<NamedTensor>> written = ReadSafetensorsFile(path);
  REQUIRE(written.ok());
  // The MLP's 4 tensors, then each table's ids and rows.
  REQUIRE(written->size() == 4 + 2 * 2);
  CHECK(Named(*written, "C1.ids").int_values == std::vector<int64_t>{1, 2});
  CHECK(Named(*written, "C1.weight").values == std::vector<float>{0.5f, 0.25f, -1, 2});
  CHECK(Named(*written, "C2.weight").values == std::vector<float>{3, 4});
}

TEST_CASE(
    "a script job checks the declaration, reports the script's accuracy (or none) and "
    "writes the declared tensors and tables") {
  ClusterSpec spec = MlpSpec();
  spec.model.type = ModelType::kTorch;
  ScriptJob job(spec);
  const ModelLayout layout =
      ModelLayout::Create({{"fc.weight", {2, 3}}, {"fc.bias", {2}}}, {{"emb", 4}}).value();
  const std::vector<float> initial(8, 0.5f);
  CHECK(job.Declare(layout, std::vector<float>(7)).code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(job.Declare(layout, initial).ok());
  CHECK(job.server_model().dense_parameters == 8);
  CHECK(job.server_model().embedding_dims == std::vector<int>{4});
  CHECK(job.figure() == EvaluationFigure::kNone);
  REQUIRE(job.LoadTrainingData({}, "cpu").ok());  // the script has the data

  std::vector<float> served = {1, 2, 3, 4, 5, 6, 7, 8};
  FixedValuesClient ps(served);
  JobEnvironment environment = EnvironmentFor(&ps);
  environment.export_tables = [](int64_t) -> absl::StatusOr<std::vector<TableRows>> {
    std::vector<TableRows> tables(1);
    tables[0].ids = {3};
    tables[0].rows = {1, 2, 3, 4};
    return tables;
  };
  REQUIRE(job.CreateLoop(environment).ok());
  REQUIRE(job.script() != nullptr);
  CHECK(job.Declare(layout, initial).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(job.EvaluateFinal(0).value().summary_line ==
        "(no test accuracy: the script reported none)");
  CHECK(job.EvaluateFinal(0).value().result.no_test_accuracy());
  job.script()->EndTraining(0.75);
  CHECK(job.EvaluateFinal(0).value().summary_line == "test_accuracy=0.7500");

  TempDir dir;
  const std::string path = dir.File("final.safetensors");
  REQUIRE(job.WriteFinalWeights(0, path).ok());
  CHECK(LoadDenseParameters(layout, path).value() == served);
  const std::vector<NamedTensor> written = ReadSafetensorsFile(path).value();
  REQUIRE(written.size() == 4);
  CHECK(Named(written, "emb.ids").int_values == std::vector<int64_t>{3});
  CHECK(Named(written, "emb.weight").values == std::vector<float>{1, 2, 3, 4});
}

}  // namespace
}  // namespace paramserver
