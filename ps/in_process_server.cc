#include "ps/in_process_server.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "common/wire/shard_layout.h"

namespace paramserver {

InProcessServer::InProcessServer(InProcessServerOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<InProcessServer>> InProcessServer::Start(
    InProcessServerOptions options) {
  if (options.callers == nullptr) {
    return absl::InvalidArgumentError("an in-process server needs a CallerVerifier");
  }
  std::unique_ptr<InProcessServer> server(new InProcessServer(std::move(options)));
  const InProcessServerOptions& o = server->options_;
  if (o.replication_credentials != nullptr) {
    server->links_ =
        std::make_unique<ReplicationLinks>(o.name, absl::Seconds(1), o.replication_credentials);
  }
  server->service_ = std::make_unique<ParameterServerServiceImpl>(
      o.callers, o.max_pull_wait, /*checkpoints=*/nullptr, /*metrics=*/nullptr,
      o.max_waiting_pulls);
  absl::StatusOr<RunningServer> running =
      StartRpcServer("127.0.0.1:0", server->service_->rpc_services(), o.max_message_bytes);
  if (!running.ok()) return running.status();
  server->rpc_ = std::move(*running);
  server->address_ = absl::StrCat("127.0.0.1:", server->rpc_.port);
  return server;
}

InProcessServer::~InProcessServer() {
  service_->CloseShards();
  rpc_.server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
}

ShardMap ServeShards(const std::vector<InProcessServer*>& servers, int num_workers,
                     const std::vector<std::shared_ptr<ParameterShard>>& shards) {
  constexpr int64_t kEpoch = 1;
  ShardMap map;
  map.set_epoch(kEpoch);
  for (int w = 0; w < num_workers; ++w) map.add_active_workers(true);
  std::vector<std::map<int, ServedShard>> served(servers.size());
  for (size_t i = 0; i < shards.size(); ++i) {
    InProcessServer& server = *servers[i % servers.size()];
    const ParameterShardOptions& options = shards[i]->options();
    ServedShard& serving = served[i % servers.size()][options.shard_id];
    serving.shard = shards[i];
    serving.primary_name = server.name();
    ShardAssignment* assignment = map.add_shards();
    assignment->set_shard_id(options.shard_id);
    if (options.embedding != nullptr) {
      assignment->set_kind(SHARD_KIND_EMBEDDING_ROWS);
      assignment->set_embedding_bucket(options.embedding->shape.bucket);
      assignment->set_embedding_buckets(options.embedding->shape.bucket_count);
    } else {
      assignment->set_begin(options.range.begin);
      assignment->set_end(options.range.end);
    }
    assignment->set_server_name(server.name());
    assignment->set_server_address(server.address());
  }
  for (size_t s = 0; s < servers.size(); ++s) {
    servers[s]->service().InstallShards(servers[s]->name(), kEpoch, served[s]);
  }
  return map;
}

ShardMap ServeEvenShards(const std::vector<InProcessServer*>& servers, int64_t parameters,
                         int shards, TrainingMode mode, int num_workers, float initial_value,
                         std::vector<std::shared_ptr<ParameterShard>>* made) {
  std::vector<std::shared_ptr<ParameterShard>> even;
  for (int i = 0; i < shards; ++i) {
    ParameterShardOptions options;
    options.shard_id = i;
    options.range = ContiguousPart(parameters, shards, i);
    options.mode = mode;
    options.num_workers = num_workers;
    even.push_back(std::make_shared<ParameterShard>(
        options, std::vector<float>(options.range.size(), initial_value)));
  }
  if (made != nullptr) made->insert(made->end(), even.begin(), even.end());
  return ServeShards(servers, num_workers, even);
}

}  // namespace paramserver
