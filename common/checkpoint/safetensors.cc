#include "common/checkpoint/safetensors.h"

#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checkpoint/file_bytes.h"
#include "common/files/file_system.h"
#include "common/files/s3_file_system.h"
#include "common/wire/tensor_codec.h"
#include "nlohmann/json.hpp"

namespace paramserver {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100 << 20;

absl::Status Corrupt(absl::string_view source, absl::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat(source, ": not a valid safetensors file: ", problem));
}

// The number of elements `shape` holds, or nullopt when a dimension is negative or the
// product exceeds `limit`: checked at every factor, so no product can overflow.
std::optional<uint64_t> ElementCount(const std::vector<int64_t>& shape, uint64_t limit) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d != 0 && n > limit / static_cast<uint64_t>(d)) return std::nullopt;
    n *= static_cast<uint64_t>(d);
  }
  if (n > limit) return std::nullopt;
  return n;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

absl::StatusOr<std::string> EncodeSafetensors(const std::vector<NamedTensor>& tensors) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header["__metadata__"] = {{"format", "pt"}};
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("tensor name '", t.name, "' repeats"));
    }
    const bool ints = t.dtype == TensorDtype::kI64;
    const size_t size = ints ? t.int_values.size() : t.values.size();
    const std::optional<uint64_t> count = ElementCount(t.shape, size);
    if (count != size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "' has ", size, " values but its shape ", ShapeText(t.shape),
          " holds ", count.has_value() ? absl::StrCat(*count) : "more"));
    }
    const uint64_t bytes = size * (ints ? sizeof(int64_t) : sizeof(float));
    header[t.name] = {{"dtype", ints ? "I64" : "F32"},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');  // align the data to 8 bytes
  std::string out(8, '\0');
  const uint64_t header_size = header_text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header_size >> (8 * i)) & 0xff);
  out += header_text;
  out.reserve(out.size() + offset);
  for (const NamedTensor& t : tensors) {
    if (t.dtype == TensorDtype::kF32) {
      AppendFloatsLittleEndian(t.values, &out);
      continue;
    }
    for (int64_t v : t.int_values) AppendLittleEndian(v, &out);
  }
  return out;
}

absl::StatusOr<std::vector<NamedTensor>> DecodeSafetensors(absl::string_view bytes,
                                                           absl::string_view source) {
  if (bytes.size() < 8) return Corrupt(source, absl::StrCat("only ", bytes.size(), " bytes"));
  uint64_t header_size = 0;
  for (int i = 0; i < 8; ++i)
    header_size |= uint64_t{static_cast<unsigned char>(bytes[i])} << (8 * i);
  if (header_size > kMaxHeaderBytes || header_size > bytes.size() - 8) {
    return Corrupt(source, absl::StrCat("header length ", header_size, " runs past the end of the ",
                                        bytes.size(), "-byte file"));
  }
  const absl::string_view data = bytes.substr(8 + header_size);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, header_size), nullptr,
                                                /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return Corrupt(source, "the header is not a JSON object");
  }
  std::vector<NamedTensor> tensors;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets")) {
      return Corrupt(source,
                     absl::StrCat("tensor '", name, "' lacks dtype, shape or data_offsets"));
    }
    if (entry["dtype"] != "F32" && entry["dtype"] != "I64") {
      return Corrupt(source, absl::StrCat("tensor '", name, "' has dtype ", entry["dtype"].dump(),
                                          "; only F32 and I64 are supported"));
    }
    NamedTensor tensor;
    tensor.name = name;
    if (entry["dtype"] == "I64") tensor.dtype = TensorDtype::kI64;
    const size_t element_bytes =
        tensor.dtype == TensorDtype::kI64 ? sizeof(int64_t) : sizeof(float);
    const auto& shape = entry["shape"];
    const auto& offsets = entry["data_offsets"];
    if (!shape.is_array() || !offsets.is_array() || offsets.size() != 2 ||
        !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) {
      return Corrupt(source,
                     absl::StrCat("tensor '", name, "' has a malformed shape or data_offsets"));
    }
    for (const auto& dim : shape) {
      if (!dim.is_number_unsigned() || dim.get<uint64_t>() > (uint64_t{1} << 40)) {
        return Corrupt(source,
                       absl::StrCat("tensor '", name, "' has a bad dimension ", dim.dump()));
      }
      tensor.shape.push_back(dim.get<int64_t>());
    }
    const uint64_t begin = offsets[0].get<uint64_t>();
    const uint64_t end = offsets[1].get<uint64_t>();
    // Checked at every factor, so the product cannot overflow; the byte count is then
    // checked against the data section before anything is allocated.
    const std::optional<uint64_t> count =
        ElementCount(tensor.shape, std::numeric_limits<uint64_t>::max() / element_bytes);
    if (!count.has_value()) {
      return Corrupt(source,
                     absl::StrCat("tensor '", name, "' has the shape ", ShapeText(tensor.shape),
                                  ": more elements than a 64-bit byte count can address"));
    }
    const uint64_t want = *count * element_bytes;
    if (end < begin || end - begin != want || end > data.size()) {
      return Corrupt(source, absl::StrCat("tensor '", name, "' has data_offsets [", begin, ", ",
                                          end, "] but needs ", want, " bytes inside the ",
                                          data.size(), "-byte data section"));
    }
    if (tensor.dtype == TensorDtype::kI64) {
      tensor.int_values.resize(*count);
      for (uint64_t i = 0; i < *count; ++i)
        tensor.int_values[i] = ReadLittleEndian<int64_t>(data, begin + i * sizeof(int64_t));
    } else {
      tensor.values.resize(*count);
      DecodeFloatsLittleEndian(data.substr(begin, want), tensor.values.data());
    }
    tensors.push_back(std::move(tensor));
  }
  return tensors;
}

absl::Status WriteSafetensorsFile(const std::string& path,
                                  const std::vector<NamedTensor>& tensors) {
  absl::StatusOr<std::string> bytes = EncodeSafetensors(tensors);
  if (!bytes.ok()) return bytes.status();
  return WriteFileAtomically(FileSystemFor(path), path, *bytes);
}

absl::StatusOr<std::vector<NamedTensor>> ReadSafetensorsFile(const std::string& path) {
  absl::StatusOr<std::string> bytes = FileSystemFor(path).ReadFile(path);
  if (!bytes.ok() && IsS3Uri(path)) return bytes.status();  // it names the object and why
  if (!bytes.ok()) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  }
  return DecodeSafetensors(*bytes, path);
}

}  // namespace paramserver
