// The data calls' wire format, in one place both ends use: PullShards and PushShards
// (service ParameterServerData in proto/parameter_server.proto), their requests and their
// replies, each with a symmetric encode and decode. Both ends read and write them by hand
// so that tensors go between gRPC's slices and their own memory without protobuf copies
// (a float32 gradient is not copied at all on a little-endian host; values are copied
// once, from gRPC's receive buffers into the destination). What is written here is
// exactly what protobuf would write, and any protobuf writer's bytes are read; the tests
// check both ways.
#ifndef PARAMSERVER_COMMON_WIRE_SHARD_CALL_CODEC_H_
#define PARAMSERVER_COMMON_WIRE_SHARD_CALL_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/wire/tensor_codec.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "proto/parameter_server.pb.h"

namespace paramserver {

// The calls' paths.
inline constexpr char kPullShardsMethod[] = "/paramserver.ParameterServerData/PullShards";
inline constexpr char kPushShardsMethod[] = "/paramserver.ParameterServerData/PushShards";

// A slice that owns `bytes` (moved, not copied) and frees them when gRPC is done.
grpc::Slice SliceOwning(std::string bytes);

// A slice over `size` bytes at `data` that keeps `owner` alive until gRPC is done with
// it: memory sent as it is, without a copy.
grpc::Slice SliceKeepingAlive(std::shared_ptr<const void> owner, const void* data, size_t size);

// ---- PushShards requests (worker -> server)

// One shard's part of a PushShards call: every PushRequest field but the gradient (set
// encoding to match `encoding` below), and the gradient itself.
struct PushPart {
  PushRequest header;
  absl::Span<const float> gradient;
};

// The PushShardsRequest of `parts`, each gradient in `encoding`. For float32 on a
// little-endian host the buffer refers to the gradients' memory: it must stay unchanged
// and alive until gRPC is done with the call (its completion callback ran).
grpc::ByteBuffer EncodePushShards(const std::vector<PushPart>& parts, WireDtype encoding);

// One decoded part of a PushShards request: every field but the gradient, and where the
// gradient's bytes lie in the request.
struct PushPartView {
  PushRequest header;           // gradient left empty
  int64_t gradient_offset = 0;  // from the start of the request's bytes
  size_t gradient_bytes = 0;    // 0: no gradient
};

// The parts of a PushShardsRequest, in order, with fields in any order (as protobuf
// reads them; a repeated field's last value wins). INVALID_ARGUMENT saying what is
// wrong for bytes that are not one.
absl::StatusOr<std::vector<PushPartView>> DecodePushShards(const grpc::ByteBuffer& request);

// Decodes `part`'s gradient, in `encoding`, from `request` (the buffer it was decoded
// from) into `out`. CheckWireSize's error, naming `what`, unless the sizes match.
absl::Status ReadGradient(const grpc::ByteBuffer& request, const PushPartView& part,
                          WireDtype encoding, absl::Span<float> out, absl::string_view what);

// ---- PullShards requests (worker -> server; no tensors: ordinary protobuf)

grpc::ByteBuffer EncodePullShards(const PullShardsRequest& request);
// INVALID_ARGUMENT if `request` is not a PullShardsRequest.
absl::StatusOr<PullShardsRequest> DecodePullShards(const grpc::ByteBuffer& request);

// ---- Replies of both (server -> worker)

enum class ReplyKind { kPull, kPush };

// Writes a PullShardsResponse (kPull: parts are PullResponse) or PushShardsResponse
// (kPush: PushResponse), part by part. Not thread-safe; one per reply.
class ShardsReplyWriter {
 public:
  explicit ShardsReplyWriter(ReplyKind kind) : kind_(kind) {}
  // Appends a part: `header` (its values field left empty) followed, unless `values` is
  // empty, by `values` as the values field (already in the part's encoding; referred to,
  // not copied).
  void AddPart(const google::protobuf::MessageLite& header, grpc::Slice values);
  // The reply. Call once.
  grpc::ByteBuffer Finish();

 private:
  const ReplyKind kind_;
  std::vector<grpc::Slice> slices_;
};

// What one part of a reply says besides its values.
struct ReplyPart {
  int64_t applied_updates = 0;
  int64_t start_step = 0;  // pulls
  bool duplicate = false;  // pushes
  bool late = false;       // pushes: PushResponse.late
  bool pulled = false;     // pushes with pull_next
  std::string pull_error;  // pushes
  bool has_values = false;
  double step_sum_squares = 0;  // pushes with clip_grad_norm
};

// Reads a PullShardsResponse (kPull) or PushShardsResponse (kPush). Part k's values, in
// `encoding`, are decoded straight into destinations[k], whose size they must match.
// INTERNAL naming `server` for a reply that is not such a message, has another number
// of parts, or values of the wrong size; destinations may then be partly written.
absl::StatusOr<std::vector<ReplyPart>> DecodeShardsReply(
    ReplyKind kind, grpc::ByteBuffer* reply, WireDtype encoding,
    const std::vector<absl::Span<float>>& destinations, const std::string& server);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_WIRE_SHARD_CALL_CODEC_H_
