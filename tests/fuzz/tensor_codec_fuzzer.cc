// libFuzzer target: tensor decoding in every wire encoding (gradients and values as
// peers send them).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/wire/tensor_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const absl::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  // A destination of the size the bytes hold in one encoding, and a wrong size.
  std::vector<float> out(data[0] % 2 == 0 ? bytes.size() / 2 : bytes.size() / 4 + data[0] % 3);
  for (paramserver::WireDtype dtype :
       {paramserver::WireDtype::kFloat32, paramserver::WireDtype::kBfloat16,
        paramserver::WireDtype::kFloat16}) {
    (void)paramserver::DecodeExactly(dtype, bytes, absl::MakeSpan(out), "fuzzed tensor");
  }
  (void)paramserver::DecodeFloatsExactly(bytes, absl::MakeSpan(out), "fuzzed tensor");
  (void)paramserver::FirstNonFinite(out);
  return 0;
}
