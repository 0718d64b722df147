#include "ps/adam_optimizer.h"

#include <cfloat>
#include <cmath>
#include <cstdlib>

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

// The textbook formula in long double, written independently of the implementation.
struct ReferenceAdam {
  long double m = 0, v = 0, p;
  int t = 0;
  void Step(long double g, const AdamOptions& o) {
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
  AdamOptions options;
  options.learning_rate = 0.1;
  options.epsilon = 1e-8;
  AdamOptimizer adam(options, 3);
  std::vector<float> params = {1.0f, -2.0f, 0.5f};
  adam.Apply(std::vector<float>{0.25f, -4.0f, 0.0f}, absl::MakeSpan(params));
  // Float32 results of a few operations: within a few u = 2^-24 = 6e-8 relative; 1e-6 is 16u.
  CHECK(params[0] == Approx(0.9).epsilon(1e-6));
  CHECK(params[1] == Approx(-1.9).epsilon(1e-6));
  CHECK(params[2] == 0.5f);  // zero gradient, zero moment: no move
  CHECK(adam.step() == 1);
  CHECK(adam.first_moment()[1] == Approx(-0.4));    // (1-0.9) * -4
  CHECK(adam.second_moment()[1] == Approx(0.016));  // (1-0.999) * 16
}

TEST_CASE("many Adam steps agree with the textbook formula to float tolerance") {
  AdamOptions options;  // the documented defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-7
  const std::vector<float> initial = {0.3f, -1.2f, 2.0f, 0.0f};
  std::vector<float> params = initial;
  std::vector<ReferenceAdam> reference;
  for (float p : initial) reference.push_back({0, 0, p, 0});
  AdamOptimizer adam(options, static_cast<int64_t>(params.size()));
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
  AdamOptions options;
  std::vector<float> original_params = {0.5f, -0.25f}, resumed_params;
  AdamOptimizer original(options, 2);
  for (int step = 0; step < 3; ++step)
    original.Apply(std::vector<float>{0.1f * step, -0.3f}, absl::MakeSpan(original_params));
  AdamOptimizer resumed(options, original.step(), original.first_moment(),
                        original.second_moment());
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
  if (baseline) {
    setenv("PS_CPU_BASELINE", "1", 1);
  } else {
    unsetenv("PS_CPU_BASELINE");
  }
  // 2^20 + 37 parameters: above the threading threshold, and not a multiple of any
  // vector width or chunk size, so the tails are covered too.
  const size_t n = (size_t{1} << 20) + 37;
  AdamOptions options;
  options.learning_rate = 0.01;
  std::vector<float> params(n), gradient(n);
  for (size_t i = 0; i < n; ++i) {
    params[i] = static_cast<float>(std::sin(0.001 * i));
    gradient[i] = static_cast<float>(std::cos(0.37 * i) * ((i % 7) + 1) * 1e-2);
  }
  std::vector<float> expected = params, m(n, 0.0f), v(n, 0.0f);
  AdamOptimizer adam(options, static_cast<int64_t>(n));
  for (int t = 1; t <= 3; ++t) {
    adam.Apply(gradient, absl::MakeSpan(params));
    // The same float operations in the same order, one element at a time, written here
    // from the documented formula.
    const float step_size =
        static_cast<float>(options.learning_rate / (1.0 - std::pow(options.beta1, t)));
    const float bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(options.beta2, t)));
    for (size_t i = 0; i < n; ++i) {
      volatile float g = gradient[i];  // volatile: keep the reference scalar
      m[i] = m[i] + static_cast<float>(1.0 - options.beta1) * (g - m[i]);
      v[i] = v[i] * static_cast<float>(options.beta2) +
             static_cast<float>(1.0 - options.beta2) * g * g;
      const float denom = std::sqrt(v[i]) / bc2_sqrt + static_cast<float>(options.epsilon);
      expected[i] -= step_size * (m[i] / denom);
    }
  }
  size_t mismatches = 0;
  for (size_t i = 0; i < n; ++i)
    mismatches += params[i] != expected[i] || adam.second_moment()[i] != v[i];
  CHECK(mismatches == 0);
  unsetenv("PS_CPU_BASELINE");
}

TEST_CASE("a gradient whose square float32 cannot hold is named by FirstUnsafeElement") {
  // sqrt(FLT_MAX) = 1.8446744e19: 3.5e19^2 = 1.225e39 and 1e20^2 = 1e40 overflow float32;
  // 1.8e19^2 = 3.24e38 fits (and is below the accepted limit, FLT_MAX * (1 - 2^-10) =
  // 3.3995e38). With beta2 = 0.999 Apply itself would add only 1e-3 * g^2 = 1e37 for 1e20,
  // but a steady 1e20 drives the second moment, an average of g^2, to 1e40 = +Inf.
  AdamOptions options;
  AdamOptimizer adam(options, 4);
  CHECK(adam.FirstUnsafeElement(std::vector<float>{1, 2, 3, 4}) == 4);  // none
  CHECK(adam.FirstUnsafeElement(std::vector<float>{1, -1e20f, 3, 4}) == 1);
  CHECK(adam.FirstUnsafeElement(std::vector<float>{1, 2, 3.5e19f, 1e20f}) == 2);  // the first
  CHECK(adam.FirstUnsafeElement(std::vector<float>{1.8e19f, -1.8e19f, 0, 0}) == 4);
  // Accepted, 1.8e19 leaves finite moments: m = 0.1 * g, v = (0.001 * g) * g = 3.24e35.
  std::vector<float> params(4, 0.0f);
  adam.Apply(std::vector<float>{1.8e19f, -1.8e19f, 0, 0}, absl::MakeSpan(params));
  CHECK(adam.first_moment()[0] == Approx(1.8e18));
  CHECK(adam.second_moment()[1] == Approx(3.24e35));
  for (float x : adam.second_moment()) CHECK(std::isfinite(x));
  for (float x : params) CHECK(std::isfinite(x));
}

TEST_CASE("FirstUnsafeElement checks the moments Apply would write against the present ones") {
  // The limit is FLT_MAX * (1 - 2^-10) = 3.39950e38. A second moment of FLT_MAX (a state
  // this rule never makes, but a checkpoint could hold) with beta2 = 0.9999 and g = 0:
  // v' = 0.9999 * 3.40282e38 = 3.40248e38, past the limit; from 3e38, v' = 2.9997e38.
  AdamOptions options;
  options.beta2 = 0.9999;
  AdamOptimizer adam(options, /*step=*/1, {0.0f, 0.0f}, {3.0e38f, FLT_MAX});
  CHECK(adam.FirstUnsafeElement(std::vector<float>{0.0f, 0.0f}) == 1);
  AdamOptimizer in_range(options, /*step=*/1, {0.0f, 0.0f}, {3.0e38f, 3.0e38f});
  CHECK(in_range.FirstUnsafeElement(std::vector<float>{0.0f, 1.0e19f}) == 2);
}

}  // namespace
}  // namespace paramserver
