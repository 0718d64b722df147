#include "scheduler/map_publisher.h"

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"

#include "common/rpc_endpoints.h"
#include "proto/parameter_server.grpc.pb.h"
#include "spdlog/spdlog.h"

namespace paramserver {
namespace {

int InstallOnServers(const ShardMap& map, const std::vector<std::string>& names,
                     const std::vector<std::string>& addresses, absl::Duration timeout) {
  std::atomic<int> confirmed{0};
  std::vector<std::thread> calls;
  for (size_t i = 0; i < names.size(); ++i) {
    calls.emplace_back([&, i] {
      auto stub = ParameterServer::NewStub(CreateChannel(addresses[i]));
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
      InstallShardMapRequest request;
      *request.mutable_shard_map() = map;
      InstallShardMapResponse response;
      grpc::Status status = stub->InstallShardMap(&context, request, &response);
      if (status.ok()) {
        ++confirmed;
      } else {
        spdlog::warn("{} did not install epoch {} ({}); it will catch up from its heartbeat", names[i], map.epoch(),
                     status.error_message());
      }
    });
  }
  for (std::thread& call : calls) call.join();
  return confirmed.load();
}

}  // namespace

int PublishShardMap(const MapChange& change, absl::Duration timeout) {
  return InstallOnServers(change.map, change.servers_first, change.addresses_first, timeout) +
         InstallOnServers(change.map, change.servers_then, change.addresses_then, timeout);
}

absl::StatusOr<int> ScheduleCheckpointOnServers(const std::vector<std::string>& addresses, int64_t step,
                                                absl::Duration timeout) {
  std::atomic<int> passed{0};
  std::vector<grpc::Status> statuses(addresses.size());
  std::vector<std::thread> calls;
  for (size_t i = 0; i < addresses.size(); ++i) {
    calls.emplace_back([&, i] {
      auto stub = ParameterServer::NewStub(CreateChannel(addresses[i]));
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
      CheckpointAtRequest request;
      request.set_step(step);
      CheckpointAtResponse response;
      statuses[i] = stub->CheckpointAt(&context, request, &response);
      passed += response.passed_shards_size();
    });
  }
  for (std::thread& call : calls) call.join();
  for (size_t i = 0; i < addresses.size(); ++i) {
    if (!statuses[i].ok()) {
      return absl::Status(static_cast<absl::StatusCode>(statuses[i].error_code()),
                          absl::StrCat("checkpoint request to ", addresses[i], ": ", statuses[i].error_message()));
    }
  }
  return passed.load();
}

}  // namespace paramserver
