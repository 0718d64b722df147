// ModelLayout: tensors laid out back to back, bad layouts refused by name, and the
// safetensors round trip of the flat vector.
#include "common/model/model_layout.h"

#include "catch2/catch.hpp"
#include "common/checkpoint/safetensors.h"
#include "common/testing/temp_dir.h"

namespace paramserver {
namespace {

TEST_CASE("dense tensors are laid out back to back in the given order") {
  absl::StatusOr<ModelLayout> layout = ModelLayout::Create(
      {{"embed.weight", {4, 3}}, {"head.weight", {2, 3}}, {"head.bias", {2}}}, {{"user_id", 8}});
  REQUIRE(layout.ok());
  REQUIRE(layout->dense_tensors().size() == 3);
  CHECK(layout->dense_tensors()[0].offset == 0);
  CHECK(layout->dense_tensors()[1].offset == 12);
  CHECK(layout->dense_tensors()[2].offset == 18);
  CHECK(layout->dense_parameters() == 20);
  CHECK(layout->dense_tensors()[2].name == "head.bias");
  CHECK(layout->dense_tensors()[2].size() == 2);
  REQUIRE(layout->embedding_tables().size() == 1);
  CHECK(layout->embedding_tables()[0].dim == 8);
  CHECK(ModelLayout().dense_parameters() == 0);
}

TEST_CASE("bad layouts are refused, naming the tensor") {
  CHECK(ModelLayout::Create({{"w", {3}}, {"w", {2}}}).status().message() ==
        "the model's tensor name 'w' is empty or repeated");
  CHECK(ModelLayout::Create({{"w", {3, 0}}}).status().message() ==
        "tensor 'w' has shape [3, 0]: every dimension must be >= 1");
  CHECK(ModelLayout::Create({{"w", {int64_t{1} << 40, int64_t{1} << 40}}}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(ModelLayout::Create({{"w", {3}}}, {{"w", 4}}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(ModelLayout::Create({}, {{"ids", 0}}).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("the flat vector round-trips through a safetensors file by tensor name") {
  TempDir dir;
  const ModelLayout layout = *ModelLayout::Create({{"a", {2, 2}}, {"b", {3}}});
  const std::vector<float> params = {1, 2, 3, 4, 5, 6, 7};
  REQUIRE(SaveDenseParameters(layout, params, dir.File("w.safetensors")).ok());
  absl::StatusOr<std::vector<NamedTensor>> file = ReadSafetensorsFile(dir.File("w.safetensors"));
  REQUIRE(file.ok());
  REQUIRE(file->size() == 2);
  // Loaded by name, whatever order the file keeps them in.
  const ModelLayout swapped = *ModelLayout::Create({{"b", {3}}, {"a", {2, 2}}});
  absl::StatusOr<std::vector<float>> loaded =
      LoadDenseParameters(swapped, dir.File("w.safetensors"));
  REQUIRE(loaded.ok());
  CHECK(*loaded == std::vector<float>{5, 6, 7, 1, 2, 3, 4});
  const ModelLayout other = *ModelLayout::Create({{"a", {4}}, {"b", {3}}});
  CHECK(LoadDenseParameters(other, dir.File("w.safetensors"))
            .status()
            .message()
            .find("tensor 'a' has shape [2, 2], the model needs [4]") != absl::string_view::npos);
}

TEST_CASE("buffers follow the parameters; an int64 buffer is written as I64 and read back") {
  absl::StatusOr<ModelLayout> refused = ModelLayout::Create(
      {{"bn.running_mean", {2}, DenseTensorKind::kFloatBuffer}, {"fc.weight", {2}}});
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(std::string(refused.status().message()),
             Catch::Contains("parameter 'fc.weight' follows a buffer"));
  absl::StatusOr<ModelLayout> layout =
      ModelLayout::Create({{"fc.weight", {2}},
                           {"bn.running_mean", {2}, DenseTensorKind::kFloatBuffer},
                           {"bn.num_batches_tracked", {1}, DenseTensorKind::kIntegerBuffer}});
  REQUIRE(layout.ok());
  const std::vector<float> flat = {0.5f, -1, 0.25f, 3, 41.9999f};
  const std::vector<NamedTensor> tensors = DenseTensorsOf(*layout, flat);
  REQUIRE(tensors.size() == 3);
  CHECK(tensors[1].dtype == TensorDtype::kF32);
  CHECK(tensors[2].dtype == TensorDtype::kI64);
  CHECK(tensors[2].int_values == std::vector<int64_t>{42});  // the nearest integer
  TempDir dir;
  const std::string path = dir.File("weights.safetensors");
  REQUIRE(SaveDenseParameters(*layout, flat, path).ok());
  absl::StatusOr<std::vector<float>> loaded = LoadDenseParameters(*layout, path);
  REQUIRE(loaded.ok());
  CHECK(*loaded == std::vector<float>{0.5f, -1, 0.25f, 3, 42});
  // An integer past what a float32 holds exactly is refused by name.
  NamedTensor big = tensors[2];
  big.int_values = {(int64_t{1} << 24) + 1};
  REQUIRE(WriteSafetensorsFile(path, {tensors[0], tensors[1], big}).ok());
  loaded = LoadDenseParameters(*layout, path);
  REQUIRE_FALSE(loaded.ok());
  CHECK_THAT(std::string(loaded.status().message()),
             Catch::Contains("integer buffer 'bn.num_batches_tracked' holds 16777217"));
}

}  // namespace
}  // namespace paramserver
