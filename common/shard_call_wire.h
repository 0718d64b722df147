// The PullShards and PushShards calls as bytes: both ends write and read them by hand so
// that tensors go between gRPC's slices and their own memory without protobuf copies.
// The messages are those of proto/parameter_server.proto (service ParameterServerData);
// what is written here is exactly what protobuf would write, and any protobuf writer's
// bytes are read.
#ifndef PARAMSERVER_COMMON_SHARD_CALL_WIRE_H_
#define PARAMSERVER_COMMON_SHARD_CALL_WIRE_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/buffer_pool.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/support/slice.h"

namespace paramserver {

// The calls' paths. Servers serve them outside the generated ParameterServer service.
inline constexpr char kPullShardsMethod[] = "/paramserver.ParameterServerData/PullShards";
inline constexpr char kPushShardsMethod[] = "/paramserver.ParameterServerData/PushShards";

// A slice that owns `bytes` (moved, not copied) and frees them when gRPC is done.
grpc::Slice SliceOwning(std::string bytes);

// A slice over `size` bytes at `data` that keeps `owner` alive until gRPC is done with
// it: memory sent as it is, without a copy.
grpc::Slice SliceKeepingAlive(std::shared_ptr<const void> owner, const void* data, size_t size);

// Byte strings of sent replies, kept for the next ones.
using ReplyBufferPool = BufferPool<std::string>;

// A slice owning `bytes` (moved) that gives them back to `pool` once gRPC is done.
grpc::Slice SliceGivingBack(std::shared_ptr<ReplyBufferPool> pool, std::string bytes);

// Appends to `slices` one element of the `repeated ... shards = 1` field every one of
// these messages has: `header` (the part without its tensor) and then, unless `tensor`
// is empty, the bytes field `tensor_field` holding `tensor` (referred to, not copied).
void AppendShardPart(const google::protobuf::MessageLite& header, int tensor_field,
                     grpc::Slice tensor, std::vector<grpc::Slice>* slices);

// Reads the `repeated ... shards = 1` field of the message in `input` (other fields
// skipped), calling `read_part(index)` with the input limited to each part in turn. A
// part's own error is returned as it is; bytes that are not such a message get
// `malformed(why)`: among them a part whose declared length is wider than 31 bits or
// runs past the end of the message.
absl::Status ReadShardParts(google::protobuf::io::CodedInputStream& input,
                            const std::function<absl::Status(size_t index)>& read_part,
                            const std::function<absl::Status(const std::string& why)>& malformed);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_SHARD_CALL_WIRE_H_
