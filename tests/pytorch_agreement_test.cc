// The system's numbers against PyTorch's: the same model, initial weights, batches and
// Adam settings give the same weights after k steps, to float tolerance. The reference
// is computed by tests/pytorch_reference.py with Debian's python3-torch.
#include "catch2/catch.hpp"
#include "common/mlp_parameters.h"
#include "common/testing/local_cluster.h"
#include "common/testing/temp_dir.h"
#include "tests/cluster_config.h"

namespace paramserver {
namespace {

const MlpLayout kLayout({784, 128, 10});

// Runs PyTorch: writes its initial weights to init and its weights after `steps` sync
// steps of `workers` x batch 32 to reference.
void RunPyTorch(const TempDir& dir, int workers, int steps) {
  absl::StatusOr<ChildProcess> python = ChildProcess::Start(
      {"/usr/bin/python3", RunfilePath("tests/pytorch_reference.py"), "--init", dir.File("init.safetensors"), "--out",
       dir.File("reference.safetensors"), "--workers", std::to_string(workers), "--steps", std::to_string(steps)},
      dir.File("pytorch.log"));
  REQUIRE(python.ok());
  absl::StatusOr<int> code = python->WaitForExit(absl::Now() + absl::Seconds(120));
  INFO(python->ReadLog());
  REQUIRE(code.ok());
  REQUIRE(*code == 0);
}

void CheckAgreement(const std::string& mode, int servers, int workers, int steps) {
  TempDir dir;
  RunPyTorch(dir, workers, steps);
  TestJob job;
  job.mode = mode;
  job.servers = servers;
  job.workers = workers;
  job.max_steps = steps;
  job.shuffle = false;
  job.weights = dir.File("weights.safetensors");
  std::string yaml = TestJobYaml(job);
  const std::string seeded_init = "  init_seed: 1";
  yaml.replace(yaml.find(seeded_init), seeded_init.size(), "  init_from: " + dir.File("init.safetensors"));
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(dir.WriteFile("job.yaml", yaml), dir.path(), servers, workers);
  REQUIRE(cluster.ok());
  absl::Status finished = (*cluster)->WaitForAll(absl::Seconds(120));
  INFO(finished.ToString());
  REQUIRE(finished.ok());

  absl::StatusOr<std::vector<float>> initial = LoadMlpParameters(kLayout, dir.File("init.safetensors"));
  absl::StatusOr<std::vector<float>> ours = LoadMlpParameters(kLayout, job.weights);
  absl::StatusOr<std::vector<float>> theirs = LoadMlpParameters(kLayout, dir.File("reference.safetensors"));
  REQUIRE(initial.ok());
  REQUIRE(ours.ok());
  REQUIRE(theirs.ok());
  double max_difference = 0, max_movement = 0;
  for (size_t i = 0; i < ours->size(); ++i) {
    max_difference = std::max(max_difference, static_cast<double>(std::fabs((*ours)[i] - (*theirs)[i])));
    max_movement = std::max(max_movement, static_cast<double>(std::fabs((*theirs)[i] - (*initial)[i])));
  }
  WARN(mode << " " << servers << "x" << workers << ", " << steps << " steps: max |ours - pytorch| = "
            << max_difference << ", max movement " << max_movement);
  CHECK(max_difference < 1e-6);
  CHECK(max_movement > 1e-3);  // the comparison is not between two unmoved copies
}

TEST_CASE("sync, 2 servers x 2 workers: the weights after 10 steps equal PyTorch's") {
  CheckAgreement("sync", 2, 2, 10);
}

TEST_CASE("async, 1 server x 1 worker: the weights after 10 steps equal PyTorch's") {
  CheckAgreement("async", 1, 1, 10);
}

}  // namespace
}  // namespace paramserver
