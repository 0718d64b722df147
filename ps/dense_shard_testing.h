// Helpers of the dense shard's tests (testonly): a 3-parameter shard's options and
// values, its pulls, and Adam's first step by hand.
#ifndef PARAMSERVER_PS_DENSE_SHARD_TESTING_H_
#define PARAMSERVER_PS_DENSE_SHARD_TESTING_H_

#include <cmath>
#include <vector>

#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "ps/parameter_shard.h"

namespace paramserver {
namespace dense_shard_testing {

// Returns once a pull is inside the shard's wait (CHECKs it within 30 s), so that what
// the test does next happens to a waiting pull, not before it started.
inline void AwaitOneWaitingPull(const ParameterShard& shard) {
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (shard.waiting_pulls() == 0 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
  CHECK(shard.waiting_pulls() == 1);
}

inline ParameterShardOptions Options(TrainingMode mode, int workers, int staleness = 0) {
  ParameterShardOptions options;
  options.hand_back_log = true;  // the log tests read each call's entries
  options.shard_id = 3;
  options.range = {10, 13};
  options.mode = mode;
  options.num_workers = workers;
  options.staleness = staleness;
  options.optimizer.learning_rate = 0.01;
  options.optimizer.epsilon = 1e-8;
  return options;
}

inline const std::vector<float> kInitial = {1.0f, 2.0f, -3.0f};

inline absl::Time Soon() { return absl::Now() + absl::Milliseconds(50); }

inline std::vector<float> PullValues(ParameterShard& shard, int worker, int64_t step) {
  absl::StatusOr<PulledValues> pulled = shard.Pull(worker, step, Soon());
  REQUIRE(pulled.ok());
  return pulled->values;
}

// Adam's first step moves p by -lr * g / (|g| + eps): derived by hand from the formula
// (m_hat = g, v_hat = g^2 at t = 1).
inline float FirstAdamStep(float p, float g, double lr = 0.01, double eps = 1e-8) {
  return static_cast<float>(p - lr * g / (std::fabs(g) + eps));
}

}  // namespace dense_shard_testing
}  // namespace paramserver

#endif  // PARAMSERVER_PS_DENSE_SHARD_TESTING_H_
