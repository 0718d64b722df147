// The wire encodings: every half-width value survives a round trip, and encoding
// rounds to the nearest representable value, ties to even, checked against a brute
// force search written here in double precision.
#include "common/wire/tensor_codec.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

// True when `chosen` (decoded) is a nearest representable neighbour of `value`, and
// the even one on a tie. `decode` maps bit patterns to floats; patterns next to
// `chosen_bits` are its neighbours in magnitude.
template <typename Decode>
bool IsNearestTiesToEven(float value, uint16_t chosen_bits, Decode decode) {
  const double target = value;
  const double chosen = decode(chosen_bits);
  const double error = std::fabs(chosen - target);
  for (int delta : {-1, 1}) {
    const int neighbour_bits = static_cast<int>(chosen_bits & 0x7FFF) + delta;
    if (neighbour_bits < 0 || neighbour_bits > 0x7FFF) continue;
    const double neighbour = decode(static_cast<uint16_t>((chosen_bits & 0x8000) | neighbour_bits));
    if (std::isnan(neighbour)) continue;
    const double other = std::isinf(neighbour) ? std::numeric_limits<double>::infinity()
                                               : std::fabs(neighbour - target);
    if (other < error) return false;
    if (other == error && (chosen_bits & 1) != 0) return false;  // a tie goes to the even one
  }
  return true;
}

TEST_CASE("every float16 and bfloat16 value survives a round trip; NaN stays NaN") {
  int float16_mismatches = 0, bfloat16_mismatches = 0;
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const float f16 = Float16ToFloat(h), bf16 = Bfloat16ToFloat(h);
    if (std::isnan(f16)) {
      float16_mismatches += !std::isnan(Float16ToFloat(FloatToFloat16(f16)));
    } else {
      float16_mismatches += FloatToFloat16(f16) != h;
    }
    if (std::isnan(bf16)) {
      bfloat16_mismatches += !std::isnan(Bfloat16ToFloat(FloatToBfloat16(bf16)));
    } else {
      bfloat16_mismatches += FloatToBfloat16(bf16) != h;
    }
  }
  CHECK(float16_mismatches == 0);
  CHECK(bfloat16_mismatches == 0);
}

TEST_CASE("float16 encoding at the edges: ties, subnormals, overflow") {
  CHECK(FloatToFloat16(1.0f) == 0x3C00);
  CHECK(FloatToFloat16(1.0f + std::ldexp(1.0f, -11)) == 0x3C00);      // tie: to the even 1.0
  CHECK(FloatToFloat16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3C02);  // tie: to the even 1+2^-9
  CHECK(FloatToFloat16(65504.0f) == 0x7BFF);                          // the largest half
  CHECK(FloatToFloat16(65519.99f) == 0x7BFF);
  CHECK(FloatToFloat16(65520.0f) == 0x7C00);  // tie with 2^16: to infinity
  CHECK(FloatToFloat16(-1e30f) == 0xFC00);
  CHECK(FloatToFloat16(std::ldexp(1.0f, -24)) == 0x0001);  // the smallest subnormal
  CHECK(FloatToFloat16(std::ldexp(1.0f, -25)) == 0x0000);  // tie with 0: to 0
  CHECK(FloatToFloat16(std::ldexp(1.5f, -25)) == 0x0001);
  CHECK(FloatToFloat16(std::ldexp(3.0f, -25)) == 0x0002);  // 1.5 units: tie, to the even 2
  CHECK(FloatToFloat16(std::ldexp(1.0f, -14)) == 0x0400);  // the smallest normal
  CHECK(FloatToFloat16(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -30)) ==
        0x0400);  // rounds up into it
  CHECK(FloatToFloat16(-0.0f) == 0x8000);
  CHECK(Float16ToFloat(0x0001) == std::ldexp(1.0f, -24));
  CHECK(std::isinf(Float16ToFloat(0x7C00)));
}

TEST_CASE("bfloat16 encoding at the edges") {
  CHECK(FloatToBfloat16(1.0f) == 0x3F80);
  CHECK(FloatToBfloat16(1.0f + std::ldexp(1.0f, -8)) == 0x3F80);        // tie: to even
  CHECK(FloatToBfloat16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3F82);    // tie: to even
  CHECK(FloatToBfloat16(std::numeric_limits<float>::max()) == 0x7F80);  // rounds to inf
  CHECK(FloatToBfloat16(-std::numeric_limits<float>::infinity()) == 0xFF80);
  CHECK(std::isnan(Bfloat16ToFloat(FloatToBfloat16(std::numeric_limits<float>::quiet_NaN()))));
  // A signalling NaN whose payload sits only in the dropped bits must not become inf.
  uint32_t signalling = 0x7F800001;
  float nan_value;
  std::memcpy(&nan_value, &signalling, 4);
  CHECK(std::isnan(Bfloat16ToFloat(FloatToBfloat16(nan_value))));
}

TEST_CASE("encoding rounds random values to the nearest representable one, ties to even") {
  std::mt19937 generator(7);
  std::uniform_real_distribution<float> exponent(-30.0f, 17.0f), unit(1.0f, 2.0f);
  int float16_wrong = 0, bfloat16_wrong = 0;
  for (int i = 0; i < 200000; ++i) {
    float value = std::ldexp(unit(generator), static_cast<int>(exponent(generator)));
    if (i % 2) value = -value;
    if (std::fabs(value) < 65504.0f)
      float16_wrong += !IsNearestTiesToEven(value, FloatToFloat16(value), Float16ToFloat);
    bfloat16_wrong += !IsNearestTiesToEven(value, FloatToBfloat16(value), Bfloat16ToFloat);
  }
  CHECK(float16_wrong == 0);
  CHECK(bfloat16_wrong == 0);
}

TEST_CASE("whole tensors encode as their values one by one do, on every code path") {
  // AppendEncoded may take a vector path (F16C on x86); it must agree with the scalar
  // conversion bit for bit, tails included.
  std::vector<float> values;
  std::mt19937 generator(3);
  std::uniform_real_distribution<float> exponent(-28.0f, 17.0f), unit(1.0f, 2.0f);
  for (int i = 0; i < 100003; ++i)
    values.push_back((i % 2 ? -1 : 1) *
                     std::ldexp(unit(generator), static_cast<int>(exponent(generator))));
  values.push_back(65520.0f);
  values.push_back(std::ldexp(1.0f, -25));
  for (WireDtype dtype : {WireDtype::kBfloat16, WireDtype::kFloat16}) {
    std::string bytes;
    AppendEncoded(dtype, values, &bytes);
    REQUIRE(bytes.size() == values.size() * 2);
    std::vector<float> decoded(values.size());
    REQUIRE(DecodeExactly(dtype, bytes, absl::MakeSpan(decoded), "values").ok());
    int wrong = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      uint16_t bits;
      std::memcpy(&bits, bytes.data() + 2 * i, 2);  // little-endian hosts only, as the suite runs
      const uint16_t expected =
          dtype == WireDtype::kFloat16 ? FloatToFloat16(values[i]) : FloatToBfloat16(values[i]);
      const float expected_value =
          dtype == WireDtype::kFloat16 ? Float16ToFloat(expected) : Bfloat16ToFloat(expected);
      wrong += bits != expected || decoded[i] != expected_value;
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("FirstNonFinite finds the first NaN or infinity, wherever it is") {
  std::vector<float> values(5000, 1.5f);
  CHECK(FirstNonFinite(values) == values.size());
  values[4097] = -std::numeric_limits<float>::infinity();
  values[4500] = std::numeric_limits<float>::quiet_NaN();
  CHECK(FirstNonFinite(values) == 4097);
  values[3] = std::numeric_limits<float>::quiet_NaN();
  CHECK(FirstNonFinite(values) == 3);
  CHECK(FirstNonFinite({}) == 0);
  values.assign(10, std::numeric_limits<float>::max());  // large but finite
  CHECK(FirstNonFinite(values) == 10);
}

TEST_CASE("decoding checks the length against the dtype's width") {
  std::vector<float> out(3);
  std::string bytes;
  AppendEncoded(WireDtype::kBfloat16, {0.5f, -2.0f, 3.0f}, &bytes);
  REQUIRE(bytes.size() == 6);
  REQUIRE(DecodeExactly(WireDtype::kBfloat16, bytes, absl::MakeSpan(out), "values").ok());
  CHECK(out == std::vector<float>{0.5f, -2.0f, 3.0f});
  absl::Status wrong =
      DecodeExactly(WireDtype::kFloat32, bytes, absl::MakeSpan(out), "values of shard 2");
  CHECK(wrong.code() == absl::StatusCode::kInvalidArgument);
  CHECK(wrong.message() == "values of shard 2: expected 3 float32 values (12 bytes), got 6 bytes");
  // Found by tests/fuzz: nothing into nothing (a null destination) is fine.
  CHECK(DecodeFloatsExactly("", absl::Span<float>(), "empty").ok());
  CHECK(ParseWireDtype("float16").value() == WireDtype::kFloat16);
  CHECK(ParseWireDtype("fp8").status().message() ==
        "unknown wire dtype 'fp8': use float32, bfloat16 or float16");
}

TEST_CASE(
    "uint32 values go as 4 little-endian bytes each and come back; other lengths are refused") {
  const std::vector<uint32_t> values = {0, 1, 0x01020304u, 0xffffffffu};
  std::string bytes;
  AppendUint32sLittleEndian(values, &bytes);
  REQUIRE(bytes.size() == 16);
  CHECK(bytes.substr(8, 4) == std::string("\x04\x03\x02\x01", 4));
  std::vector<uint32_t> back(4);
  REQUIRE(DecodeUint32sExactly(bytes, absl::MakeSpan(back), "links").ok());
  CHECK(back == values);
  std::vector<uint32_t> three(3);
  CHECK(DecodeUint32sExactly(bytes, absl::MakeSpan(three), "links").message() ==
        "links: expected 3 uint32 values (12 bytes), got 16 bytes");
}

}  // namespace
}  // namespace paramserver
