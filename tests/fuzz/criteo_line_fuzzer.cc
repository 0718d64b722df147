// libFuzzer target: a line of Criteo-format CTR data (data.train for type ctr).
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "worker/criteo_dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view line(reinterpret_cast<const char*>(data), size);
  for (const auto [dense, categorical] : {std::pair<int, int>{13, 26}, {2, 2}, {0, 1}}) {
    paramserver::CtrDataset dataset;
    dataset.dense_features = dense;
    dataset.categorical_features = categorical;
    if (paramserver::ParseCriteoLine(line, &dataset).ok() &&
        (dataset.example_count != 1 || dataset.ids.size() != static_cast<size_t>(categorical) ||
         dataset.dense.size() != static_cast<size_t>(dense))) {
      __builtin_trap();  // an accepted line must make exactly one example
    }
  }
  return 0;
}
