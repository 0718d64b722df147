// A server's tally of the gradients its shards refused for their values: the figures
// behind ps_refused_gradients_total and the heartbeat's refused_gradients.
#ifndef PARAMSERVER_PS_GRADIENT_REFUSALS_H_
#define PARAMSERVER_PS_GRADIENT_REFUSALS_H_

#include <array>
#include <atomic>
#include <cstdint>

namespace paramserver {

// Why a shard refused a push's values (its shape, worker and step were fine).
enum class GradientRefusal {
  kNonFinite,  // a NaN or an Inf
  kOverflow,   // a value the optimizer's state cannot hold (ps/optimizer_state_limit.h)
  kNorm,       // an L2 norm above training.max_gradient_norm
};
inline constexpr GradientRefusal kGradientRefusals[] = {
    GradientRefusal::kNonFinite, GradientRefusal::kOverflow, GradientRefusal::kNorm};

// "nonfinite", "overflow", "norm": the metric's reason label.
inline const char* GradientRefusalName(GradientRefusal reason) {
  switch (reason) {
    case GradientRefusal::kNonFinite:
      return "nonfinite";
    case GradientRefusal::kOverflow:
      return "overflow";
    case GradientRefusal::kNorm:
      return "norm";
  }
  return "unknown";
}

// Thread-safe (lock-free). Counts over every shard a server has held: shards come and
// go with shard maps, the server's count only grows.
class GradientRefusalCounts {
 public:
  void Count(GradientRefusal reason) {
    counts_[static_cast<int>(reason)].fetch_add(1, std::memory_order_relaxed);
  }
  int64_t count(GradientRefusal reason) const {
    return counts_[static_cast<int>(reason)].load(std::memory_order_relaxed);
  }
  int64_t total() const {
    int64_t sum = 0;
    for (GradientRefusal reason : kGradientRefusals) sum += count(reason);
    return sum;
  }

 private:
  std::array<std::atomic<int64_t>, 3> counts_{};
};

}  // namespace paramserver

#endif  // PARAMSERVER_PS_GRADIENT_REFUSALS_H_
