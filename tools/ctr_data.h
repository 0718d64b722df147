// Click-through-rate data you can run on a fresh machine: Criteo-format files drawn from
// a planted model, so the best achievable AUC is known.
//
// The planted model: logit = bias + sum_j a_j * log(1 + max(I_j, 0)) / 4 + sum_k w_k(C_k),
// label ~ Bernoulli(sigmoid(logit)). Categorical values follow a Zipf law over each
// field's vocabulary (ranks mapped to ids spread over the 32-bit space), as real CTR data
// does; dense values are log-normal integers (a few negative, as in Criteo's); both kinds
// go missing at `missing_rate`. Every random draw is a hash of (seed, what, index)
// (SplitMix64 and Box-Muller of our own, not the standard library's distributions), so
// the same seed gives the same bytes on any machine.
#ifndef PARAMSERVER_TOOLS_CTR_DATA_H_
#define PARAMSERVER_TOOLS_CTR_DATA_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace paramserver {

struct CtrDataOptions {
  uint64_t seed = 1;
  int64_t train_examples = 200000;
  int64_t test_examples = 20000;
  int dense_features = 13;
  int categorical_features = 26;
  int64_t vocabulary = 100000;  // distinct values per categorical field
  double zipf_exponent = 1.1;
  double missing_rate = 0.05;
};

struct CtrDataSummary {
  int64_t train_examples = 0;
  int64_t test_examples = 0;
  double test_positive_rate = 0;
  // The planted model's own AUC on the test file: no model can expect to do better.
  double best_test_auc = 0;
};

// Writes `train_path` and `test_path` (gzip'd when the name ends in .gz). INVALID_ARGUMENT
// for options out of range; UNAVAILABLE naming a file that cannot be written.
absl::StatusOr<CtrDataSummary> WriteCtrData(const CtrDataOptions& options,
                                            const std::string& train_path,
                                            const std::string& test_path);

}  // namespace paramserver

#endif  // PARAMSERVER_TOOLS_CTR_DATA_H_
