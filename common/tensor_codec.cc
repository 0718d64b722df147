#include "common/tensor_codec.h"

#include <cstring>

#include "absl/base/config.h"
#include "absl/strings/str_cat.h"

namespace paramserver {

void AppendFloatsLittleEndian(absl::Span<const float> values, std::string* out) {
  const size_t old_size = out->size();
  out->resize(old_size + values.size() * sizeof(float));
  char* dst = &(*out)[old_size];
#ifdef ABSL_IS_LITTLE_ENDIAN
  std::memcpy(dst, values.data(), values.size() * sizeof(float));
#else
  for (float value : values) {
    uint32_t bits;
    std::memcpy(&bits, &value, 4);
    for (int i = 0; i < 4; ++i) *dst++ = static_cast<char>(bits >> (8 * i));
  }
#endif
}

void DecodeFloatsLittleEndian(absl::string_view bytes, float* out) {
#ifdef ABSL_IS_LITTLE_ENDIAN
  std::memcpy(out, bytes.data(), bytes.size());
#else
  for (size_t i = 0; i < bytes.size() / 4; ++i) {
    uint32_t bits = 0;
    for (int b = 0; b < 4; ++b) bits |= uint32_t{static_cast<unsigned char>(bytes[4 * i + b])} << (8 * b);
    std::memcpy(&out[i], &bits, 4);
  }
#endif
}

absl::Status DecodeFloatsExactly(absl::string_view bytes, absl::Span<float> out,
                                 absl::string_view what) {
  if (bytes.size() != out.size() * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": expected ", out.size(), " float32 values (",
                                                   out.size() * sizeof(float), " bytes), got ",
                                                   bytes.size(), " bytes"));
  }
  DecodeFloatsLittleEndian(bytes, out.data());
  return absl::OkStatus();
}

}  // namespace paramserver
