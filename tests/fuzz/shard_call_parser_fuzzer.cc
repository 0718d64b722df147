// libFuzzer target: the server's parsers of PullShards/PushShards requests (bytes from
// any caller that holds the cluster token), and the gradient reads that follow them.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/wire/shard_call_codec.h"
#include "grpcpp/support/byte_buffer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  grpc::Slice slice(data + 1, size - 1);
  const grpc::ByteBuffer request(&slice, 1);
  if (data[0] % 2 == 0) {
    (void)paramserver::DecodePullShards(request);
    return 0;
  }
  absl::StatusOr<std::vector<paramserver::PushPartView>> parts =
      paramserver::DecodePushShards(request);
  if (!parts.ok()) return 0;
  for (const paramserver::PushPartView& part : *parts) {
    // A shard of the size the gradient claims, as a server holding it would have.
    const size_t values = part.gradient_bytes / sizeof(float);
    if (values > (1 << 20)) continue;
    std::vector<float> out(values);
    for (paramserver::WireDtype encoding :
         {paramserver::WireDtype::kFloat32, paramserver::WireDtype::kBfloat16}) {
      (void)paramserver::ReadGradient(request, part, encoding, absl::MakeSpan(out),
                                      "fuzzed gradient");
    }
  }
  return 0;
}
