// Tensor wire encoding: float32 values as raw little-endian bytes, or, to halve the
// bytes on the wire (training.wire_dtype), as bfloat16 or IEEE float16, little-endian,
// rounded to nearest, ties to even.
#ifndef PARAMSERVER_COMMON_WIRE_TENSOR_CODEC_H_
#define PARAMSERVER_COMMON_WIRE_TENSOR_CODEC_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace paramserver {

// How tensors travel between workers and servers. Servers keep float32 values and
// moments whatever travels.
enum class WireDtype {
  kFloat32 = 0,   // exact
  kBfloat16 = 1,  // float32's range, 8 significant bits
  kFloat16 = 2,   // IEEE binary16: 11 significant bits, |x| < 65520 (larger becomes inf)
};

// "float32", "bfloat16", "float16".
absl::string_view WireDtypeName(WireDtype dtype);
// INVALID_ARGUMENT naming the accepted names for anything else.
absl::StatusOr<WireDtype> ParseWireDtype(absl::string_view name);
size_t WireBytesPerValue(WireDtype dtype);

// One value's encoding (exposed for tests): round to nearest, ties to even; NaN stays
// NaN (quiet), infinities stay infinite.
uint16_t FloatToBfloat16(float value);
float Bfloat16ToFloat(uint16_t bits);
uint16_t FloatToFloat16(float value);
float Float16ToFloat(uint16_t bits);

// The index of the first NaN or infinity in `values`, or values.size() when every value
// is finite. Branch-free over blocks, so the compiler vectorises it.
size_t FirstNonFinite(absl::Span<const float> values);

// Appends values to *out in `dtype`, little-endian.
void AppendEncoded(WireDtype dtype, absl::Span<const float> values, std::string* out);

// OK when `bytes` bytes hold exactly `values` values in `dtype`; otherwise
// INVALID_ARGUMENT naming `what` and both sizes.
absl::Status CheckWireSize(WireDtype dtype, size_t bytes, size_t values, absl::string_view what);

// Decodes exactly out.size() values encoded in `dtype`; CheckWireSize's error when
// bytes has another length.
absl::Status DecodeExactly(WireDtype dtype, absl::string_view bytes, absl::Span<float> out,
                           absl::string_view what);

// Appends values to *out as 4 little-endian bytes each.
void AppendFloatsLittleEndian(absl::Span<const float> values, std::string* out);

// Decodes bytes.size() / 4 floats into out. REQUIRES: bytes.size() % 4 == 0 and out
// has room for them.
void DecodeFloatsLittleEndian(absl::string_view bytes, float* out);

// Decodes exactly out.size() floats; INVALID_ARGUMENT naming `what` and both sizes
// when bytes has another length.
absl::Status DecodeFloatsExactly(absl::string_view bytes, absl::Span<float> out,
                                 absl::string_view what);

// The same pair for uint32 values (a replica's recency links), 4 little-endian bytes each.
void AppendUint32sLittleEndian(absl::Span<const uint32_t> values, std::string* out);
absl::Status DecodeUint32sExactly(absl::string_view bytes, absl::Span<uint32_t> out,
                                  absl::string_view what);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_WIRE_TENSOR_CODEC_H_
