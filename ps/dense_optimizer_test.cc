#include "ps/dense_optimizer.h"

#include <cfloat>
#include <cmath>
#include <cstdlib>

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

const std::vector<float> kZeros(4, 0.0f);

// The kernels a DenseOptimizer picks from now on: the x86-64 baseline ones (as on a CPU
// without AVX2) or this CPU's widest.
void UseCpuPath(bool baseline) {
  if (baseline) {
    setenv("PS_CPU_BASELINE", "1", 1);
  } else {
    unsetenv("PS_CPU_BASELINE");
  }
}

// The textbook formula in long double, written independently of the implementation.
struct ReferenceAdam {
  long double m = 0, v = 0, p;
  int t = 0;
  void Step(long double g, const DenseOptimizerOptions& o) {
    ++t;
    m = o.beta1 * m + (1 - o.beta1) * g;
    v = o.beta2 * v + (1 - o.beta2) * g * g;
    const long double m_hat = m / (1 - std::pow(static_cast<long double>(o.beta1), t));
    const long double v_hat = v / (1 - std::pow(static_cast<long double>(o.beta2), t));
    p -= o.learning_rate * m_hat / (std::sqrt(v_hat) + o.epsilon);
  }
};

TEST_CASE("the first Adam step moves each parameter by lr against the gradient's sign") {
  // With t=1: m_hat = g, v_hat = g^2, so the step is lr * g / (|g| + eps) ~ lr * sign(g).
  DenseOptimizerOptions options;
  options.learning_rate = 0.1;
  options.epsilon = 1e-8;
  DenseOptimizer adam(options, 3);
  std::vector<float> params = {1.0f, -2.0f, 0.5f};
  adam.Apply(std::vector<float>{0.25f, -4.0f, 0.0f}, absl::MakeSpan(params));
  // Float32 results of a few operations: within a few u = 2^-24 = 6e-8 relative; 1e-6 is 16u.
  CHECK(params[0] == Approx(0.9).epsilon(1e-6));
  CHECK(params[1] == Approx(-1.9).epsilon(1e-6));
  CHECK(params[2] == 0.5f);  // zero gradient, zero moment: no move
  CHECK(adam.step() == 1);
  CHECK(adam.slots()[0][1] == Approx(-0.4));   // (1-0.9) * -4
  CHECK(adam.slots()[1][1] == Approx(0.016));  // (1-0.999) * 16
}

TEST_CASE("many Adam steps agree with the textbook formula to float tolerance") {
  DenseOptimizerOptions options;  // torch's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8
  const std::vector<float> initial = {0.3f, -1.2f, 2.0f, 0.0f};
  std::vector<float> params = initial;
  std::vector<ReferenceAdam> reference;
  for (float p : initial) reference.push_back({0, 0, p, 0});
  DenseOptimizer adam(options, static_cast<int64_t>(params.size()));
  for (int step = 1; step <= 200; ++step) {
    std::vector<float> gradient(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      gradient[i] = static_cast<float>(std::sin(step * 0.37 + i) * (i + 1));
      reference[i].Step(gradient[i], options);
    }
    adam.Apply(gradient, absl::MakeSpan(params));
  }
  CHECK(adam.step() == 200);
  // The tolerance, from the arithmetic: each float32 step rounds the parameter to half an
  // ulp of its magnitude (below 4 here: 2^-22 / 2) and its update (at most about lr) to a
  // few units of float32 rounding u = 2^-24; the double reference does neither. Over 200
  // steps: 200 x (2^-23 + 8 lr u).
  const double u = std::ldexp(1.0, -24);
  const double margin = 200 * (std::ldexp(1.0, -23) + 8 * options.learning_rate * u);
  for (size_t i = 0; i < params.size(); ++i) {
    CHECK(params[i] == Approx(static_cast<double>(reference[i].p)).margin(margin));
    CHECK(params[i] != initial[i]);
  }
}

}  // namespace
}  // namespace paramserver

namespace paramserver {
namespace {

TEST_CASE("an optimizer resumed from saved state continues exactly where the original was") {
  DenseOptimizerOptions options;
  std::vector<float> original_params = {0.5f, -0.25f}, resumed_params;
  DenseOptimizer original(options, 2);
  for (int step = 0; step < 3; ++step)
    original.Apply(std::vector<float>{0.1f * step, -0.3f}, absl::MakeSpan(original_params));
  DenseOptimizer resumed(options, original.step(), original.slots());
  resumed_params = original_params;
  original.Apply(std::vector<float>{0.7f, 0.2f}, absl::MakeSpan(original_params));
  resumed.Apply(std::vector<float>{0.7f, 0.2f}, absl::MakeSpan(resumed_params));
  CHECK(resumed.step() == 4);
  CHECK(resumed_params == original_params);  // bit-identical
}

}  // namespace
}  // namespace paramserver

namespace paramserver {
namespace {

TEST_CASE(
    "the vectorised, multi-threaded update is bit-identical to a plain float loop, on every path") {
  // Each instruction-set path: this CPU's widest, and the x86-64 baseline (forced with
  // PS_CPU_BASELINE=1, as on a CPU without AVX2).
  const bool baseline = GENERATE(false, true);
  INFO("PS_CPU_BASELINE=" << baseline);
  UseCpuPath(baseline);
  // 2^20 + 37 parameters: above the threading threshold, and not a multiple of any
  // vector width or chunk size, so the tails are covered too.
  const size_t n = (size_t{1} << 20) + 37;
  DenseOptimizerOptions options;
  options.learning_rate = 0.01;
  std::vector<float> params(n), gradient(n);
  for (size_t i = 0; i < n; ++i) {
    params[i] = static_cast<float>(std::sin(0.001 * i));
    gradient[i] = static_cast<float>(std::cos(0.37 * i) * ((i % 7) + 1) * 1e-2);
  }
  std::vector<float> expected = params, m(n, 0.0f), v(n, 0.0f);
  DenseOptimizer adam(options, static_cast<int64_t>(n));
  for (int t = 1; t <= 3; ++t) {
    adam.Apply(gradient, absl::MakeSpan(params));
    // The same float operations in the same order, one element at a time, written here
    // from the documented formula.
    const float step_size =
        static_cast<float>(options.learning_rate / (1.0 - std::pow(options.beta1, t)));
    const float bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(options.beta2, t)));
    for (size_t i = 0; i < n; ++i) {
      volatile float g = gradient[i];  // volatile: keep the reference scalar
      m[i] = m[i] * static_cast<float>(options.beta1) + static_cast<float>(1.0 - options.beta1) * g;
      v[i] = v[i] * static_cast<float>(options.beta2) +
             static_cast<float>(1.0 - options.beta2) * g * g;
      const float denom = std::sqrt(v[i]) / bc2_sqrt + static_cast<float>(options.epsilon);
      expected[i] = expected[i] + -step_size * m[i] / denom;
    }
  }
  size_t mismatches = 0;
  for (size_t i = 0; i < n; ++i)
    mismatches += params[i] != expected[i] || adam.slots()[1][i] != v[i];
  CHECK(mismatches == 0);
  unsetenv("PS_CPU_BASELINE");
}

TEST_CASE("a gradient whose square float32 cannot hold is named by FirstUnsafeElement") {
  // sqrt(FLT_MAX) = 1.8446744e19: 3.5e19^2 = 1.225e39 and 1e20^2 = 1e40 overflow float32;
  // 1.8e19^2 = 3.24e38 fits (and is below the accepted limit, FLT_MAX * (1 - 2^-10) =
  // 3.3995e38). With beta2 = 0.999 Apply itself would add only 1e-3 * g^2 = 1e37 for 1e20,
  // but a steady 1e20 drives the second moment, an average of g^2, to 1e40 = +Inf.
  DenseOptimizerOptions options;
  DenseOptimizer adam(options, 4);
  CHECK(adam.FirstUnsafeElement(std::vector<float>{1, 2, 3, 4}, kZeros) == 4);  // none
  CHECK(adam.FirstUnsafeElement(std::vector<float>{1, -1e20f, 3, 4}, kZeros) == 1);
  CHECK(adam.FirstUnsafeElement(std::vector<float>{1, 2, 3.5e19f, 1e20f}, kZeros) ==
        2);  // the first
  CHECK(adam.FirstUnsafeElement(std::vector<float>{1.8e19f, -1.8e19f, 0, 0}, kZeros) == 4);
  // Accepted, 1.8e19 leaves finite moments: m = 0.1 * g, v = (0.001 * g) * g = 3.24e35.
  std::vector<float> params(4, 0.0f);
  adam.Apply(std::vector<float>{1.8e19f, -1.8e19f, 0, 0}, absl::MakeSpan(params));
  CHECK(adam.slots()[0][0] == Approx(1.8e18));
  CHECK(adam.slots()[1][1] == Approx(3.24e35));
  for (float x : adam.slots()[1]) CHECK(std::isfinite(x));
  for (float x : params) CHECK(std::isfinite(x));
}

TEST_CASE("FirstUnsafeElement checks the moments Apply would write against the present ones") {
  // The limit is FLT_MAX * (1 - 2^-10) = 3.39950e38. A second moment of FLT_MAX (a state
  // this rule never makes, but a checkpoint could hold) with beta2 = 0.9999 and g = 0:
  // v' = 0.9999 * 3.40282e38 = 3.40248e38, past the limit; from 3e38, v' = 2.9997e38.
  DenseOptimizerOptions options;
  options.beta2 = 0.9999;
  DenseOptimizer adam(options, /*step=*/1, {{0.0f, 0.0f}, {3.0e38f, FLT_MAX}});
  CHECK(adam.FirstUnsafeElement(std::vector<float>{0.0f, 0.0f}, kZeros) == 1);
  DenseOptimizer in_range(options, /*step=*/1, {{0.0f, 0.0f}, {3.0e38f, 3.0e38f}});
  CHECK(in_range.FirstUnsafeElement(std::vector<float>{0.0f, 1.0e19f}, kZeros) == 2);
}

}  // namespace
}  // namespace paramserver

namespace paramserver {
namespace {

// Every rule and flag the servers offer, for the tests that cover them all.
std::vector<std::pair<std::string, DenseOptimizerOptions>> EveryVariant() {
  std::vector<std::pair<std::string, DenseOptimizerOptions>> variants;
  auto add = [&](const std::string& name, DenseOptimizerType type, auto&& set) {
    DenseOptimizerOptions options = DenseOptimizerDefaults(type);
    options.learning_rate = 0.01;
    set(options);
    variants.emplace_back(name, options);
  };
  using T = DenseOptimizerType;
  add("sgd", T::kSgd, [](DenseOptimizerOptions&) {});
  add("sgd momentum dampening wd", T::kSgd, [](DenseOptimizerOptions& o) {
    o.momentum = 0.9;
    o.dampening = 0.1;
    o.weight_decay = 0.01;
  });
  add("sgd nesterov", T::kSgd, [](DenseOptimizerOptions& o) {
    o.momentum = 0.9;
    o.nesterov = true;
  });
  add("adam wd amsgrad", T::kAdam, [](DenseOptimizerOptions& o) {
    o.weight_decay = 0.01;
    o.amsgrad = true;
  });
  add("adamw", T::kAdamW, [](DenseOptimizerOptions&) {});
  add("adagrad", T::kAdagrad, [](DenseOptimizerOptions& o) {
    o.lr_decay = 0.01;
    o.weight_decay = 0.01;
    o.initial_accumulator_value = 0.1;
  });
  add("rmsprop", T::kRmsprop, [](DenseOptimizerOptions&) {});
  add("rmsprop centered momentum wd", T::kRmsprop, [](DenseOptimizerOptions& o) {
    o.centered = true;
    o.momentum = 0.9;
    o.weight_decay = 0.01;
  });
  add("rmsprop centered", T::kRmsprop, [](DenseOptimizerOptions& o) { o.centered = true; });
  return variants;
}

TEST_CASE("every rule's vectorised, multi-threaded update equals its element-at-a-time one") {
  const bool baseline = GENERATE(false, true);
  INFO("PS_CPU_BASELINE=" << baseline);
  UseCpuPath(baseline);
  const size_t n = (size_t{1} << 20) + 37;  // threaded, with tails
  std::vector<float> initial(n), gradient(n);
  for (size_t i = 0; i < n; ++i) {
    initial[i] = static_cast<float>(std::sin(0.001 * i));
    gradient[i] = static_cast<float>(std::cos(0.37 * i) * ((i % 7) + 1) * 1e-2);
  }
  for (const auto& [name, options] : EveryVariant()) {
    INFO(name);
    std::vector<float> params = initial;
    DenseOptimizer whole(options, static_cast<int64_t>(n));
    // One optimizer of one element for every 4099th: the loop's scalar path alone.
    std::vector<size_t> sampled;
    std::vector<DenseOptimizer> single;
    std::vector<float> single_params;
    for (size_t i = 0; i < n; i += 4099) {
      sampled.push_back(i);
      single.emplace_back(options, 1);
      single_params.push_back(initial[i]);
    }
    for (int t = 1; t <= 3; ++t) {
      whole.Apply(gradient, absl::MakeSpan(params));
      for (size_t k = 0; k < sampled.size(); ++k) {
        single[k].Apply(absl::MakeConstSpan(&gradient[sampled[k]], 1),
                        absl::MakeSpan(&single_params[k], 1));
      }
    }
    size_t mismatches = 0;
    for (size_t k = 0; k < sampled.size(); ++k) {
      mismatches += params[sampled[k]] != single_params[k];
      for (size_t slot = 0; slot < whole.slots().size(); ++slot)
        mismatches += whole.slots()[slot][sampled[k]] != single[k].slots()[slot][0];
    }
    CHECK(mismatches == 0);
    CHECK(params[1] != initial[1]);
  }
  unsetenv("PS_CPU_BASELINE");
}

TEST_CASE("SGD with momentum: two steps by hand") {
  // torch: buf = g at the first step, then buf = momentum buf + (1 - dampening) g;
  // p -= lr buf. lr 0.1, momentum 0.5, dampening 0: p = 1 - 0.1 * 2 = 0.8, then
  // buf = 0.5 * 2 + 4 = 5, p = 0.8 - 0.5 = 0.3. Nesterov: p -= lr (g + momentum buf):
  // 1 - 0.1 (2 + 1) = 0.7, then buf = 5, 0.7 - 0.1 (4 + 2.5) = 0.05.
  DenseOptimizerOptions options = DenseOptimizerDefaults(DenseOptimizerType::kSgd);
  options.learning_rate = 0.1;
  options.momentum = 0.5;
  for (const bool nesterov : {false, true}) {
    options.nesterov = nesterov;
    DenseOptimizer sgd(options, 1);
    std::vector<float> p = {1.0f};
    sgd.Apply(std::vector<float>{2.0f}, absl::MakeSpan(p));
    CHECK(p[0] == Approx(nesterov ? 0.7 : 0.8).epsilon(1e-6));
    sgd.Apply(std::vector<float>{4.0f}, absl::MakeSpan(p));
    CHECK(p[0] == Approx(nesterov ? 0.05 : 0.3).epsilon(1e-5));
    CHECK(sgd.slots()[0][0] == 5.0f);
  }
}

TEST_CASE("each rule keeps torch's state, fresh as torch makes it") {
  DenseOptimizerOptions adagrad = DenseOptimizerDefaults(DenseOptimizerType::kAdagrad);
  adagrad.initial_accumulator_value = 0.25;
  CHECK(DenseOptimizer(adagrad, 3).slots() ==
        std::vector<std::vector<float>>{{0.25f, 0.25f, 0.25f}});
  DenseOptimizerOptions rmsprop = DenseOptimizerDefaults(DenseOptimizerType::kRmsprop);
  rmsprop.centered = true;
  CHECK(DenseOptimizerSlotNames(rmsprop) == std::vector<std::string>{"square_avg", "grad_avg"});
  rmsprop.momentum = 0.9;
  CHECK(DenseOptimizerSlotNames(rmsprop) ==
        std::vector<std::string>{"square_avg", "momentum_buffer", "grad_avg"});
  CHECK(DenseOptimizerSlotNames(DenseOptimizerDefaults(DenseOptimizerType::kSgd)).empty());
  DenseOptimizerOptions adamw = DenseOptimizerDefaults(DenseOptimizerType::kAdamW);
  CHECK(adamw.weight_decay == 0.01);
  adamw.amsgrad = true;
  CHECK(DenseOptimizer(adamw, 2).slots().size() == 3);
}

TEST_CASE("a rule whose update would overflow the parameter refuses the gradient") {
  // SGD moves p by lr g: lr 10 and g 1e38 would make 1e39, past float32's range, though
  // the gradient itself is finite and SGD keeps no square.
  DenseOptimizerOptions options = DenseOptimizerDefaults(DenseOptimizerType::kSgd);
  options.learning_rate = 10;
  DenseOptimizer sgd(options, 3);
  const std::vector<float> params = {0, 0, 0};
  CHECK(sgd.FirstUnsafeElement(std::vector<float>{1, 1e30f, 1e38f}, params) == 2);
  CHECK(sgd.FirstUnsafeElement(std::vector<float>{1, 1e30f, 1e36f}, params) == 3);
  // Weight decay adds wd p to the gradient before anything else.
  options.learning_rate = 1e-3;
  options.weight_decay = 1e10;
  DenseOptimizer decayed(options, 1);
  CHECK(decayed.FirstUnsafeElement(std::vector<float>{0}, std::vector<float>{1e30f}) == 0);
}

}  // namespace
}  // namespace paramserver
