#include "worker/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "catch2/catch.hpp"
#include "worker/mlp_test_problem.h"

namespace paramserver {
namespace {

// An independent forward pass in double precision, written from the math alone:
// h = relu(W x + b) per hidden layer, loss = mean(logsumexp(z) - z_y).
double ReferenceLoss(const MlpLayout& layout, const std::vector<double>& params,
                     const std::vector<float>& features, const std::vector<uint8_t>& labels) {
  const int64_t rows = static_cast<int64_t>(labels.size());
  double total = 0;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> x(features.begin() + r * layout.layers()[0],
                          features.begin() + (r + 1) * layout.layers()[0]);
    for (int l = 0; l < layout.num_layers(); ++l) {
      const int64_t in = layout.layers()[l], out = layout.layers()[l + 1];
      std::vector<double> y(out);
      for (int64_t j = 0; j < out; ++j) {
        double sum = params[layout.bias(l).offset + j];
        for (int64_t i = 0; i < in; ++i) sum += params[layout.weight(l).offset + j * in + i] * x[i];
        y[j] = (l + 1 < layout.num_layers()) ? std::max(sum, 0.0) : sum;
      }
      x = y;
    }
    double sum_exp = 0;
    for (double z : x) sum_exp += std::exp(z);
    total += std::log(sum_exp) - x[labels[r]];
  }
  return total / rows;
}

TEST_CASE("loss and every gradient agree with finite differences of an independent forward pass") {
  for (auto layers : {std::vector<int64_t>{5, 4, 3}, std::vector<int64_t>{7, 6, 5, 4},
                      std::vector<int64_t>{3, 2}}) {
    for (int rows : {1, 4}) {
      MlpTestProblem p = MakeMlpTestProblem(layers, rows, 42);
      CpuBackend backend(p.layout, 1);
      std::vector<float> gradient(p.params.size());
      absl::StatusOr<float> loss =
          backend.ComputeGradients(p.params, p.batch(), absl::MakeSpan(gradient));
      REQUIRE(loss.ok());
      std::vector<double> params(p.params.begin(), p.params.end());
      // Float32 against a double reference: the loss passes through sums of at most
      // 7 inputs, a log-sum-exp over at most 5 classes and a mean over 4 rows, each
      // rounding by u = 2^-24 relative per term: about 20u = 1.2e-6 relative; 1e-5
      // leaves a factor 8.
      CHECK(*loss == Approx(ReferenceLoss(p.layout, params, p.features, p.labels)).epsilon(1e-5));
      // The central difference in double is exact to h^2 |f^(3)| / 6 ~ 1e-11 plus its
      // own rounding 2^-53 |f| / h ~ 1e-11: the bound is the float32 gradient's, sums of
      // at most 7 products of magnitude below 1 through at most 3 layers: 3 x 7 x 7u =
      // 8.8e-6 absolute; 2e-5 leaves a factor 2.
      const double h = 1e-5;
      for (size_t i = 0; i < params.size(); ++i) {
        std::vector<double> plus = params, minus = params;
        plus[i] += h;
        minus[i] -= h;
        const double numeric = (ReferenceLoss(p.layout, plus, p.features, p.labels) -
                                ReferenceLoss(p.layout, minus, p.features, p.labels)) /
                               (2 * h);
        INFO("layers " << layers.size() << " rows " << rows << " parameter " << i);
        CHECK(gradient[i] == Approx(numeric).margin(2e-5));
      }
    }
  }
}

TEST_CASE("the gradient of a concatenated batch is the mean of its halves' gradients") {
  // This is why a sync step (the mean of W workers' gradients) equals one process
  // training on the W batches together.
  MlpTestProblem p = MakeMlpTestProblem({6, 5, 3}, 8, 7);
  CpuBackend backend(p.layout, 1);
  std::vector<float> whole(p.params.size()), first(p.params.size()), second(p.params.size());
  REQUIRE(backend
              .ComputeGradients(p.params, {p.features.data(), p.labels.data(), 8},
                                absl::MakeSpan(whole))
              .ok());
  REQUIRE(backend
              .ComputeGradients(p.params, {p.features.data(), p.labels.data(), 4},
                                absl::MakeSpan(first))
              .ok());
  REQUIRE(backend
              .ComputeGradients(p.params, {p.features.data() + 4 * 6, p.labels.data() + 4, 4},
                                absl::MakeSpan(second))
              .ok());
  // The same products summed in two groupings (8 rows, or 4 + 4 then halved): each sum of
  // 8 terms below 1 rounds by at most 8u = 4.8e-7 absolute; 1e-6 covers both groupings.
  for (size_t i = 0; i < whole.size(); ++i) {
    CHECK(whole[i] == Approx(0.5 * (first[i] + second[i])).margin(1e-6));
  }
}

TEST_CASE(
    "a streamed gradient is reported last layer first, each part before the rest is written, and "
    "never changes") {
  // 784-64-10: the first layer's 64 x 784 weight gradient comes in blocks of 20 rows.
  MlpTestProblem p = MakeMlpTestProblem({784, 64, 10}, 16, 3);
  CpuBackend backend(p.layout, 1);
  const int64_t total = p.layout.total_parameters();
  std::vector<float> gradient(total, std::nanf(""));
  std::vector<int64_t> reported;
  std::vector<std::vector<float>> snapshots;  // gradient[from, total) at each report
  absl::StatusOr<float> loss = backend.ComputeGradientsStreamed(
      p.params, p.batch(), absl::MakeSpan(gradient), [&](int64_t from) {
        INFO("reported from " << from);
        CHECK((reported.empty() || from < reported.back()));
        CHECK(from >= 0);
        CHECK(std::none_of(gradient.begin() + from, gradient.end(),
                           [](float g) { return std::isnan(g); }));
        // Early: the part below is still unwritten (every element of it, in fact).
        if (from > 0) CHECK(std::isnan(gradient[from - 1]));
        reported.push_back(from);
        snapshots.emplace_back(gradient.begin() + from, gradient.end());
      });
  REQUIRE(loss.ok());
  // fc2.bias, fc2.weight (one block), fc1.bias, fc1.weight in 4 blocks (20, 20, 20, 4 rows).
  const std::vector<int64_t> expected = {p.layout.bias(1).offset,
                                         p.layout.weight(1).offset,
                                         p.layout.bias(0).offset,
                                         44 * 784,
                                         24 * 784,
                                         4 * 784,
                                         0};
  CHECK(reported == expected);
  for (size_t k = 0; k < reported.size(); ++k) {
    CHECK(std::equal(snapshots[k].begin(), snapshots[k].end(), gradient.begin() + reported[k]));
  }
  // Exactly what ComputeGradients computes, bit for bit.
  std::vector<float> plain(total);
  absl::StatusOr<float> plain_loss =
      backend.ComputeGradients(p.params, p.batch(), absl::MakeSpan(plain));
  REQUIRE(plain_loss.ok());
  CHECK(*plain_loss == *loss);
  CHECK(plain == gradient);
}

TEST_CASE("CountCorrect counts examples whose largest logit is the label") {
  // One linear layer with identity weights: the prediction is the largest feature.
  MlpLayout layout({3, 3});
  std::vector<float> params = {1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0};
  std::vector<float> features = {0.9f, 0.1f, 0.0f, 0.2f, 0.1f, 0.7f, 0.0f, 1.0f, 0.5f};
  std::vector<uint8_t> labels = {0, 1, 1};  // right, wrong (predicts 2), right
  CpuBackend backend(layout, 1);
  absl::StatusOr<int64_t> correct =
      backend.CountCorrect(params, {features.data(), labels.data(), 3});
  REQUIRE(correct.ok());
  CHECK(*correct == 2);
}

TEST_CASE("wrong sizes and labels are errors") {
  MlpTestProblem p = MakeMlpTestProblem({4, 3}, 2, 1);
  CpuBackend backend(p.layout, 1);
  std::vector<float> gradient(p.params.size());
  std::vector<float> short_params(p.params.begin(), p.params.end() - 1);
  CHECK(backend
            .ComputeGradients(short_params, {p.features.data(), p.labels.data(), 2},
                              absl::MakeSpan(gradient))
            .status()
            .code() == absl::StatusCode::kInvalidArgument);
  std::vector<uint8_t> bad_labels = {0, 3};
  CHECK(backend.CountCorrect(p.params, {p.features.data(), bad_labels.data(), 2}).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace paramserver
