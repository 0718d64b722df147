// libFuzzer target: safetensors files (model.init_from, and the weights a job writes).
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "common/checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)paramserver::DecodeSafetensors(absl::string_view(reinterpret_cast<const char*>(data), size),
                                       "fuzzed");
  return 0;
}
