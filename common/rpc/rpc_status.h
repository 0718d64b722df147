// The one place where grpc::Status and absl::Status are converted into each other.
#ifndef PARAMSERVER_COMMON_RPC_RPC_STATUS_H_
#define PARAMSERVER_COMMON_RPC_RPC_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace paramserver {

// Same code, same message. The numeric codes of both libraries are identical.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status ToAbslStatus(const grpc::Status& status);

// ToAbslStatus, with "<what>: " before the message, e.g. "Pull shard 3 from ps-1".
absl::Status RpcError(const grpc::Status& status, const std::string& what);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_RPC_RPC_STATUS_H_
