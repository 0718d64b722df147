// libFuzzer target: the worker's decoder of PullShards/PushShards replies (bytes from a
// server), into destinations of the sizes the worker expects.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/wire/shard_call_codec.h"
#include "grpcpp/support/byte_buffer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const paramserver::ReplyKind kind =
      data[0] % 2 == 0 ? paramserver::ReplyKind::kPull : paramserver::ReplyKind::kPush;
  const int parts = 1 + data[1] % 4;
  std::vector<std::vector<float>> buffers(parts, std::vector<float>(3));
  std::vector<absl::Span<float>> destinations;
  for (std::vector<float>& buffer : buffers) destinations.push_back(absl::MakeSpan(buffer));
  for (paramserver::WireDtype encoding :
       {paramserver::WireDtype::kFloat32, paramserver::WireDtype::kFloat16}) {
    grpc::Slice slice(data + 2, size - 2);
    grpc::ByteBuffer reply(&slice, 1);
    (void)paramserver::DecodeShardsReply(kind, &reply, encoding, destinations, "fuzzed server");
  }
  return 0;
}
