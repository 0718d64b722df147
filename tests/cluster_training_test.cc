// Whole clusters of real processes on 127.0.0.1 training the reference MLP on the real
// Fashion-MNIST: they finish, learn, are deterministic, and compute what one process would.
#include <filesystem>

#include "catch2/catch.hpp"
#include "common/model/mlp_parameters.h"
#include "common/testing/local_cluster.h"
#include "common/testing/temp_dir.h"
#include "ps/dense_optimizer.h"
#include "tests/cluster_config.h"
#include "worker/cpu_backend.h"
#include "worker/idx_dataset.h"

namespace paramserver {
namespace {

const char kImages[] = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";
const char kLabels[] = "/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz";

const LabeledDataset& TrainingSet() {
  static const LabeledDataset* data = [] {
    absl::StatusOr<LabeledDataset> loaded = LoadIdxDataset(kImages, kLabels, 784, 10);
    REQUIRE(loaded.ok());
    return new LabeledDataset(*std::move(loaded));
  }();
  return *data;
}

// Runs `job` to completion and returns its final weights.
std::vector<float> RunJob(TestJob job, const TempDir& dir, double* accuracy = nullptr) {
  job.weights = dir.File("weights.safetensors");
  const std::string config = dir.WriteFile("job.yaml", TestJobYaml(job));
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(config, dir.path(), job.servers, job.workers);
  REQUIRE(cluster.ok());
  absl::Status finished = (*cluster)->WaitForAll(absl::Seconds(120));
  INFO(finished.ToString());
  REQUIRE(finished.ok());
  if (accuracy != nullptr) *accuracy = (*cluster)->FinalValue("test_accuracy");
  // Every node heard that the job finished (the servers in a heartbeat answer, the worker
  // that waited for the result in its view), so the scheduler ended at once instead of
  // waiting out the failure timeout for word that never comes.
  CHECK((*cluster)->scheduler().ReadLog().find("job finished; every node has been told to stop") !=
        std::string::npos);
  absl::StatusOr<std::vector<float>> weights =
      LoadDenseParameters(MlpLayout({784, 128, 10}).model(), job.weights);
  REQUIRE(weights.ok());
  return *weights;
}

double LossOnFirstExamples(const std::vector<float>& params, int64_t count) {
  const MlpLayout layout({784, 128, 10});
  CpuBackend backend(layout, 1);
  std::vector<float> gradient(params.size());
  absl::StatusOr<float> loss = backend.ComputeGradients(
      params, {TrainingSet().features.data(), TrainingSet().labels.data(), count},
      absl::MakeSpan(gradient));
  REQUIRE(loss.ok());
  return *loss;
}

void CheckLearns(const TestJob& job, double min_accuracy) {
  TempDir dir;
  double accuracy = 0;
  std::vector<float> trained = RunJob(job, dir, &accuracy);
  const double initial_loss =
      LossOnFirstExamples(InitializeMlpParameters(MlpLayout({784, 128, 10}), 1), 2000);
  const double final_loss = LossOnFirstExamples(trained, 2000);
  INFO("mode " << job.mode << ": loss " << initial_loss << " -> " << final_loss << ", accuracy "
               << accuracy);
  CHECK(final_loss < 0.35 * initial_loss);
  CHECK(accuracy >= min_accuracy);
}

TEST_CASE("sync training on 2 servers x 2 workers: loss falls and accuracy clears 0.75") {
  CheckLearns(TestJob{}, 0.75);
}

TEST_CASE(
    "workers write their curves as TensorBoard event files that an independent reader accepts") {
  TempDir dir;
  TestJob job;
  job.tensorboard_dir = dir.File("tensorboard");
  double accuracy = 0;
  RunJob(job, dir, &accuracy);
  for (const char* worker : {"worker-0", "worker-1"}) {
    const std::string folder = job.tensorboard_dir + "/" + worker;
    std::vector<std::string> files;
    for (const auto& entry : std::filesystem::directory_iterator(folder))
      files.push_back(entry.path());
    REQUIRE(files.size() == 1);
    CHECK(files[0].find(folder + "/events.out.tfevents.") == 0);
    const std::string out = dir.File(std::string(worker) + ".events.txt");
    const std::string command = "/usr/bin/python3 '" +
                                RunfilePath("worker/tensorboard_reference.py") + "' '" + files[0] +
                                "' > '" + out + "' 2>&1";
    CHECK(std::system(command.c_str()) == 0);
    const std::string events = ReadFileOrEmpty(out);
    INFO(events);
    CHECK(events.rfind("version brain.Event:2\n", 0) == 0);
    CHECK(events.find("\nscalar loss 300 ") != std::string::npos);  // the last step's progress line
    CHECK(events.find("\nscalar samples_per_sec 300 ") != std::string::npos);
    if (std::string(worker) == "worker-0") {
      char expected[64];  // accuracy is k / 10000 test examples: 4 decimals are exact
      std::snprintf(expected, sizeof(expected), "\nscalar test_accuracy 300 %.4g", accuracy);
      CHECK(events.find(expected) != std::string::npos);
    }
  }
}

TEST_CASE("async training on 2 servers x 2 workers: loss falls and accuracy clears 0.75") {
  TestJob job;
  job.mode = "async";
  CheckLearns(job, 0.75);
}

TEST_CASE("ssp training on 2 servers x 2 workers: loss falls and accuracy clears 0.75") {
  TestJob job;
  job.mode = "ssp";
  job.staleness = 2;
  CheckLearns(job, 0.75);
}

TEST_CASE(
    "sync with shuffle off is deterministic: runs give bit-identical weights, however the push is "
    "cut") {
  TestJob job;
  job.max_steps = 60;
  job.shuffle = false;
  TempDir first_dir, second_dir, streamed_dir;
  job.push_bucket_kb = 0;  // the whole gradient after backpropagation
  const std::vector<float> first = RunJob(job, first_dir);
  RunJob(job, second_dir);
  const std::string first_file = ReadFileOrEmpty(first_dir.File("weights.safetensors"));
  CHECK(first_file.size() > first.size() * sizeof(float));
  CHECK(first_file == ReadFileOrEmpty(second_dir.File("weights.safetensors")));
  // 16 KiB buckets: each ~50 KB shard leaves as soon as backpropagation finished it,
  // while the rows below are still computed.
  job.push_bucket_kb = 16;
  RunJob(job, streamed_dir);
  CHECK(first_file == ReadFileOrEmpty(streamed_dir.File("weights.safetensors")));
}

TEST_CASE("a sync step equals one process training on the workers' batches together") {
  TestJob job;
  job.max_steps = 3;
  job.shuffle = false;
  job.shards = 5;
  TempDir dir;
  const std::vector<float> distributed = RunJob(job, dir);

  // One process: worker r's step-s batch is examples r*30000 + 32s .. +32 (shuffle off).
  const MlpLayout layout({784, 128, 10});
  std::vector<float> params = InitializeMlpParameters(layout, 1);
  CpuBackend backend(layout, 1);
  DenseOptimizerOptions adam_options;  // TestJobYaml's: torch's defaults but eps 1e-7
  adam_options.epsilon = 1.0e-7;
  DenseOptimizer adam(adam_options, layout.total_parameters());
  const LabeledDataset& data = TrainingSet();
  std::vector<float> features, gradient(params.size());
  std::vector<uint8_t> labels;
  for (int step = 0; step < 3; ++step) {
    features.clear();
    labels.clear();
    for (int worker = 0; worker < 2; ++worker) {
      const int64_t first = worker * 30000 + step * 32;
      features.insert(features.end(), data.features.begin() + first * 784,
                      data.features.begin() + (first + 32) * 784);
      labels.insert(labels.end(), data.labels.begin() + first, data.labels.begin() + first + 32);
    }
    REQUIRE(backend
                .ComputeGradients(params, {features.data(), labels.data(), 64},
                                  absl::MakeSpan(gradient))
                .ok());
    adam.Apply(gradient, absl::MakeSpan(params));
  }
  REQUIRE(distributed.size() == params.size());
  double max_difference = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    max_difference =
        std::max(max_difference, static_cast<double>(std::fabs(distributed[i] - params[i])));
  }
  // The cluster and this loop compute the same products; only the 64 rows' gradient is
  // summed in another grouping (two workers' 32-row means, averaged by the servers). Per
  // Adam step that moves a weight by at most lr x 2 gamma_n, n = 784 + 64 (an input row,
  // the batch): 1e-4 lr; over 3 steps 3e-7, and components whose gradient is a small
  // difference of large terms carry up to a few times that (tests/pytorch_agreement_test
  // measures this amplification against float64): 1e-6.
  CHECK(max_difference < 1e-6);
  // And it moved: three Adam steps of lr 1e-3 move every weight with a non-zero
  // gradient by ~1e-3 or more (weights of always-black pixels stay).
  const std::vector<float> initial = InitializeMlpParameters(layout, 1);
  size_t moved = 0;
  for (size_t i = 0; i < initial.size(); ++i)
    moved += std::fabs(distributed[i] - initial[i]) > 1e-4;
  CHECK(moved > initial.size() / 2);
}

}  // namespace
}  // namespace paramserver
