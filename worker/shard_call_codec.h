// Hand-made wire forms of the worker's PushShards and PullShards calls, so that tensors
// go from the worker's buffers onto the wire, and from the wire into them, without a
// protobuf copy in between (a float32 gradient is not copied at all on a little-endian
// host; values are copied once, from gRPC's receive buffers into the destination).
// The bytes are exactly what protobuf writes and reads for the messages of
// proto/parameter_server.proto; the tests check that both ways.
#ifndef PARAMSERVER_WORKER_SHARD_CALL_CODEC_H_
#define PARAMSERVER_WORKER_SHARD_CALL_CODEC_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/shard_call_wire.h"  // the calls' paths
#include "common/tensor_codec.h"
#include "grpcpp/support/byte_buffer.h"
#include "proto/parameter_server.pb.h"

namespace paramserver {

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

// The PullShardsRequest of `parts` (no tensors: an ordinary serialisation).
grpc::ByteBuffer EncodePullShards(const PullShardsRequest& request);

// What one part of a reply says besides its values.
struct ReplyPart {
  int64_t applied_updates = 0;
  int64_t start_step = 0;  // pulls
  bool duplicate = false;  // pushes
  bool pulled = false;     // pushes with pull_next
  std::string pull_error;  // pushes
  bool has_values = false;
};

enum class ReplyKind { kPull, kPush };

// Reads a PullShardsResponse (kPull) or PushShardsResponse (kPush). Part k's values, in
// `encoding`, are decoded straight into destinations[k], whose size they must match.
// INTERNAL naming `server` for a reply that is not such a message, has another number
// of parts, or values of the wrong size; destinations may then be partly written.
absl::StatusOr<std::vector<ReplyPart>> DecodeShardsReply(
    ReplyKind kind, grpc::ByteBuffer* reply, WireDtype encoding,
    const std::vector<absl::Span<float>>& destinations, const std::string& server);

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_SHARD_CALL_CODEC_H_
