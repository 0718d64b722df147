// The server's side of the PullShards and PushShards calls (common/shard_call_wire.h):
// requests read straight from gRPC's byte buffers, a gradient decoded from them into
// the shard's buffer with one copy and no protobuf string in between.
#ifndef PARAMSERVER_PS_SHARD_CALL_PARSER_H_
#define PARAMSERVER_PS_SHARD_CALL_PARSER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/tensor_codec.h"
#include "grpcpp/support/byte_buffer.h"
#include "proto/parameter_server.pb.h"

namespace paramserver {

// One part of a PushShards request: every field but the gradient, and where the
// gradient's bytes lie in the request.
struct PushPartView {
  PushRequest header;           // gradient left empty
  int64_t gradient_offset = 0;  // from the start of the request's bytes
  size_t gradient_bytes = 0;    // 0: no gradient
};

// The parts of a PushShardsRequest, in order, with fields in any order (as protobuf
// reads them; a repeated field's last value wins). INVALID_ARGUMENT saying what is
// wrong for bytes that are not one.
absl::StatusOr<std::vector<PushPartView>> ParsePushShards(const grpc::ByteBuffer& request);

// Decodes `part`'s gradient, in `encoding`, from `request` (the buffer it was parsed
// from) into `out`. CheckWireSize's error, naming `what`, unless the sizes match.
absl::Status ReadGradient(const grpc::ByteBuffer& request, const PushPartView& part,
                          WireDtype encoding, absl::Span<float> out, absl::string_view what);

// A PullShardsRequest (no tensors: parsed by protobuf). INVALID_ARGUMENT if it is not one.
absl::StatusOr<PullShardsRequest> ParsePullShards(const grpc::ByteBuffer& request);

}  // namespace paramserver

#endif  // PARAMSERVER_PS_SHARD_CALL_PARSER_H_
