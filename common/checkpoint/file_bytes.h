// The bytes checkpoint files are made of: little-endian integers and zlib's CRC-32.
// Shared by the dense shards' and the embedding shards' checkpoint formats.
#ifndef PARAMSERVER_COMMON_CHECKPOINT_FILE_BYTES_H_
#define PARAMSERVER_COMMON_CHECKPOINT_FILE_BYTES_H_

#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/base/config.h"
#include "absl/strings/string_view.h"

namespace paramserver {

template <typename T>
void AppendLittleEndian(T value, std::string* out) {
#ifdef ABSL_IS_LITTLE_ENDIAN
  out->append(reinterpret_cast<const char*>(&value), sizeof(T));  // the bytes, in order
#else
  for (size_t i = 0; i < sizeof(T); ++i)
    out->push_back(static_cast<char>((static_cast<uint64_t>(value) >> (8 * i)) & 0xff));
#endif
}

// REQUIRES: bytes.size() >= offset + sizeof(T).
template <typename T>
T ReadLittleEndian(absl::string_view bytes, size_t offset) {
#ifdef ABSL_IS_LITTLE_ENDIAN
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
#else
  uint64_t value = 0;
  for (size_t i = 0; i < sizeof(T); ++i)
    value |= uint64_t{static_cast<unsigned char>(bytes[offset + i])} << (8 * i);
  return static_cast<T>(value);
#endif
}

// zlib's CRC-32 over every byte: crc32_z takes a size_t length, so a file over 4 GiB is
// covered whole (crc32's uInt length would cover only the low 32 bits of it).
inline uint32_t Crc32Of(const char* data, size_t size) {
  return static_cast<uint32_t>(crc32_z(0L, reinterpret_cast<const Bytef*>(data), size));
}

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_CHECKPOINT_FILE_BYTES_H_
