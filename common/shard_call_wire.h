// The PullShards and PushShards calls as bytes: both ends write and read them by hand so
// that tensors go between gRPC's slices and their own memory without protobuf copies.
// The messages are those of proto/parameter_server.proto (service ParameterServerData);
// what is written here is exactly what protobuf would write, and any protobuf writer's
// bytes are read.
#ifndef PARAMSERVER_COMMON_SHARD_CALL_WIRE_H_
#define PARAMSERVER_COMMON_SHARD_CALL_WIRE_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
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

// Byte strings of sent replies, kept for the next ones: values written into a fresh
// 64 MB string cost a page fault, and the kernel zeroing a page, every 4 KB; a string
// used before has its pages mapped. Thread-safe; lives until the last slice it made is
// released.
class ReplyBufferPool : public std::enable_shared_from_this<ReplyBufferPool> {
 public:
  // Keeps at most `max_kept` strings and `max_kept_bytes` of capacity.
  static std::shared_ptr<ReplyBufferPool> Create(size_t max_kept = 32, size_t max_kept_bytes = size_t{512} << 20);

  // An empty string: one given back earlier (the largest) when there is one.
  std::string Take() ABSL_LOCKS_EXCLUDED(mu_);
  // A slice owning `bytes` (moved) that gives them back here once gRPC is done.
  grpc::Slice SliceGivingBack(std::string bytes);

  size_t kept() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  ReplyBufferPool(size_t max_kept, size_t max_kept_bytes) : max_kept_(max_kept), max_kept_bytes_(max_kept_bytes) {}
  void GiveBack(std::string bytes) ABSL_LOCKS_EXCLUDED(mu_);

  const size_t max_kept_;
  const size_t max_kept_bytes_;
  mutable absl::Mutex mu_;
  std::vector<std::string> kept_ ABSL_GUARDED_BY(mu_);
  size_t kept_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

// Appends to `slices` one element of the `repeated ... shards = 1` field every one of
// these messages has: `header` (the part without its tensor) and then, unless `tensor`
// is empty, the bytes field `tensor_field` holding `tensor` (referred to, not copied).
void AppendShardPart(const google::protobuf::MessageLite& header, int tensor_field, grpc::Slice tensor,
                     std::vector<grpc::Slice>* slices);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_SHARD_CALL_WIRE_H_
