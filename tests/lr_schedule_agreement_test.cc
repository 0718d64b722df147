// training.optimizer.lr_schedule against torch.optim.lr_scheduler (Debian's torch 1.13,
// tests/lr_schedule_reference.py): each decay, alone and after a linear warm-up, parsed
// from a spec as a user writes it, gives the rate torch's scheduler gives at every step,
// the scheduler stepped after each optimizer.step() as a script does. And the rates a
// schedule gives the optimizer are the ones its updates use (a cosine SGD run by hand).
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "catch2/catch.hpp"
#include "common/config/cluster_spec.h"
#include "common/testing/local_cluster.h"
#include "common/testing/temp_dir.h"
#include "ps/dense_optimizer.h"
#include "ps/learning_rate_schedule.h"

namespace paramserver {
namespace {

constexpr double kBaseRate = 0.1;
constexpr int kSteps = 60;

// Each case as tests/torch_schedules.py reads it; the spec's YAML is made from it.
const std::vector<std::pair<std::string, std::string>>& Cases() {
  static const auto* cases = new std::vector<std::pair<std::string, std::string>>{
      {"constant", "decay=constant"},
      {"step", "decay=step step_size=7 gamma=0.5"},
      {"multistep", "decay=multistep milestones=10,25,40 gamma=0.3"},
      {"exponential", "decay=exponential gamma=0.95"},
      {"cosine", "decay=cosine total_steps=50 min_learning_rate=0.001"},
      {"linear", "decay=linear total_steps=45 end_factor=0.1"},
      {"polynomial", "decay=polynomial total_steps=55 power=2.0"},
      {"warmup_constant", "warmup_steps=8 warmup_start_factor=0.125 decay=constant"},
      {"warmup_step", "warmup_steps=5 decay=step step_size=10 gamma=0.5"},
      {"warmup_multistep", "warmup_steps=5 decay=multistep milestones=10,20 gamma=0.1"},
      {"warmup_exponential", "warmup_steps=4 warmup_start_factor=0.5 decay=exponential gamma=0.9"},
      {"warmup_cosine",
       "warmup_steps=10 warmup_start_factor=0.01 decay=cosine total_steps=50 "
       "min_learning_rate=0.002"},
      {"warmup_linear", "warmup_steps=6 decay=linear total_steps=50 end_factor=0.0"},
      {"warmup_polynomial", "warmup_steps=6 decay=polynomial total_steps=58 power=0.5"},
  };
  return *cases;
}

// "a=1 milestones=2,3" -> "{a: 1, milestones: [2,3]}".
std::string YamlOf(const std::string& description) {
  std::vector<std::string> entries;
  for (absl::string_view pair : absl::StrSplit(description, ' ')) {
    std::vector<std::string> parts = absl::StrSplit(pair, '=');
    const std::string value = parts[0] == "milestones" ? "[" + parts[1] + "]" : parts[1];
    entries.push_back(parts[0] + ": " + value);
  }
  return "{" + absl::StrJoin(entries, ", ") + "}";
}

DenseOptimizerOptions Parsed(const std::string& description) {
  const std::string yaml =
      absl::StrCat("cluster: {scheduler: 'h:1'}\ntraining:\n  max_steps: ", kSteps,
                   "\n  optimizer: {type: sgd, learning_rate: ", kBaseRate,
                   ", lr_schedule: ", YamlOf(description), "}\n");
  absl::StatusOr<ClusterSpec> spec = ParseClusterSpec(yaml, "job.yaml");
  INFO(yaml);
  INFO(spec.status().ToString());
  REQUIRE(spec.ok());
  return spec->training.optimizer;
}

std::map<std::string, std::vector<double>> TorchRates(const TempDir& dir) {
  std::string cases;
  for (const auto& [name, description] : Cases())
    absl::StrAppend(&cases, name, " ", kBaseRate, " ", kSteps, " ", description, "\n");
  const std::string input = dir.WriteFile("cases.txt", cases);
  const std::string output = dir.File("rates.txt");
  const std::string command =
      absl::StrCat("/usr/bin/python3 '", RunfilePath("tests/lr_schedule_reference.py"), "' '",
                   input, "' '", output, "' 2> '", output, ".err'");
  INFO(command);
  REQUIRE(std::system(command.c_str()) == 0);
  std::map<std::string, std::vector<double>> rates;
  std::ifstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string name, word;
    words >> name;
    while (words >> word) rates[name].push_back(std::strtod(word.c_str(), nullptr));
  }
  return rates;
}

TEST_CASE("every spec schedule gives the rates of its torch.optim.lr_scheduler, step by step") {
  TempDir dir;
  const std::map<std::string, std::vector<double>> torch = TorchRates(dir);
  for (const auto& [name, description] : Cases()) {
    INFO(name << ": " << description);
    const DenseOptimizerOptions options = Parsed(description);
    const auto found = torch.find(name);
    REQUIRE(found != torch.end());
    REQUIRE(found->second.size() == static_cast<size_t>(kSteps));
    double distinct = 0;
    for (int step = 1; step <= kSteps; ++step) {
      const double ours = ScheduledLearningRate(options, step);
      const double theirs = found->second[step - 1];
      INFO("step " << step << ": ours " << ours << ", torch " << theirs);
      distinct = std::max(distinct, std::abs(ours - kBaseRate));
      if (options.lr_schedule.decay == LrDecay::kCosine &&
          step - 1 > options.lr_schedule.total_steps) {
        // Past total_steps torch's cosine rises again; ours stays at its floor.
        CHECK(ours == options.lr_schedule.min_learning_rate);
        continue;
      }
      // torch steps most schedulers recursively (each rate from the last, rounded each
      // time) where we take the closed form: a few double roundings a step apart.
      CHECK(std::abs(ours - theirs) <= 1e-12 * kBaseRate);
    }
    // The schedule changes the rate (but constant's, which is the base throughout).
    if (name != "constant") CHECK(distinct > 1e-3);
  }
}

TEST_CASE("the optimizer's updates use the schedule's rate: SGD under warm-up and cosine") {
  const DenseOptimizerOptions options =
      Parsed("warmup_steps=3 warmup_start_factor=0.5 decay=cosine total_steps=10");
  DenseOptimizer sgd(options, 1);
  std::vector<float> p = {1.0f};
  float expected = 1.0f;
  for (int step = 1; step <= 12; ++step) {
    sgd.Apply(std::vector<float>{1.0f}, absl::MakeSpan(p));
    // By hand: warm-up 0.05, 0.0667, 0.0833 (0.1 x (0.5 + 0.5 e / 3)); then 0.1 x (1 + cos(pi
    // e / 7)) / 2 for e = 0..7, then 0 past total_steps.
    const int before = step - 1;
    const double done = std::min(before - 3, 7);
    const double rate = before < 3 ? 0.1 * (0.5 + 0.5 * before / 3.0)
                                   : 0.0 + (0.1 - 0.0) * (1 + std::cos(M_PI * done / 7.0)) / 2;
    expected = expected + static_cast<float>(-rate) * 1.0f;
    CHECK(p[0] == expected);
  }
  CHECK(ScheduledLearningRate(options, 11) == Approx(0.0).margin(1e-15));
}

TEST_CASE("bad schedules are refused at start, naming the key") {
  auto error = [](const std::string& schedule, int64_t max_steps = 100) {
    const std::string yaml =
        absl::StrCat("cluster: {scheduler: 'h:1'}\ntraining:\n  max_steps: ", max_steps,
                     "\n  optimizer: {type: adam, lr_schedule: ", schedule, "}\n");
    absl::StatusOr<ClusterSpec> spec = ParseClusterSpec(yaml, "job.yaml");
    REQUIRE_FALSE(spec.ok());
    return std::string(spec.status().message());
  };
  CHECK(error("{warmup_steps: 200}") ==
        "job.yaml:4: training.optimizer.lr_schedule.warmup_steps: is longer than the job "
        "(training.max_steps: 100)");
  CHECK(error("{decay: cosine, warmup_steps: 10, total_steps: 10}")
            .find("lr_schedule.total_steps: must be more than warmup_steps (10) for cosine") !=
        std::string::npos);
  CHECK(error("{decay: step}").find("lr_schedule.step_size: must be >= 1 for step") !=
        std::string::npos);
  CHECK(error("{decay: multistep, milestones: [5, 3]}")
            .find("lr_schedule.milestones: must be ascending steps >= 1") != std::string::npos);
  CHECK(error("{decay: cosine, total_steps: 50, gamma: 0.5}") ==
        "job.yaml:4: training.optimizer.lr_schedule.gamma: is not a setting of the cosine decay "
        "(it is of step, multistep, exponential)");
  CHECK(error("{decay: onecycle}").find("lr_schedule.decay: must be constant, step,") !=
        std::string::npos);
  CHECK(error("{warmup_steps: 5, warmup_start_factor: 0}")
            .find("warmup_start_factor: must be in (0, 1], as LinearLR's") != std::string::npos);
  CHECK(error("{decay: cosine, total_steps: 50, min_learning_rate: 1}")
            .find("min_learning_rate: must be in [0, learning_rate]") != std::string::npos);
}

}  // namespace
}  // namespace paramserver
