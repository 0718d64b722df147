// The system's numbers against PyTorch's: the same model, initial weights, batches and
// optimizer (every type the servers offer, from the spec) give the same weights after k
// steps, to float tolerance (derived in CheckAgreement). The reference is computed by
// tests/pytorch_reference.py with Debian's python3-torch, in float32 and in float64.
#include <cmath>
#include <fstream>
#include <string>

#include "catch2/catch.hpp"
#include "common/model/mlp_parameters.h"
#include "common/testing/local_cluster.h"
#include "common/testing/temp_dir.h"
#include "tests/cluster_config.h"

namespace paramserver {
namespace {

const MlpLayout kLayout({784, 128, 10});

// One optimizer, as the spec and as torch.optim name it.
struct Recipe {
  std::string spec;                      // training.optimizer
  std::string torch;                     // pytorch_reference.py --optimizer
  std::string schedule = "";             // pytorch_reference.py --schedule (the spec's in `spec`)
  std::vector<std::string> groups = {};  // pytorch_reference.py --group, each
  double clip = 0;                       // pytorch_reference.py --clip (the spec's in `spec`)
};

const Recipe kAdam = {
    "{type: adam, learning_rate: 0.001, beta1: 0.9, beta2: 0.999, epsilon: 1.0e-7}",
    "Adam lr=0.001 beta1=0.9 beta2=0.999 eps=1e-7"};

// Runs PyTorch: writes its initial weights to init, its weights after `steps` sync steps
// of `workers` x batch 32 to reference, and the path length of its weights.
void RunPyTorch(const TempDir& dir, int workers, int steps, const Recipe& recipe) {
  std::vector<std::string> arguments = {"/usr/bin/python3",
                                        RunfilePath("tests/pytorch_reference.py"),
                                        "--init",
                                        dir.File("init.safetensors"),
                                        "--out",
                                        dir.File("reference.safetensors"),
                                        "--exact",
                                        dir.File("exact.safetensors"),
                                        "--workers",
                                        std::to_string(workers),
                                        "--steps",
                                        std::to_string(steps),
                                        "--optimizer",
                                        recipe.torch,
                                        "--path-length",
                                        dir.File("path_length.txt"),
                                        "--schedule",
                                        recipe.schedule,
                                        "--clip",
                                        std::to_string(recipe.clip),
                                        "--norms",
                                        dir.File("norms.txt")};
  for (const std::string& group : recipe.groups) {
    arguments.push_back("--group");
    arguments.push_back(group);
  }
  absl::StatusOr<ChildProcess> python = ChildProcess::Start(arguments, dir.File("pytorch.log"));
  REQUIRE(python.ok());
  absl::StatusOr<int> code = python->WaitForExit(absl::Now() + absl::Seconds(120));
  INFO(python->ReadLog());
  REQUIRE(code.ok());
  REQUIRE(*code == 0);
}

void CheckAgreement(const std::string& mode, int servers, int workers, int steps,
                    const Recipe& recipe = kAdam) {
  INFO(recipe.spec);
  TempDir dir;
  RunPyTorch(dir, workers, steps, recipe);
  TestJob job;
  job.optimizer = recipe.spec;
  job.mode = mode;
  job.servers = servers;
  job.workers = workers;
  job.max_steps = steps;
  job.shuffle = false;
  job.weights = dir.File("weights.safetensors");
  std::string yaml = TestJobYaml(job);
  const std::string seeded_init = "  init_seed: 1";
  yaml.replace(yaml.find(seeded_init), seeded_init.size(),
               "  init_from: " + dir.File("init.safetensors"));
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(dir.WriteFile("job.yaml", yaml), dir.path(), servers, workers);
  REQUIRE(cluster.ok());
  absl::Status finished = (*cluster)->WaitForAll(absl::Seconds(120));
  INFO(finished.ToString());
  REQUIRE(finished.ok());

  absl::StatusOr<std::vector<float>> initial =
      LoadDenseParameters(kLayout.model(), dir.File("init.safetensors"));
  absl::StatusOr<std::vector<float>> ours = LoadDenseParameters(kLayout.model(), job.weights);
  absl::StatusOr<std::vector<float>> theirs =
      LoadDenseParameters(kLayout.model(), dir.File("reference.safetensors"));
  absl::StatusOr<std::vector<float>> exact =
      LoadDenseParameters(kLayout.model(), dir.File("exact.safetensors"));
  REQUIRE(initial.ok());
  REQUIRE(ours.ok());
  REQUIRE(theirs.ok());
  REQUIRE(exact.ok());
  double max_difference = 0, max_movement = 0, ours_vs_exact = 0, theirs_vs_exact = 0;
  for (size_t i = 0; i < ours->size(); ++i) {
    max_difference =
        std::max(max_difference, static_cast<double>(std::fabs((*ours)[i] - (*theirs)[i])));
    max_movement =
        std::max(max_movement, static_cast<double>(std::fabs((*theirs)[i] - (*initial)[i])));
    ours_vs_exact =
        std::max(ours_vs_exact, static_cast<double>(std::fabs((*ours)[i] - (*exact)[i])));
    theirs_vs_exact =
        std::max(theirs_vs_exact, static_cast<double>(std::fabs((*theirs)[i] - (*exact)[i])));
  }
  WARN(recipe.torch << ", " << mode << " " << servers << "x" << workers << ", " << steps
                    << " steps: max |ours - pytorch| = " << max_difference << ", max movement "
                    << max_movement << "; from float64: ours " << ours_vs_exact << ", pytorch "
                    << theirs_vs_exact);
  // The tolerance, from the arithmetic. Both runs are float32 and each strays from the
  // exact (float64) trajectory by rounding, amplified by how the problem is conditioned
  // (Adam divides by sqrt(v): a gradient component that is a small difference of large
  // terms carries a large relative error into its step). PyTorch's own distance from
  // float64 measures that amplification on these very weights and batches. Ours sums in
  // another order (its own GEMM blocking, with or without AVX2 on CI's CPU), so it may
  // stray a few times as far: 4x PyTorch's distance, plus the worst-case rounding bound of
  // the steps themselves: each step's change of a weight is computed to within 2 gamma_n
  // of itself, where gamma_n = n u / (1 - n u) for u = 2^-24 and n = 784 + batch x workers
  // (the longest sums a gradient passes through: the input layer's dot products and the
  // sum over the batch); over the run, 2 gamma_n times the path length, the sum over
  // steps of the largest change (Adam's is about k steps x lr).
  const double u = std::ldexp(1.0, -24);
  const double n = 784 + 32 * workers;
  double path_length = 0;
  {
    std::ifstream in(dir.File("path_length.txt"));
    REQUIRE(in >> path_length);
  }
  const double rounding = path_length * 2 * (n * u / (1 - n * u));
  const double ours_allowed = 4 * theirs_vs_exact + rounding;
  INFO("allowed from float64: " << ours_allowed);
  CHECK(ours_vs_exact <= ours_allowed);
  // And so, by the triangle inequality, from PyTorch's own float32 run:
  CHECK(max_difference <= ours_allowed + theirs_vs_exact);
  CHECK(max_movement > 1e-3);  // the comparison is not between two unmoved copies
  if (recipe.clip > 0) {
    // Both kinds of step were taken: some whose norm was over the bound (clipped), and
    // some under it.
    std::ifstream norms(dir.File("norms.txt"));
    int clipped = 0, unclipped = 0;
    for (double norm; norms >> norm;) ++(norm > recipe.clip ? clipped : unclipped);
    WARN("steps clipped: " << clipped << " of " << clipped + unclipped);
    CHECK(clipped + unclipped == steps);
    CHECK(clipped > 0);
    CHECK(unclipped > 0);
  }
}

TEST_CASE("sync, 2 servers x 2 workers: the weights after 10 steps equal PyTorch's") {
  CheckAgreement("sync", 2, 2, 10);
}

TEST_CASE("async, 1 server x 1 worker: the weights after 10 steps equal PyTorch's") {
  CheckAgreement("async", 1, 1, 10);
}

// Each type with its flags on, over 2 servers x 2 workers; and each plain, over 1 x 1.
// (tests/dense_optimizer_agreement_test covers every flag on its own, against torch.optim
// on the same gradients.)
const Recipe kSgdMomentum = {
    "{type: sgd, learning_rate: 0.05, momentum: 0.9, nesterov: true, weight_decay: 0.01}",
    "SGD lr=0.05 momentum=0.9 nesterov=True weight_decay=0.01"};
const Recipe kAdamW = {"{type: adamw, learning_rate: 0.001, weight_decay: 0.1}",
                       "AdamW lr=0.001 weight_decay=0.1"};

TEST_CASE("sync, 2 x 2: SGD, Adam, AdamW, Adagrad and RMSprop with their flags equal torch's") {
  static const Recipe* const kRecipes[] = {
      &kSgdMomentum,
      new Recipe{"{type: adam, learning_rate: 0.001, weight_decay: 0.01, amsgrad: true}",
                 "Adam lr=0.001 weight_decay=0.01 amsgrad=True"},
      &kAdamW,
      new Recipe{"{type: adagrad, learning_rate: 0.01, lr_decay: 0.01, weight_decay: 0.01, "
                 "initial_accumulator_value: 0.1}",
                 "Adagrad lr=0.01 lr_decay=0.01 weight_decay=0.01 initial_accumulator_value=0.1"},
      new Recipe{"{type: rmsprop, learning_rate: 0.0005, momentum: 0.5, centered: true, "
                 "weight_decay: 0.01}",
                 "RMSprop lr=0.0005 momentum=0.5 centered=True weight_decay=0.01"}};
  CheckAgreement("sync", 2, 2, 10, *kRecipes[GENERATE(range(0, 5))]);
}

TEST_CASE("sync, 2 x 2: a spec's warm-up and decay equal torch's lr_scheduler stepped each step") {
  static const Recipe kRecipes[] = {
      {"{type: sgd, learning_rate: 0.05, momentum: 0.9, lr_schedule: {warmup_steps: 3, "
       "warmup_start_factor: 0.2, decay: cosine, total_steps: 10, min_learning_rate: 0.005}}",
       "SGD lr=0.05 momentum=0.9",
       "warmup_steps=3 warmup_start_factor=0.2 decay=cosine total_steps=10 "
       "min_learning_rate=0.005"},
      {"{type: adamw, learning_rate: 0.002, lr_schedule: {decay: multistep, milestones: [3, 6], "
       "gamma: 0.5}}",
       "AdamW lr=0.002", "decay=multistep milestones=3,6 gamma=0.5"}};
  CheckAgreement("sync", 2, 2, 10, kRecipes[GENERATE(range(0, 2))]);
}

TEST_CASE("sync, 2 x 2: parameter groups equal torch's param_groups") {
  // Biases without weight decay or momentum (so without a momentum buffer, beside
  // tensors with one), fc2.weight at its own rate; shards cut across the groups.
  const Recipe recipe{
      "{type: sgd, learning_rate: 0.05, momentum: 0.9, weight_decay: 0.01, groups: [{params: "
      "['*.bias'], weight_decay: 0.0, momentum: 0.0}, {params: [fc2.weight], learning_rate: "
      "0.2}]}",
      "SGD lr=0.05 momentum=0.9 weight_decay=0.01",
      "",
      {"*.bias weight_decay=0.0 momentum=0.0", "fc2.weight lr=0.2"}};
  CheckAgreement("sync", 2, 2, 10, recipe);
}

TEST_CASE("sync, 1 x 1: each optimizer with torch's defaults equals torch's") {
  static const Recipe kRecipes[] = {
      {"{type: sgd, learning_rate: 0.05}", "SGD lr=0.05"},
      {"{type: adam}", "Adam"},
      {"{type: adamw}", "AdamW"},
      {"{type: adagrad}", "Adagrad"},
      {"{type: rmsprop, learning_rate: 0.0005}", "RMSprop lr=0.0005"}};
  CheckAgreement("sync", 1, 1, 10, kRecipes[GENERATE(range(0, 5))]);
}

TEST_CASE("async, 1 x 1: SGD with momentum and AdamW, each push one update, equal torch's") {
  CheckAgreement("async", 1, 1, 10, GENERATE(range(0, 2)) == 0 ? kSgdMomentum : kAdamW);
}

TEST_CASE("sync, 2 x 2: training.optimizer.clip_grad_norm equals clip_grad_norm_ after averaging") {
  // The mean gradient's norm runs 0.88 to 1.8 over these steps: 1.0 clips about half.
  Recipe recipe = kSgdMomentum;
  recipe.spec.insert(1, "clip_grad_norm: 1.0, ");
  recipe.clip = 1.0;
  CheckAgreement("sync", 2, 2, 10, recipe);
}

TEST_CASE("async, 1 x 1: training.optimizer.clip_grad_norm clips each push as torch clips") {
  // The gradient's norm runs 1.2 to 1.8 over these steps: 1.4 clips about half.
  Recipe recipe = kAdamW;
  recipe.spec.insert(1, "clip_grad_norm: 1.4, ");
  recipe.clip = 1.4;
  CheckAgreement("async", 1, 1, 10, recipe);
}

}  // namespace
}  // namespace paramserver
