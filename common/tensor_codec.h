// Tensor wire encoding: float32 values as raw little-endian bytes.
#ifndef PARAMSERVER_COMMON_TENSOR_CODEC_H_
#define PARAMSERVER_COMMON_TENSOR_CODEC_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace paramserver {

// Appends values to *out as 4 little-endian bytes each.
void AppendFloatsLittleEndian(absl::Span<const float> values, std::string* out);

// Decodes bytes.size() / 4 floats into out. REQUIRES: bytes.size() % 4 == 0 and out
// has room for them.
void DecodeFloatsLittleEndian(absl::string_view bytes, float* out);

// Decodes exactly out.size() floats; INVALID_ARGUMENT naming `what` and both sizes
// when bytes has another length.
absl::Status DecodeFloatsExactly(absl::string_view bytes, absl::Span<float> out,
                                 absl::string_view what);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_TENSOR_CODEC_H_
