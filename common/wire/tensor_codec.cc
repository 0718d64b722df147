#include "common/wire/tensor_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "absl/base/config.h"
#include "absl/strings/str_cat.h"
#include "common/ops/cpu_features.h"

namespace paramserver {

void AppendFloatsLittleEndian(absl::Span<const float> values, std::string* out) {
#ifdef ABSL_IS_LITTLE_ENDIAN
  // One copy; resize() would first fill the new bytes with zeros.
  out->append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
#else
  const size_t old_size = out->size();
  out->resize(old_size + values.size() * sizeof(float));
  char* dst = &(*out)[old_size];
  for (float value : values) {
    uint32_t bits;
    std::memcpy(&bits, &value, 4);
    for (int i = 0; i < 4; ++i) *dst++ = static_cast<char>(bits >> (8 * i));
  }
#endif
}

void DecodeFloatsLittleEndian(absl::string_view bytes, float* out) {
  if (bytes.empty()) return;  // `out` may be null then, which memcpy must not see
#ifdef ABSL_IS_LITTLE_ENDIAN
  std::memcpy(out, bytes.data(), bytes.size());
#else
  for (size_t i = 0; i < bytes.size() / 4; ++i) {
    uint32_t bits = 0;
    for (int b = 0; b < 4; ++b)
      bits |= uint32_t{static_cast<unsigned char>(bytes[4 * i + b])} << (8 * b);
    std::memcpy(&out[i], &bits, 4);
  }
#endif
}

absl::Status DecodeFloatsExactly(absl::string_view bytes, absl::Span<float> out,
                                 absl::string_view what) {
  if (bytes.size() != out.size() * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": expected ", out.size(),
                                                   " float32 values (", out.size() * sizeof(float),
                                                   " bytes), got ", bytes.size(), " bytes"));
  }
  DecodeFloatsLittleEndian(bytes, out.data());
  return absl::OkStatus();
}

void AppendUint32sLittleEndian(absl::Span<const uint32_t> values, std::string* out) {
  for (uint32_t value : values) {
    char bytes[4];
    for (int b = 0; b < 4; ++b) bytes[b] = static_cast<char>(value >> (8 * b));
    out->append(bytes, 4);
  }
}

absl::Status DecodeUint32sExactly(absl::string_view bytes, absl::Span<uint32_t> out,
                                  absl::string_view what) {
  if (bytes.size() != out.size() * sizeof(uint32_t)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expected ", out.size(), " uint32 values (",
                     out.size() * sizeof(uint32_t), " bytes), got ", bytes.size(), " bytes"));
  }
  for (size_t i = 0; i < out.size(); ++i) {
    uint32_t value = 0;
    for (int b = 0; b < 4; ++b)
      value |= uint32_t{static_cast<unsigned char>(bytes[4 * i + b])} << (8 * b);
    out[i] = value;
  }
  return absl::OkStatus();
}

namespace {

uint32_t BitsOf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  return bits;
}

float FloatOf(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

// Drops the low `shift` bits of `value`, rounding to nearest, ties to even.
uint32_t ShiftRoundingToEven(uint32_t value, int shift) {
  const uint32_t kept = value >> shift;
  const uint32_t rest = value & ((uint32_t{1} << shift) - 1);
  const uint32_t half = uint32_t{1} << (shift - 1);
  return kept + ((rest > half || (rest == half && (kept & 1))) ? 1 : 0);
}

// Half-width words are stored little-endian; on a little-endian host that is a plain
// 2-byte copy, which the compiler vectorises together with the conversion.
void StoreHalfWord(uint16_t bits, char* dst) {
#ifdef ABSL_IS_LITTLE_ENDIAN
  std::memcpy(dst, &bits, 2);
#else
  dst[0] = static_cast<char>(bits & 0xFF);
  dst[1] = static_cast<char>(bits >> 8);
#endif
}

uint16_t LoadHalfWord(const char* src) {
#ifdef ABSL_IS_LITTLE_ENDIAN
  uint16_t bits;
  std::memcpy(&bits, src, 2);
  return bits;
#else
  return static_cast<uint16_t>(static_cast<unsigned char>(src[0]) |
                               (static_cast<unsigned char>(src[1]) << 8));
#endif
}

template <typename Encode>
void AppendHalfWords(absl::Span<const float> values, std::string* out, Encode encode) {
  const size_t old_size = out->size();
  out->resize(old_size + values.size() * 2);
  char* dst = &(*out)[old_size];
  for (size_t i = 0; i < values.size(); ++i) StoreHalfWord(encode(values[i]), dst + 2 * i);
}

template <typename Decode>
void DecodeHalfWords(absl::string_view bytes, float* out, Decode decode) {
  for (size_t i = 0; i < bytes.size() / 2; ++i) out[i] = decode(LoadHalfWord(bytes.data() + 2 * i));
}

// The largest exponent field in values[0, n): 0x7F800000 exactly when one of them is
// NaN or infinite. A max reduction, which the compiler vectorises.
uint32_t LargestExponentField(const float* values, size_t n) {
  uint32_t largest = 0;
  for (size_t i = 0; i < n; ++i) largest = std::max(largest, BitsOf(values[i]) & 0x7F800000u);
  return largest;
}

}  // namespace

size_t FirstNonFinite(absl::Span<const float> values) {
  constexpr size_t kBlock = 4096;
  for (size_t begin = 0; begin < values.size(); begin += kBlock) {
    const size_t end = std::min(values.size(), begin + kBlock);
    if (LargestExponentField(values.data() + begin, end - begin) != 0x7F800000u) continue;
    for (size_t i = begin; i < end; ++i) {
      if (!std::isfinite(values[i])) return i;
    }
  }
  return values.size();
}

absl::string_view WireDtypeName(WireDtype dtype) {
  switch (dtype) {
    case WireDtype::kFloat32:
      return "float32";
    case WireDtype::kBfloat16:
      return "bfloat16";
    case WireDtype::kFloat16:
      return "float16";
  }
  return "unknown";
}

absl::StatusOr<WireDtype> ParseWireDtype(absl::string_view name) {
  for (WireDtype dtype : {WireDtype::kFloat32, WireDtype::kBfloat16, WireDtype::kFloat16}) {
    if (name == WireDtypeName(dtype)) return dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown wire dtype '", name, "': use float32, bfloat16 or float16"));
}

size_t WireBytesPerValue(WireDtype dtype) { return dtype == WireDtype::kFloat32 ? 4 : 2; }

uint16_t FloatToBfloat16(float value) {
  const uint32_t bits = BitsOf(value);
  if ((bits & 0x7FFFFFFF) > 0x7F800000)
    return static_cast<uint16_t>((bits >> 16) | 0x0040);  // quiet NaN
  // Infinities are exact; the largest finite values round up to infinity, as they should.
  return static_cast<uint16_t>(ShiftRoundingToEven(bits, 16));
}

float Bfloat16ToFloat(uint16_t bits) { return FloatOf(uint32_t{bits} << 16); }

uint16_t FloatToFloat16(float value) {
  const uint32_t bits = BitsOf(value);
  const uint32_t sign = (bits >> 16) & 0x8000;
  const uint32_t magnitude = bits & 0x7FFFFFFF;
  if (magnitude > 0x7F800000) return static_cast<uint16_t>(sign | 0x7E00);  // NaN
  // 65520 (0x477FF000) is halfway between the largest half, 65504, and 2^16: ties to
  // even go to infinity, and so does everything above.
  if (magnitude >= 0x477FF000) return static_cast<uint16_t>(sign | 0x7C00);
  if (magnitude < 0x38800000) {
    // Below 2^-14, the smallest normal half: a multiple of 2^-24 (subnormal), or zero.
    // Up to 2^-25 (a tie, whose even neighbour is 0) everything rounds to zero.
    if (magnitude <= 0x33000000) return static_cast<uint16_t>(sign);
    const int exponent = static_cast<int>(magnitude >> 23);  // 102..112 here
    const uint32_t significand = (magnitude & 0x7FFFFF) | 0x800000;
    // value = significand * 2^(exponent - 150) = (significand >> (126 - exponent)) * 2^-24
    return static_cast<uint16_t>(sign | ShiftRoundingToEven(significand, 126 - exponent));
  }
  // Normal: rebias the exponent (127 -> 15) and keep 10 of the 23 fraction bits. A
  // carry out of the fraction correctly bumps the exponent.
  return static_cast<uint16_t>(sign | ShiftRoundingToEven(magnitude - (uint32_t{112} << 23), 13));
}

float Float16ToFloat(uint16_t bits) {
  const uint32_t sign = uint32_t{bits & 0x8000u} << 16;
  const uint32_t exponent = (bits >> 10) & 0x1F;
  const uint32_t fraction = bits & 0x3FF;
  if (exponent == 0x1F) return FloatOf(sign | 0x7F800000 | (fraction << 13));  // inf, NaN
  if (exponent == 0) {
    // Zero or subnormal: fraction * 2^-24, exact in float.
    const float magnitude = static_cast<float>(fraction) * 5.9604644775390625e-8f;
    return sign != 0 ? -magnitude : magnitude;
  }
  return FloatOf(sign | ((exponent + 112) << 23) | (fraction << 13));
}

#if defined(__x86_64__)
namespace {

// x86's F16C instructions convert 8 values at a time, rounding to nearest even exactly
// as FloatToFloat16 does (the tests compare every path).
__attribute__((target("avx,f16c"))) void EncodeFloat16WithF16c(const float* in, size_t n,
                                                               char* out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i half =
        _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), half);
  }
  for (; i < n; ++i) StoreHalfWord(FloatToFloat16(in[i]), out + 2 * i);
}

__attribute__((target("avx,f16c"))) void DecodeFloat16WithF16c(const char* in, size_t n,
                                                               float* out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(half));
  }
  for (; i < n; ++i) out[i] = Float16ToFloat(LoadHalfWord(in + 2 * i));
}

bool HasF16c() { return UsableCpuFeatures().f16c; }

}  // namespace
#endif

void AppendEncoded(WireDtype dtype, absl::Span<const float> values, std::string* out) {
  switch (dtype) {
    case WireDtype::kFloat32:
      AppendFloatsLittleEndian(values, out);
      return;
    case WireDtype::kBfloat16:
      AppendHalfWords(values, out, FloatToBfloat16);
      return;
    case WireDtype::kFloat16:
#if defined(__x86_64__)
      if (HasF16c()) {
        const size_t old_size = out->size();
        out->resize(old_size + values.size() * 2);
        EncodeFloat16WithF16c(values.data(), values.size(), &(*out)[old_size]);
        return;
      }
#endif
      AppendHalfWords(values, out, FloatToFloat16);
      return;
  }
}

absl::Status CheckWireSize(WireDtype dtype, size_t bytes, size_t values, absl::string_view what) {
  const size_t width = WireBytesPerValue(dtype);
  if (bytes == values * width) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, ": expected ", values, " ",
                                                 WireDtypeName(dtype), " values (", values * width,
                                                 " bytes), got ", bytes, " bytes"));
}

absl::Status DecodeExactly(WireDtype dtype, absl::string_view bytes, absl::Span<float> out,
                           absl::string_view what) {
  if (absl::Status size = CheckWireSize(dtype, bytes.size(), out.size(), what); !size.ok())
    return size;
  switch (dtype) {
    case WireDtype::kFloat32:
      DecodeFloatsLittleEndian(bytes, out.data());
      break;
    case WireDtype::kBfloat16:
      DecodeHalfWords(bytes, out.data(), Bfloat16ToFloat);
      break;
    case WireDtype::kFloat16:
#if defined(__x86_64__)
      if (HasF16c()) {
        DecodeFloat16WithF16c(bytes.data(), out.size(), out.data());
        break;
      }
#endif
      DecodeHalfWords(bytes, out.data(), Float16ToFloat);
      break;
  }
  return absl::OkStatus();
}

}  // namespace paramserver
