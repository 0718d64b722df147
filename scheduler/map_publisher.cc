#include "scheduler/map_publisher.h"

#include <atomic>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/rpc/rpc_endpoints.h"
#include "common/rpc/rpc_status.h"
#include "proto/parameter_server.grpc.pb.h"
#include "spdlog/spdlog.h"

namespace paramserver {
namespace {

// Calls `call(stub, context, i)` for every address at once, each with `timeout`, and
// returns the statuses in address order.
std::vector<grpc::Status> CallEachServer(
    const std::vector<std::string>& addresses, ServerStubs& servers, absl::Duration timeout,
    const std::function<grpc::Status(ParameterServer::Stub&, grpc::ClientContext&, size_t)>& call) {
  std::vector<grpc::Status> statuses(addresses.size());
  std::vector<std::thread> calls;
  for (size_t i = 0; i < addresses.size(); ++i) {
    calls.emplace_back([&, i] {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
      statuses[i] = call(servers.For(addresses[i]), context, i);
    });
  }
  for (std::thread& thread : calls) thread.join();
  return statuses;
}

int InstallOnServers(const ShardMap& map, ServerStubs& servers,
                     const std::vector<std::string>& names,
                     const std::vector<std::string>& addresses, absl::Duration timeout) {
  InstallShardMapRequest request;
  *request.mutable_shard_map() = map;
  const std::vector<grpc::Status> statuses =
      CallEachServer(addresses, servers, timeout,
                     [&](ParameterServer::Stub& stub, grpc::ClientContext& context, size_t) {
                       InstallShardMapResponse response;
                       return stub.InstallShardMap(&context, request, &response);
                     });
  int confirmed = 0;
  for (size_t i = 0; i < statuses.size(); ++i) {
    if (statuses[i].ok()) {
      ++confirmed;
    } else {
      spdlog::warn("{} did not install epoch {} ({}); it will catch up from its heartbeat",
                   names[i], map.epoch(), statuses[i].error_message());
    }
  }
  return confirmed;
}

}  // namespace

ParameterServer::Stub& ServerStubs::For(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<ParameterServer::Stub>& stub = stubs_[address];
  if (stub == nullptr) stub = ParameterServer::NewStub(CreateChannel(address, credentials_));
  return *stub;
}

int PublishShardMap(const MapChange& change, ServerStubs& servers, absl::Duration timeout) {
  return InstallOnServers(change.map, servers, change.servers_first, change.addresses_first,
                          timeout) +
         InstallOnServers(change.map, servers, change.servers_then, change.addresses_then, timeout);
}

absl::StatusOr<CheckpointScheduling> ScheduleCheckpointOnServers(
    const std::vector<std::string>& addresses, ServerStubs& servers, int64_t step,
    absl::Duration timeout) {
  CheckpointAtRequest request;
  request.set_step(step);
  std::vector<CheckpointAtResponse> responses(addresses.size());
  const std::vector<grpc::Status> statuses =
      CallEachServer(addresses, servers, timeout,
                     [&](ParameterServer::Stub& stub, grpc::ClientContext& context, size_t i) {
                       return stub.CheckpointAt(&context, request, &responses[i]);
                     });
  CheckpointScheduling scheduling;
  for (size_t i = 0; i < addresses.size(); ++i) {
    if (!statuses[i].ok())
      return RpcError(statuses[i], absl::StrCat("checkpoint request to ", addresses[i]));
    scheduling.passed_shards += responses[i].passed_shards_size();
    scheduling.newest_applied_updates =
        std::max(scheduling.newest_applied_updates, responses[i].newest_applied_updates());
  }
  return scheduling;
}

}  // namespace paramserver
