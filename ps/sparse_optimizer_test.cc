#include "ps/sparse_optimizer.h"

#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "catch2/catch.hpp"
#include "common/ops/cpu_features.h"
#include "ps/embedding_table.h"

namespace paramserver {
namespace {

// sqrt(FLT_MAX) = 1.8446744e19; the accepted limit is FLT_MAX * (1 - 2^-10) = 3.39950e38.
// 3.5e19^2 = 1.225e39 and 1e20^2 = 1e40 overflow float32; 1.8e19^2 = 3.24e38 does not.

RowUpdate UpdateOf(EmbeddingOptimizerType type, double learning_rate = 0.01) {
  EmbeddingOptimizerOptions options;
  options.type = type;
  options.learning_rate = learning_rate;
  return PrepareRowUpdate(options, /*step=*/1);
}

TEST_CASE("adam and adagrad rows refuse a gradient whose square overflows float32") {
  for (EmbeddingOptimizerType type :
       {EmbeddingOptimizerType::kAdam, EmbeddingOptimizerType::kAdagrad}) {
    const RowUpdate update = UpdateOf(type);
    const int state_floats = StateFloatsPerRow(type, 3);
    std::vector<float> row = {0.5f, -0.5f, 0.25f};
    std::vector<float> state(state_floats, 0.0f);
    CHECK(FirstUnsafeElement(update, std::vector<float>{1, 1e20f, 1}, row, state) == 1);
    CHECK(FirstUnsafeElement(update, std::vector<float>{1, 1, -3.5e19f}, row, state) == 2);
    CHECK(FirstUnsafeElement(update, std::vector<float>{3.5e19f, 1e20f, 1}, row, state) == 0);
    const std::vector<float> large = {1.8e19f, -1.8e19f, 1};
    REQUIRE(FirstUnsafeElement(update, large, row, state) == 3);
    ApplyRowUpdate(update, large, absl::MakeSpan(row), absl::MakeSpan(state));
    for (float x : state) CHECK(std::isfinite(x));
    for (float x : row) CHECK(std::isfinite(x));
    if (type == EmbeddingOptimizerType::kAdagrad) {
      CHECK(state[0] == 1.8e19f * 1.8e19f);  // the sum of squares: 3.24e38
    } else {
      CHECK(state[0] == Approx(1.8e18));   // SparseAdam's m = 0.1 * g
      CHECK(state[3] == Approx(3.24e35));  // v = 0.001 * g^2
    }
  }
}

TEST_CASE("adagrad's sum of squares must stay in range against its present value") {
  // From a sum of 3.0e38: g = 1.8e19 (g^2 = 3.24e38, accepted alone) makes 6.24e38, +Inf
  // in float32; g = 6e18 makes 3.36e38 and g = 6.3e18 makes 3.3969e38, both below the
  // limit 3.39950e38; g = 6.4e18 makes 3.4096e38, past FLT_MAX: +Inf.
  const RowUpdate update = UpdateOf(EmbeddingOptimizerType::kAdagrad);
  const std::vector<float> row = {0, 0, 0, 0};
  const std::vector<float> sum = {3.0e38f, 3.0e38f, 3.0e38f, 3.0e38f};
  CHECK(FirstUnsafeElement(update, std::vector<float>{1, 6.3e18f, 1.8e19f, 0}, row, sum) == 2);
  CHECK(FirstUnsafeElement(update, std::vector<float>{6e18f, 6.3e18f, 6.4e18f, 0}, row, sum) == 2);
  CHECK(FirstUnsafeElement(update, std::vector<float>{6e18f, -6.3e18f, 1, 0}, row, sum) == 4);
  // The same gradient a fresh row (sum 0) takes.
  CHECK(FirstUnsafeElement(update, std::vector<float>{1, 6.3e18f, 1.8e19f, 0}, row,
                           std::vector<float>(4, 0.0f)) == 4);
}

TEST_CASE("sgd squares nothing but refuses a step that would make the parameter Inf") {
  // lr 0.01: even FLT_MAX moves a row by 3.4e36, in range; lr 10: 1e38 moves it by 1e39.
  const std::vector<float> row = {1, 1};
  CHECK(FirstUnsafeElement(UpdateOf(EmbeddingOptimizerType::kSgd),
                           std::vector<float>{1e20f, FLT_MAX}, row, {}) == 2);
  CHECK(FirstUnsafeElement(UpdateOf(EmbeddingOptimizerType::kSgd, 10.0),
                           std::vector<float>{1e20f, 1e38f}, row, {}) == 1);
}

// The options of `type` with every setting away from its default, so that each scalar
// of the update takes part.
EmbeddingOptimizerOptions NonDefaultOptions(EmbeddingOptimizerType type) {
  EmbeddingOptimizerOptions options;
  options.type = type;
  options.learning_rate = 0.037;
  options.beta1 = 0.8;
  options.beta2 = 0.97;
  options.epsilon = 1e-3;
  options.initial_accumulator_value = 0.1;
  options.learning_rate_power = -0.6;
  options.l1 = 0.02;  // some FTRL elements land on exactly 0
  options.l2 = 0.3;
  options.beta = 0.5;
  return options;
}

// NonDefaultOptions of every optimizer, FTRL twice: with lr_power -0.6 (powf) and with
// -0.5 (its square-root kernels).
std::vector<EmbeddingOptimizerOptions> EveryOptimizersOptions() {
  std::vector<EmbeddingOptimizerOptions> every;
  for (EmbeddingOptimizerType type :
       {EmbeddingOptimizerType::kAdam, EmbeddingOptimizerType::kAdagrad,
        EmbeddingOptimizerType::kSgd, EmbeddingOptimizerType::kRowwiseAdagrad,
        EmbeddingOptimizerType::kFtrl}) {
    every.push_back(NonDefaultOptions(type));
  }
  every.push_back(NonDefaultOptions(EmbeddingOptimizerType::kFtrl));
  every.back().learning_rate_power = -0.5;
  return every;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_CASE("batched row updates compute the one-row reference's bits on every instruction set") {
  std::mt19937 random(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> positive(0.0f, 2.0f);
  const CpuFeatures cpu = UsableCpuFeatures();
  INFO("this CPU: avx2 " << cpu.avx2 << ", avx512f " << cpu.avx512f);
  for (const bool baseline : {false, true}) {
    // PS_CPU_BASELINE=1 makes the kernels pick the x86-64 baseline code (read per call).
    if (baseline) setenv("PS_CPU_BASELINE", "1", 1);
    for (const EmbeddingOptimizerOptions& options : EveryOptimizersOptions()) {
      const EmbeddingOptimizerType type = options.type;
      // Widths around every vector length (4, 8, 16 floats), and row counts around the
      // row-wise kernel's groups of 4 and the read-ahead distance.
      for (int dim : {1, 3, 4, 7, 8, 9, 15, 16, 17, 31, 33, 64}) {
        for (int count : {1, 3, 4, 5, 9, 13, 40}) {
          INFO(EmbeddingOptimizerName(type)
               << " lr_power " << options.learning_rate_power << " dim " << dim << " rows " << count
               << " baseline " << baseline);
          const int state_floats = StateFloatsPerRow(type, dim);
          const int slot_floats = dim + state_floats;
          const RowUpdate update = PrepareRowUpdate(options, /*step=*/3);
          std::vector<float> slots(static_cast<size_t>(count) * slot_floats);
          for (int r = 0; r < count; ++r) {
            for (int e = 0; e < slot_floats; ++e) {
              // Rows any sign; state non-negative where it is a sum of squares.
              const bool squares = e >= dim &&
                                   (type != EmbeddingOptimizerType::kFtrl || e < 2 * dim) &&
                                   (type != EmbeddingOptimizerType::kAdam || e >= 2 * dim);
              slots[r * slot_floats + e] = squares ? positive(random) : normal(random);
            }
          }
          std::vector<float> gradients(static_cast<size_t>(count) * dim);
          for (float& g : gradients) g = normal(random);
          // Every third row skipped (a dropped id): its slot must stay as it was.
          std::vector<float*> targets(count);
          for (int r = 0; r < count; ++r) {
            targets[r] = r % 3 == 2 ? nullptr : slots.data() + r * slot_floats;
          }
          std::vector<float> expected = slots;
          for (int r = 0; r < count; ++r) {
            if (targets[r] == nullptr) continue;
            float* slot = expected.data() + r * slot_floats;
            ApplyRowUpdate(update, absl::MakeConstSpan(gradients).subspan(r * dim, dim),
                           absl::MakeSpan(slot, dim), absl::MakeSpan(slot + dim, state_floats));
          }
          ApplyRowUpdates(update, dim, targets, gradients);
          CHECK(SameBits(slots, expected));
        }
      }
    }
  }
  unsetenv("PS_CPU_BASELINE");
}

TEST_CASE("FTRL's default power is the square root, as ApplyFtrl takes it, not powf") {
  // glibc's powf(x, 0.5) is one ulp above sqrtf(x) at this x (about 0.06% of floats).
  const float n = 0x1.63b7f6p+1f;
  volatile float half = 0.5f;  // not folded at compile time: the library's powf
  INFO("powf " << std::pow(n, static_cast<float>(half)) << ", sqrtf " << std::sqrt(n));
  CHECK(std::pow(n, static_cast<float>(half)) != std::sqrt(n));
  EmbeddingOptimizerOptions options = NonDefaultOptions(EmbeddingOptimizerType::kFtrl);
  options.learning_rate_power = -0.5;
  const RowUpdate update = PrepareRowUpdate(options, /*step=*/1);
  // A zero gradient keeps n and z: the new value is (sign(z) l1 - z) / quadratic, whose
  // quadratic holds n's square root.
  constexpr int kWidth = 16;
  const float z = -0.75f;
  const float l1 = static_cast<float>(options.l1), l2 = static_cast<float>(options.l2);
  const float lr = static_cast<float>(options.learning_rate);
  const float beta = static_cast<float>(options.beta);
  const float quadratic = (beta + std::sqrt(n)) / lr + 2.0f * l2;
  const float expected = (-l1 - z) / quadratic;
  std::vector<float> slot(3 * kWidth);
  for (int i = 0; i < kWidth; ++i) {
    slot[i] = 0.25f;           // w
    slot[kWidth + i] = n;      // n
    slot[2 * kWidth + i] = z;  // z
  }
  std::vector<float> reference = slot;
  const std::vector<float> gradient(kWidth, 0.0f);
  ApplyRowUpdate(update, gradient, absl::MakeSpan(reference.data(), kWidth),
                 absl::MakeSpan(reference.data() + kWidth, 2 * kWidth));
  std::vector<float*> targets = {slot.data()};
  ApplyRowUpdates(update, kWidth, targets, gradient);
  for (int i = 0; i < kWidth; ++i) {
    INFO("element " << i);
    CHECK(std::memcmp(&reference[i], &expected, sizeof(float)) == 0);
    CHECK(std::memcmp(&slot[i], &expected, sizeof(float)) == 0);
  }
}

TEST_CASE("the fast row check agrees with FirstUnsafeElement on every instruction set") {
  std::mt19937 random(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> positive(0.0f, 2.0f);
  std::uniform_int_distribution<int> pick(0, 99);
  // Values around every limit: squares that fit (1.8e19) or not (1.9e19 and up), sums
  // and moments pushed past FLT_MAX by a large present state, Inf and NaN.
  const std::vector<float> extremes = {1.8e19f, -1.8e19f, 1.9e19f,  3.5e19f, 1e20f,
                                       FLT_MAX, -FLT_MAX, INFINITY, NAN,     6.4e18f};
  for (const bool baseline : {false, true}) {
    if (baseline) setenv("PS_CPU_BASELINE", "1", 1);  // read when a check is made
    for (EmbeddingOptimizerOptions options : EveryOptimizersOptions()) {
      const EmbeddingOptimizerType type = options.type;
      options.learning_rate = 10.0;  // SGD's step can then overflow the row
      const RowUpdate update = PrepareRowUpdate(options, /*step=*/3);
      int accepted = 0, refused = 0;
      for (int dim : {1, 3, 4, 7, 8, 9, 15, 16, 17, 33}) {
        const RowUpdateCheck check(update, dim);
        const int state_floats = StateFloatsPerRow(type, dim);
        for (int trial = 0; trial < 200; ++trial) {
          std::vector<float> slot(dim + state_floats);
          for (int e = 0; e < dim + state_floats; ++e) {
            slot[e] = e < dim ? normal(random) : positive(random);
            if (pick(random) < 3) slot[e] = 3.0e38f;  // near FLT_MAX
            // State already out of range (a moment or sum the check must not pass on).
            if (e >= dim && pick(random) < 1) slot[e] = pick(random) < 50 ? INFINITY : NAN;
          }
          std::vector<float> gradient(dim);
          for (float& g : gradient) {
            g = pick(random) < 4 ? extremes[pick(random) % extremes.size()] : normal(random);
          }
          const size_t first =
              FirstUnsafeElement(update, gradient, absl::MakeConstSpan(slot.data(), dim),
                                 absl::MakeConstSpan(slot.data() + dim, state_floats));
          INFO(EmbeddingOptimizerName(type)
               << " lr_power " << options.learning_rate_power << " dim " << dim << " trial "
               << trial << " baseline " << baseline << " first " << first);
          const bool fast = check.Accepted(gradient.data(), slot.data());
          CHECK(fast == (first == static_cast<size_t>(dim)));
          (fast ? accepted : refused) += 1;
        }
      }
      // Both answers occur, so the agreement above means something.
      INFO(EmbeddingOptimizerName(type)
           << " lr_power " << options.learning_rate_power << " baseline " << baseline);
      CHECK(accepted > 100);
      CHECK(refused > 100);
    }
  }
  unsetenv("PS_CPU_BASELINE");
}

TEST_CASE("a table checks the rows it holds and the rows it would make") {
  EmbeddingTableOptions options;
  options.dim = 2;
  options.optimizer.type = EmbeddingOptimizerType::kAdagrad;
  EmbeddingTable table(options);
  // Row 5 gets a sum of squares of 3.24e38 in element 1 (1.8e19 accepted).
  REQUIRE(table.FirstUnsafeElement(1, std::vector<int64_t>{5}, std::vector<float>{0, 1.8e19f}) ==
          2);
  REQUIRE(table.Apply(1, std::vector<int64_t>{5}, std::vector<float>{0, 1.8e19f}).ok());
  // On row 5's element 1, 1e18 more (1e36) makes 3.25e38, in range; 6e18 (3.6e37) makes
  // 3.6e38, past FLT_MAX. Row 7 is new: its sum starts at 0, and 1.8e19 is accepted.
  const std::vector<int64_t> ids = {5, 7};
  CHECK(table.FirstUnsafeElement(2, ids, std::vector<float>{1, 1e18f, 1.8e19f, 1}) == 4);
  CHECK(table.FirstUnsafeElement(2, ids, std::vector<float>{1, 6e18f, 1, 1}) == 1);
  CHECK(table.FirstUnsafeElement(2, ids, std::vector<float>{1, 1, 1, 3.5e19f}) == 3);
  CHECK(table.rows() == 1);  // nothing made by the checks
}

}  // namespace
}  // namespace paramserver
