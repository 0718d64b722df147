// A small random MLP problem (parameters, features, labels) for backend tests.
#ifndef PARAMSERVER_WORKER_MLP_TEST_PROBLEM_H_
#define PARAMSERVER_WORKER_MLP_TEST_PROBLEM_H_

#include <cstdint>
#include <random>
#include <vector>

#include "common/model/mlp_parameters.h"
#include "worker/compute_backend.h"

namespace paramserver {

struct MlpTestProblem {
  MlpLayout layout;
  std::vector<float> params;
  std::vector<float> features;
  std::vector<uint8_t> labels;
  BatchView batch() const {
    return {features.data(), labels.data(), static_cast<int64_t>(labels.size())};
  }
};

// Seeded: the same arguments give the same problem. Features in [0, 1).
inline MlpTestProblem MakeMlpTestProblem(std::vector<int64_t> layers, int rows, uint64_t seed) {
  MlpTestProblem p{MlpLayout(layers), {}, {}, {}};
  p.params = InitializeMlpParameters(p.layout, seed);
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  for (int64_t i = 0; i < rows * layers[0]; ++i) p.features.push_back(pixel(generator));
  for (int r = 0; r < rows; ++r)
    p.labels.push_back(static_cast<uint8_t>(generator() % layers.back()));
  return p;
}

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_MLP_TEST_PROBLEM_H_
