// The servers' dense optimizers (ps/dense_optimizer) against torch.optim's own, run by
// tests/dense_optimizer_reference.py with Debian's python3-torch on the same initial
// values and gradients: every type, with and without weight decay, and each flag
// (momentum, dampening, nesterov, amsgrad, centered, lr_decay, an initial accumulator),
// over 40 steps. The values and every state tensor torch keeps are compared.
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "catch2/catch.hpp"
#include "common/testing/local_cluster.h"
#include "common/testing/temp_dir.h"
#include "ps/dense_optimizer.h"

namespace paramserver {
namespace {

constexpr int kSize = 257;
constexpr int kSteps = 40;

std::string Hex(float value) { return absl::StrFormat("%a", static_cast<double>(value)); }

// torch's class and keyword arguments for `o` (Python's repr of each float: exact).
std::string TorchHeader(const DenseOptimizerOptions& o) {
  auto number = [](const char* name, double value) {
    return absl::StrFormat(" %s=%.17g", name, value);
  };
  auto flag = [](const char* name, bool value) {
    return absl::StrCat(" ", name, "=", value ? "True" : "False");
  };
  std::string header = number("lr", o.learning_rate) + number("weight_decay", o.weight_decay);
  switch (o.type) {
    case DenseOptimizerType::kSgd:
      return "SGD" + header + number("momentum", o.momentum) + number("dampening", o.dampening) +
             flag("nesterov", o.nesterov);
    case DenseOptimizerType::kAdam:
    case DenseOptimizerType::kAdamW:
      return (o.type == DenseOptimizerType::kAdam ? "Adam" : "AdamW") + header +
             number("beta1", o.beta1) + number("beta2", o.beta2) + number("eps", o.epsilon) +
             flag("amsgrad", o.amsgrad);
    case DenseOptimizerType::kAdagrad:
      return "Adagrad" + header + number("lr_decay", o.lr_decay) + number("eps", o.epsilon) +
             number("initial_accumulator_value", o.initial_accumulator_value);
    case DenseOptimizerType::kRmsprop:
      return "RMSprop" + header + number("alpha", o.alpha) + number("eps", o.epsilon) +
             number("momentum", o.momentum) + flag("centered", o.centered);
  }
  return "";
}

struct Case {
  std::vector<float> initial;
  std::vector<std::vector<float>> gradients;  // per step
};

Case MakeCase(uint32_t seed) {
  std::mt19937 random(seed);
  std::normal_distribution<float> normal(0, 1);
  Case c;
  for (int i = 0; i < kSize; ++i) c.initial.push_back(normal(random));
  // A gradient that drifts (so momentum and averages matter) with noise on top; element
  // 0 always 0 (an untouched parameter, which weight decay alone moves).
  std::vector<float> drift(kSize);
  for (float& d : drift) d = normal(random);
  for (int step = 0; step < kSteps; ++step) {
    std::vector<float> gradient(kSize);
    for (int i = 1; i < kSize; ++i) gradient[i] = drift[i] * 0.5f + normal(random) * 0.3f;
    c.gradients.push_back(std::move(gradient));
  }
  return c;
}

struct Result {
  std::vector<float> values;
  std::map<std::string, std::vector<float>> state;
};

std::vector<float> ParseFloats(const std::string& line) {
  std::vector<float> floats;
  const char* at = line.c_str();
  char* end = nullptr;
  for (float x = std::strtof(at, &end); end != at; x = std::strtof(at, &end)) {
    floats.push_back(x);
    at = end;
  }
  return floats;
}

// Writes each case's file for tests/dense_optimizer_reference.py, runs it once on them
// all, and reads what torch made of each.
std::vector<Result> RunTorch(const TempDir& dir,
                             const std::vector<std::pair<std::string, DenseOptimizerOptions>>& runs,
                             const Case& c) {
  std::string command =
      absl::StrCat("/usr/bin/python3 '", RunfilePath("tests/dense_optimizer_reference.py"), "'");
  for (const auto& [name, options] : runs) {
    std::string text = TorchHeader(options) + "\n";
    for (float x : c.initial) absl::StrAppend(&text, Hex(x), " ");
    absl::StrAppend(&text, "\n");
    for (const std::vector<float>& gradient : c.gradients) {
      for (float g : gradient) absl::StrAppend(&text, Hex(g), " ");
      absl::StrAppend(&text, "\n");
    }
    absl::StrAppend(&command, " '", dir.WriteFile(name + ".case", text), "'");
  }
  absl::StrAppend(&command, " 2> '", dir.File("torch.err"), "'");
  INFO(command);
  REQUIRE(std::system(command.c_str()) == 0);
  std::vector<Result> results;
  for (const auto& run : runs) {
    Result& result = results.emplace_back();
    FILE* file = std::fopen(dir.File(run.first + ".case.out").c_str(), "r");
    REQUIRE(file != nullptr);
    std::string line;
    for (int ch = std::fgetc(file); ch != EOF; ch = std::fgetc(file)) {
      if (ch != '\n') {
        line.push_back(static_cast<char>(ch));
        continue;
      }
      if (result.values.empty()) {
        result.values = ParseFloats(line);
      } else {
        const size_t space = line.find(' ');
        result.state[line.substr(0, space)] = ParseFloats(line.substr(space + 1));
      }
      line.clear();
    }
    std::fclose(file);
  }
  return results;
}

// Each operation is torch's float32 operation in torch's order. torch's vectorised
// kernels fuse the multiply-add of add(x, alpha=a) and of mul-then-add (an FMA, one
// rounding where we round twice), so each step's results may differ by an ulp or two of
// the values each operation produces, and the differences are carried by the state into
// later steps without growing (every rule here contracts them: the averages' factors are
// below 1, the parameters' steps are bounded). Over kSteps steps: 4 ulps a step of the
// largest magnitude involved, max(1, |x|).
void CheckClose(const std::string& what, const std::vector<float>& ours,
                const std::vector<float>& torch, double* worst_ulps) {
  REQUIRE(ours.size() == torch.size());
  const double ulp = std::numeric_limits<float>::epsilon();
  for (size_t i = 0; i < ours.size(); ++i) {
    const double scale = std::max(1.0, static_cast<double>(std::abs(torch[i])));
    const double ulps = std::abs(static_cast<double>(ours[i]) - torch[i]) / (ulp * scale);
    *worst_ulps = std::max(*worst_ulps, ulps);
    INFO(what << " element " << i << ": ours " << Hex(ours[i]) << ", torch " << Hex(torch[i]));
    CHECK(ulps <= 4.0 * kSteps);
  }
}

using Runs = std::vector<std::pair<std::string, DenseOptimizerOptions>>;

void CheckOne(const std::string& name, const DenseOptimizerOptions& options, const Case& c,
              const Result& torch) {
  INFO(name);
  std::vector<float> ours = c.initial;
  DenseOptimizer optimizer(options, kSize);
  for (const std::vector<float>& gradient : c.gradients)
    optimizer.Apply(gradient, absl::MakeSpan(ours));
  double worst_ulps = 0;
  CheckClose("value", ours, torch.values, &worst_ulps);
  const std::vector<std::string> slots = DenseOptimizerSlotNames(options);
  std::vector<std::string> torch_slots;
  for (const auto& [slot, floats] : torch.state) torch_slots.push_back(slot);
  std::vector<std::string> sorted = slots;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == torch_slots);  // the same state, by torch's names
  for (size_t k = 0; k < slots.size(); ++k) {
    auto it = torch.state.find(slots[k]);
    if (it != torch.state.end())
      CheckClose(slots[k], optimizer.slots()[k], it->second, &worst_ulps);
  }
  WARN(name << ": largest difference from torch " << worst_ulps << " ulps");
  // The test tests something: the values moved far beyond the tolerance.
  double moved = 0;
  for (int i = 0; i < kSize; ++i) moved = std::max(moved, std::abs(1.0 * ours[i] - c.initial[i]));
  CHECK(moved > 1e4 * 4.0 * kSteps * std::numeric_limits<float>::epsilon());
}

void CheckAgreement(const Runs& runs) {
  TempDir dir;
  const Case c = MakeCase(11);
  const std::vector<Result> torch = RunTorch(dir, runs, c);
  for (size_t k = 0; k < runs.size(); ++k) CheckOne(runs[k].first, runs[k].second, c, torch[k]);
}

DenseOptimizerOptions Options(DenseOptimizerType type, double learning_rate) {
  DenseOptimizerOptions options = DenseOptimizerDefaults(type);
  options.learning_rate = learning_rate;
  return options;
}

TEST_CASE("SGD: plain, with weight decay, momentum with dampening, and nesterov") {
  Runs runs;
  DenseOptimizerOptions o = Options(DenseOptimizerType::kSgd, 0.05);
  runs.emplace_back("sgd", o);
  o.weight_decay = 0.1;
  runs.emplace_back("sgd_wd", o);
  o.momentum = 0.9;
  o.dampening = 0.2;
  runs.emplace_back("sgd_momentum_dampening_wd", o);
  o.dampening = 0;
  o.nesterov = true;
  runs.emplace_back("sgd_nesterov_wd", o);
  o.weight_decay = 0;
  runs.emplace_back("sgd_nesterov", o);
  CheckAgreement(runs);
}

TEST_CASE("Adam and AdamW: with and without weight decay, and amsgrad") {
  Runs runs;
  DenseOptimizerOptions adam = Options(DenseOptimizerType::kAdam, 0.01);
  runs.emplace_back("adam", adam);
  adam.weight_decay = 0.1;
  runs.emplace_back("adam_wd", adam);
  adam.amsgrad = true;
  runs.emplace_back("adam_wd_amsgrad", adam);
  DenseOptimizerOptions adamw = Options(DenseOptimizerType::kAdamW, 0.01);
  adamw.weight_decay = 0.1;
  runs.emplace_back("adamw", adamw);
  adamw.amsgrad = true;
  runs.emplace_back("adamw_amsgrad", adamw);
  adamw.weight_decay = 0;
  adamw.amsgrad = false;
  runs.emplace_back("adamw_no_decay", adamw);
  CheckAgreement(runs);
}

TEST_CASE("Adagrad: plain, and with lr_decay, weight decay and an initial accumulator") {
  Runs runs;
  DenseOptimizerOptions o = Options(DenseOptimizerType::kAdagrad, 0.1);
  runs.emplace_back("adagrad", o);
  o.lr_decay = 0.05;
  o.weight_decay = 0.1;
  o.initial_accumulator_value = 0.5;
  runs.emplace_back("adagrad_decay_wd_accumulator", o);
  CheckAgreement(runs);
}

TEST_CASE("RMSprop: plain, weight decay, momentum, centered, and all of them") {
  Runs runs;
  DenseOptimizerOptions o = Options(DenseOptimizerType::kRmsprop, 0.01);
  runs.emplace_back("rmsprop", o);
  o.weight_decay = 0.1;
  runs.emplace_back("rmsprop_wd", o);
  o.weight_decay = 0;
  o.momentum = 0.9;
  runs.emplace_back("rmsprop_momentum", o);
  o.momentum = 0;
  o.centered = true;
  runs.emplace_back("rmsprop_centered", o);
  o.momentum = 0.9;
  o.weight_decay = 0.1;
  o.alpha = 0.9;
  runs.emplace_back("rmsprop_centered_momentum_wd", o);
  CheckAgreement(runs);
}

}  // namespace
}  // namespace paramserver
