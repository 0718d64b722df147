#include "common/checkpoint/safetensors.h"

#include "catch2/catch.hpp"
#include "common/testing/temp_dir.h"

namespace paramserver {
namespace {

std::vector<NamedTensor> SampleTensors() {
  return {{"fc1.weight", {2, 3}, {1.5f, -2.0f, 0.0f, 3.25f, 1e-30f, -7.0f}},
          {"fc1.bias", {2}, {0.5f, -0.5f}}};
}

std::string Header(const std::string& json) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  return out + json;
}

std::string DecodeError(const std::string& bytes) {
  absl::StatusOr<std::vector<NamedTensor>> decoded = DecodeSafetensors(bytes, "w.safetensors");
  REQUIRE_FALSE(decoded.ok());
  CHECK(decoded.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(decoded.status().message());
}

TEST_CASE("safetensors round-trips names, shapes and exact values through a file") {
  TempDir dir;
  REQUIRE(WriteSafetensorsFile(dir.File("w.safetensors"), SampleTensors()).ok());
  absl::StatusOr<std::vector<NamedTensor>> read = ReadSafetensorsFile(dir.File("w.safetensors"));
  REQUIRE(read.ok());
  REQUIRE(read->size() == 2);
  for (const NamedTensor& expected : SampleTensors()) {
    const NamedTensor* found = nullptr;
    for (const NamedTensor& t : *read) {
      if (t.name == expected.name) found = &t;
    }
    REQUIRE(found != nullptr);
    CHECK(found->shape == expected.shape);
    CHECK(found->values == expected.values);  // bit-exact
  }
}

TEST_CASE("the byte layout is the safetensors format") {
  absl::StatusOr<std::string> bytes = EncodeSafetensors({{"b", {1}, {1.0f}}});
  REQUIRE(bytes.ok());
  uint64_t header_size = 0;
  for (int i = 0; i < 8; ++i)
    header_size |= uint64_t{static_cast<unsigned char>((*bytes)[i])} << (8 * i);
  CHECK((8 + header_size) % 8 == 0);
  REQUIRE(bytes->size() == 8 + header_size + 4);
  const std::string header = bytes->substr(8, header_size);
  CHECK(header.find(R"("b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})") !=
        std::string::npos);
  CHECK(bytes->substr(8 + header_size) == std::string("\x00\x00\x80\x3f", 4));  // 1.0f LE
}

TEST_CASE("I64 tensors (an embedding table's ids) round-trip next to F32 ones") {
  NamedTensor ids{"C1.ids", {3}, {}, TensorDtype::kI64, {5, -1, int64_t{1} << 40}};
  NamedTensor weight{"C1.weight", {3, 2}, {1, 2, 3, 4, 5, 6}};
  absl::StatusOr<std::string> bytes = EncodeSafetensors({ids, weight});
  REQUIRE(bytes.ok());
  CHECK(bytes->find(R"("C1.ids":{"dtype":"I64","shape":[3],"data_offsets":[0,24]})") !=
        std::string::npos);
  absl::StatusOr<std::vector<NamedTensor>> decoded = DecodeSafetensors(*bytes, "t");
  REQUIRE(decoded.ok());
  REQUIRE(decoded->size() == 2);
  CHECK((*decoded)[0].dtype == TensorDtype::kI64);
  CHECK((*decoded)[0].int_values == ids.int_values);
  CHECK((*decoded)[1].values == weight.values);
  CHECK(DecodeError(Header(R"({"w":{"dtype":"I64","shape":[2],"data_offsets":[0,12]}})") +
                    std::string(12, '\0'))
            .find("needs 16 bytes") != std::string::npos);
}

TEST_CASE("corrupt safetensors files are rejected with the reason") {
  CHECK(DecodeError("abc").find("only 3 bytes") != std::string::npos);
  CHECK(DecodeError(std::string("\xff\xff\xff\xff\x00\x00\x00\x00{}", 10))
            .find("runs past the end") != std::string::npos);
  CHECK(DecodeError(Header("{not json")).find("not a JSON object") != std::string::npos);
  CHECK(DecodeError(Header(R"({"w":{"dtype":"F16","shape":[1],"data_offsets":[0,2]}})") + "xx")
            .find("only F32 and I64 are supported") != std::string::npos);
  CHECK(DecodeError(Header(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})") + "1234")
            .find("tensor 'w' has data_offsets [0, 8]") != std::string::npos);
  CHECK(
      DecodeError(Header(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})") + "12345678")
          .find("needs 8 bytes") != std::string::npos);
  CHECK(DecodeError(Header(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})") + "1234")
            .find("bad dimension") != std::string::npos);
  CHECK(DecodeError(Header(R"({"w":{"shape":[1]}})")).find("lacks dtype") != std::string::npos);
  // 2^40 * 2^40 * 2^40 elements overflow 64 bits; the shape is refused for its size,
  // not wrapped around to a small count.
  CHECK(DecodeError(
            Header(R"({"w":{"dtype":"F32","shape":[1099511627776,1099511627776,1099511627776],)"
                   R"("data_offsets":[0,0]}})"))
            .find("more elements than a 64-bit byte count can address") != std::string::npos);
  // A zero dimension makes an empty tensor, however large the others.
  CHECK(DecodeSafetensors(Header(R"({"w":{"dtype":"F32","shape":[0,1099511627776,1099511627776],)"
                                 R"("data_offsets":[0,0]}})"),
                          "w.safetensors")
            .ok());
  TempDir dir;
  absl::StatusOr<std::string> good = EncodeSafetensors(SampleTensors());
  REQUIRE(good.ok());
  const std::string truncated = dir.WriteFile("t.safetensors", good->substr(0, good->size() - 3));
  absl::StatusOr<std::vector<NamedTensor>> read = ReadSafetensorsFile(truncated);
  REQUIRE_FALSE(read.ok());
  CHECK(std::string(read.status().message()).find(truncated) == 0);
  CHECK(ReadSafetensorsFile(dir.File("absent")).status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("encoding refuses tensors whose values do not fill their shape") {
  CHECK_FALSE(EncodeSafetensors({{"w", {2, 2}, {1.0f}}}).ok());
  CHECK_FALSE(EncodeSafetensors({{"w", {-1, -1}, {1.0f}}}).ok());
  CHECK_FALSE(
      EncodeSafetensors({{"w", {int64_t{1} << 40, int64_t{1} << 40, int64_t{1} << 40}, {1.0f}}})
          .ok());
  CHECK_FALSE(EncodeSafetensors({{"w", {1}, {1.0f}}, {"w", {1}, {2.0f}}}).ok());
}

}  // namespace
}  // namespace paramserver
