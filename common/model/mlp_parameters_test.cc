#include "common/model/mlp_parameters.h"

#include <cmath>

#include "catch2/catch.hpp"
#include "common/checkpoint/safetensors.h"
#include "common/testing/temp_dir.h"

namespace paramserver {
namespace {

TEST_CASE("the layout follows torch.nn.Linear's names, shapes and order") {
  MlpLayout layout({784, 128, 10});
  REQUIRE(layout.tensors().size() == 4);
  CHECK(layout.tensors()[0].name == "fc1.weight");
  CHECK(layout.tensors()[0].shape == std::vector<int64_t>{128, 784});
  CHECK(layout.tensors()[1].name == "fc1.bias");
  CHECK(layout.tensors()[1].offset == 128 * 784);
  CHECK(layout.tensors()[2].name == "fc2.weight");
  CHECK(layout.tensors()[2].shape == std::vector<int64_t>{10, 128});
  CHECK(layout.tensors()[3].offset == 128 * 784 + 128 + 10 * 128);
  CHECK(layout.total_parameters() == 101770);
}

TEST_CASE("default init is U(-1/sqrt(fan_in), 1/sqrt(fan_in)) and seeded") {
  MlpLayout layout({784, 128, 10});
  std::vector<float> a = InitializeMlpParameters(layout, 1);
  CHECK(a == InitializeMlpParameters(layout, 1));
  CHECK(a != InitializeMlpParameters(layout, 2));
  for (int l = 0; l < layout.num_layers(); ++l) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(layout.layers()[l]));
    double sum = 0, sum_sq = 0, max_abs = 0;
    const TensorSlot& w = layout.weight(l);
    for (int64_t i = 0; i < w.size(); ++i) {
      const double x = a[w.offset + i];
      sum += x;
      sum_sq += x * x;
      max_abs = std::max(max_abs, std::abs(x));
    }
    const double n = static_cast<double>(w.size());
    CHECK(max_abs <= bound);
    CHECK(max_abs > 0.95 * bound);
    CHECK(std::abs(sum / n) < 0.05 * bound);
    // The variance of U(-b, b) is b^2 / 3.
    CHECK(sum_sq / n == Approx(bound * bound / 3).epsilon(0.1));
  }
}

TEST_CASE("parameters save as safetensors and load back exactly") {
  TempDir dir;
  MlpLayout layout({5, 4, 3});
  std::vector<float> params = InitializeMlpParameters(layout, 3);
  REQUIRE(SaveDenseParameters(layout.model(), params, dir.File("w.safetensors")).ok());
  absl::StatusOr<std::vector<float>> loaded =
      LoadDenseParameters(layout.model(), dir.File("w.safetensors"));
  REQUIRE(loaded.ok());
  CHECK(*loaded == params);

  absl::StatusOr<std::vector<float>> wrong_model =
      LoadDenseParameters(MlpLayout({5, 6, 3}).model(), dir.File("w.safetensors"));
  REQUIRE_FALSE(wrong_model.ok());
  CHECK(std::string(wrong_model.status().message())
            .find("'fc1.weight' has shape [4, 5], the model needs [6, 5]") != std::string::npos);
  REQUIRE(WriteSafetensorsFile(dir.File("partial.safetensors"),
                               {{"fc1.weight", {4, 5}, std::vector<float>(20)}})
              .ok());
  absl::StatusOr<std::vector<float>> partial =
      LoadDenseParameters(layout.model(), dir.File("partial.safetensors"));
  REQUIRE_FALSE(partial.ok());
  CHECK(std::string(partial.status().message()).find("'fc1.bias' is missing") != std::string::npos);
}

}  // namespace
}  // namespace paramserver
