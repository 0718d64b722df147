// Global-norm clipping against torch.nn.utils.clip_grad_norm_'s arithmetic, worked by
// hand: norm 5 (a 3-4-0 gradient), max_norm 1 scales by 1 / (5 + 1e-6) in float32.
#include "worker/gradient_clipping.h"

#include <cmath>
#include <limits>
#include <vector>

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

TEST_CASE("ClipCoefficient is torch's min(1, max_norm / (norm + 1e-6)) in float32") {
  const float expected = (1.0f / (5.0f + 1e-6f)) * 1.0f;
  CHECK(ClipCoefficient(1.0, 25.0) == expected);
  CHECK(ClipCoefficient(10.0, 25.0) == 1.0f);  // under the bound: unscaled
  // At the bound itself torch still scales by max_norm / (norm + 1e-6) < 1.
  CHECK(ClipCoefficient(5.0, 25.0) < 1.0f);
  CHECK(ClipCoefficient(5.0, 25.0) == (1.0f / (5.0f + 1e-6f)) * 5.0f);
  CHECK(ClipCoefficient(1.0, 0.0) == 1.0f);  // a zero gradient stays zero
}

TEST_CASE("ClipGradientInPlace scales a gradient over the bound and leaves one under it") {
  std::vector<float> over = {3, 4, 0};
  REQUIRE(ClipGradientInPlace(0, 1.0, absl::MakeSpan(over)).ok());
  const float scale = (1.0f / (5.0f + 1e-6f)) * 1.0f;
  CHECK(over[0] == 3 * scale);
  CHECK(over[1] == 4 * scale);
  CHECK(over[2] == 0);
  const double norm = std::sqrt(double{over[0]} * over[0] + double{over[1]} * over[1]);
  CHECK(norm == Approx(1.0).epsilon(1e-6));

  std::vector<float> under = {0.3f, 0.4f};
  REQUIRE(ClipGradientInPlace(0, 1.0, absl::MakeSpan(under)).ok());
  CHECK(under == std::vector<float>{0.3f, 0.4f});
}

TEST_CASE("a norm that overflows float32 is a divergence, not a zeroed step") {
  const double huge = 1e39 * 1e39;  // sqrt: 1e39, past float32's range
  absl::StatusOr<float> coefficient = StepClipCoefficient(7, 1.0, huge);
  REQUIRE(!coefficient.ok());
  CHECK(coefficient.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(coefficient.status().message()),
             Catch::Contains("training diverged at step 7"));
  // One float32 maximum has a finite norm; two have a norm of 4.8e38, past float32's.
  std::vector<float> largest = {std::numeric_limits<float>::max()};
  CHECK(ClipGradientInPlace(3, 1.0, absl::MakeSpan(largest)).ok());
  CHECK(largest[0] > 0);
  CHECK(largest[0] <= 1.0f);
  std::vector<float> overflowing = {std::numeric_limits<float>::max(),
                                    std::numeric_limits<float>::max()};
  CHECK(!ClipGradientInPlace(3, 1.0, absl::MakeSpan(overflowing)).ok());
}

}  // namespace
}  // namespace paramserver
