// libFuzzer target: shard checkpoint files (read back on restore and resume, from a
// folder servers share).
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/checkpoint/shard_checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)paramserver::ParseShardCheckpoint(std::string(reinterpret_cast<const char*>(data), size),
                                          "fuzzed");
  return 0;
}
