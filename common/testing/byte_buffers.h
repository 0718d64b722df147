// gRPC byte buffers to and from strings, for tests and test tools that look at the bytes
// of a call (testonly).
#ifndef PARAMSERVER_COMMON_TESTING_BYTE_BUFFERS_H_
#define PARAMSERVER_COMMON_TESTING_BYTE_BUFFERS_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"

namespace paramserver {

// Every byte of `buffer`, in order ("" if gRPC cannot dump it).
inline std::string BytesOf(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (!buffer.Dump(&slices).ok()) return bytes;
  for (const grpc::Slice& slice : slices)
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  return bytes;
}

// A buffer holding a copy of `bytes`.
inline grpc::ByteBuffer ByteBufferOf(absl::string_view bytes) {
  grpc::Slice slice(bytes.data(), bytes.size());
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_TESTING_BYTE_BUFFERS_H_
