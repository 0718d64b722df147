// libFuzzer target: the cluster spec (YAML), which every daemon parses at start.
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "common/config/cluster_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)paramserver::ParseClusterSpec(absl::string_view(reinterpret_cast<const char*>(data), size),
                                      "fuzzed.yaml");
  return 0;
}
