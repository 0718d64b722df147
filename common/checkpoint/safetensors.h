// Reading and writing safetensors files (F32 and I64 tensors), the format PyTorch and
// Hugging Face load directly. https://github.com/huggingface/safetensors (format).
#ifndef PARAMSERVER_COMMON_CHECKPOINT_SAFETENSORS_H_
#define PARAMSERVER_COMMON_CHECKPOINT_SAFETENSORS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace paramserver {

enum class TensorDtype { kF32, kI64 };

struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;  // F32: row-major, shape's product elements
  TensorDtype dtype = TensorDtype::kF32;
  std::vector<int64_t> int_values;  // I64 (an embedding table's ids): as values
};

// Serializes tensors (in the given order) to the safetensors byte layout.
// INVALID_ARGUMENT if a tensor's values do not match its shape or names repeat.
absl::StatusOr<std::string> EncodeSafetensors(const std::vector<NamedTensor>& tensors);

// Parses safetensors bytes. Every malformation (short file, header length past the end,
// bad JSON, a dtype other than F32 or I64, offsets that disagree with the shape or leave the
// data section) is INVALID_ARGUMENT naming `source` and the problem.
absl::StatusOr<std::vector<NamedTensor>> DecodeSafetensors(absl::string_view bytes,
                                                           absl::string_view source);

// File versions of the above. Writing goes to a temporary file renamed into place, so
// a reader never sees a half-written file.
absl::Status WriteSafetensorsFile(const std::string& path, const std::vector<NamedTensor>& tensors);
absl::StatusOr<std::vector<NamedTensor>> ReadSafetensorsFile(const std::string& path);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_CHECKPOINT_SAFETENSORS_H_
