// libFuzzer target: an embedding checkpoint file (checkpoint.dir, read at a restore).
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "common/checkpoint/embedding_checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<paramserver::EmbeddingShardState> state =
      paramserver::ParseEmbeddingCheckpoint(bytes, "fuzzed");
  // What parses must encode back to the same bytes.
  if (state.ok() && paramserver::EncodeEmbeddingCheckpoint(*state).value_or("") != bytes) {
    __builtin_trap();
  }
  return 0;
}
