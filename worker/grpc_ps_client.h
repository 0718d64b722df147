// PsClient over gRPC: one call per shard, all shards in parallel.
#ifndef PARAMSERVER_WORKER_GRPC_PS_CLIENT_H_
#define PARAMSERVER_WORKER_GRPC_PS_CLIENT_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/parameter_server.grpc.pb.h"
#include "proto/scheduler.pb.h"
#include "worker/ps_client.h"

namespace paramserver {

struct GrpcPsClientOptions {
  int worker_rank = 0;
  int64_t total_parameters = 0;
  // How long a pull may wait for the other workers (sync, ssp) before failing.
  absl::Duration pull_timeout = absl::Seconds(120);
  // Per-attempt timeout of a push; UNAVAILABLE attempts are retried until
  // `retry_deadline` after the call began.
  absl::Duration push_timeout = absl::Seconds(10);
  absl::Duration retry_deadline = absl::Seconds(30);
};

// Thread-compatible: one caller at a time.
class GrpcPsClient final : public PsClient {
 public:
  // INVALID_ARGUMENT if the shard map does not cover [0, total_parameters) exactly.
  static absl::StatusOr<std::unique_ptr<GrpcPsClient>> Create(GrpcPsClientOptions options,
                                                             const ShardMap& shard_map);

  absl::Status PullAll(int64_t step, absl::Span<float> params) override;
  absl::Status PushAll(int64_t step, absl::Span<const float> gradient) override;

 private:
  struct Route {
    ShardAssignment assignment;
    ParameterServer::Stub* stub;
  };
  GrpcPsClient(GrpcPsClientOptions options, int64_t epoch);

  const GrpcPsClientOptions options_;
  const int64_t epoch_;
  std::vector<Route> routes_;
  std::map<std::string, std::unique_ptr<ParameterServer::Stub>> stubs_;  // by server address
};

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_GRPC_PS_CLIENT_H_
