#include "worker/ctr_metrics.h"

#include <cmath>
#include <vector>

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

TEST_CASE("AUC counts the pairs a score orders right; ties count one half") {
  CHECK(*ExactAuc({0.1f, 0.4f, 0.35f, 0.8f}, {0, 0, 1, 1}) == 0.75);  // 3 of 4 pairs
  CHECK(*ExactAuc({1, 2, 3}, {0, 1, 1}) == 1.0);
  CHECK(*ExactAuc({3, 2, 1}, {0, 1, 1}) == 0.0);
  CHECK(*ExactAuc({5, 5, 5, 5}, {0, 1, 0, 1}) == 0.5);
  // Brute force over every (positive, negative) pair on a larger case.
  std::vector<float> scores, labels;
  for (int i = 0; i < 200; ++i) {
    scores.push_back(static_cast<float>((i * 37) % 23));  // many ties
    labels.push_back(static_cast<float>((i * 11) % 3 == 0));
  }
  double right = 0, pairs = 0;
  for (size_t p = 0; p < scores.size(); ++p) {
    for (size_t n = 0; n < scores.size(); ++n) {
      if (labels[p] != 1 || labels[n] != 0) continue;
      pairs += 1;
      right += scores[p] > scores[n] ? 1 : scores[p] == scores[n] ? 0.5 : 0;
    }
  }
  CHECK(std::abs(*ExactAuc(scores, labels) - right / pairs) < 1e-12);
}

TEST_CASE("AUC refuses what it cannot judge") {
  CHECK_FALSE(ExactAuc({1, 2}, {1, 1}).ok());
  CHECK_FALSE(ExactAuc({1, 2}, {0, 2}).ok());
  CHECK_FALSE(ExactAuc({1, 2, 3}, {0, 1}).ok());
}

TEST_CASE("log loss is the mean binary cross-entropy, stable for large logits") {
  CHECK(std::abs(MeanLogLoss({0.0f}, {1}) - std::log(2.0)) < 1e-12);
  const double z = 2.5;
  const double expected =
      (-std::log(1 / (1 + std::exp(-z))) - std::log(1 - 1 / (1 + std::exp(-z)))) / 2;
  CHECK(std::abs(MeanLogLoss({2.5f, 2.5f}, {1, 0}) - expected) < 1e-9);
  CHECK(MeanLogLoss({100.0f}, {1}) < 1e-40);
  CHECK(std::abs(MeanLogLoss({-100.0f}, {1}) - 100.0) < 1e-9);
}

}  // namespace
}  // namespace paramserver
