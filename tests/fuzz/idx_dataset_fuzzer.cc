// libFuzzer target: IDX image and label files (data.train_images and friends).
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "worker/idx_dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  (void)paramserver::ParseIdxImages(bytes, "fuzzed");
  (void)paramserver::ParseIdxLabels(bytes, "fuzzed");
  return 0;
}
