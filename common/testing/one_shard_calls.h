// One shard's pull or push as a test makes it: the one part of a PullShards or
// PushShards call (the batched calls are the only data calls a server serves), through
// the generated ParameterServerData stub. And a backup's copy of a shard, read whole.
#ifndef PARAMSERVER_COMMON_TESTING_ONE_SHARD_CALLS_H_
#define PARAMSERVER_COMMON_TESTING_ONE_SHARD_CALLS_H_

#include <memory>
#include <string>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "proto/parameter_server.grpc.pb.h"

namespace paramserver {

namespace one_shard_calls_internal {
template <typename Request, typename Response, typename Part, typename PartResponse,
          typename Method>
grpc::Status Call(ParameterServerData::Stub& stub, Method method, grpc::ClientContext* context,
                  const Part& part, PartResponse* response) {
  Request request;
  *request.add_shards() = part;
  Response reply;
  const grpc::Status status = (stub.*method)(context, request, &reply);
  if (!status.ok()) return status;
  if (reply.shards_size() != 1) {
    return grpc::Status(
        grpc::StatusCode::INTERNAL,
        "a one-part call's reply has " + std::to_string(reply.shards_size()) + " parts");
  }
  *response = reply.shards(0);
  return status;
}
}  // namespace one_shard_calls_internal

// PullShards with `part` alone; the part's reply into *response. The call's status is
// the part's (a batched call fails with its first failing part).
inline grpc::Status PullOneShard(ParameterServerData::Stub& stub, grpc::ClientContext* context,
                                 const PullRequest& part, PullResponse* response) {
  return one_shard_calls_internal::Call<PullShardsRequest, PullShardsResponse>(
      stub, &ParameterServerData::Stub::PullShards, context, part, response);
}

// PushShards with `part` alone, as PullOneShard.
inline grpc::Status PushOneShard(ParameterServerData::Stub& stub, grpc::ClientContext* context,
                                 const PushRequest& part, PushResponse* response) {
  return one_shard_calls_internal::Call<PushShardsRequest, PushShardsResponse>(
      stub, &ParameterServerData::Stub::PushShards, context, part, response);
}

// FetchShardState's whole stream read, as a new backup reads it: each piece into
// *pieces (may be null); the call's status.
inline grpc::Status FetchShardStatePieces(ParameterServer::Stub& stub, grpc::ClientContext* context,
                                          const FetchShardStateRequest& request,
                                          std::vector<ShardStatePiece>* pieces) {
  std::unique_ptr<grpc::ClientReader<ShardStatePiece>> reader =
      stub.FetchShardState(context, request);
  ShardStatePiece piece;
  while (reader->Read(&piece)) {
    if (pieces != nullptr) pieces->push_back(piece);
  }
  return reader->Finish();
}

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_TESTING_ONE_SHARD_CALLS_H_
