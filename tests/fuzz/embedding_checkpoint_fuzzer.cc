// libFuzzer target: an embedding checkpoint file (checkpoint.dir, read at a restore).
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "common/checkpoint/embedding_checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<paramserver::EmbeddingShardState> state =
      paramserver::ParseEmbeddingCheckpoint(bytes, "fuzzed");
  if (!state.ok()) return 0;
  // What parses must encode back to the same bytes.
  const std::string encoded = paramserver::EncodeEmbeddingCheckpoint(*state).value_or("");
  if (bytes.substr(0, 8) == "PSEMB003") {
    if (encoded != bytes) __builtin_trap();
    return 0;
  }
  // An older file (PSEMB001, PSEMB002) encodes in the current format, which reads back to it.
  absl::StatusOr<paramserver::EmbeddingShardState> again =
      paramserver::ParseEmbeddingCheckpoint(encoded, "re-encoded");
  if (!again.ok() || paramserver::EncodeEmbeddingCheckpoint(*again).value_or("") != encoded) {
    __builtin_trap();
  }
  return 0;
}
