// A parameter server's RPC services on 127.0.0.1 (a free port) inside this process,
// without the daemon around them (no scheduler, no heartbeats), and shards placed on
// such servers: the one harness the service's tests, the cluster tests of the worker's
// client and transport_bench share.
#ifndef PARAMSERVER_PS_IN_PROCESS_SERVER_H_
#define PARAMSERVER_PS_IN_PROCESS_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc/rpc_endpoints.h"
#include "common/security/peer_credentials.h"
#include "ps/parameter_server_service.h"
#include "ps/shard_replicator.h"

namespace paramserver {

struct InProcessServerOptions {
  std::string name = "ps-0";                // the server's node name
  const CallerVerifier* callers = nullptr;  // required; not owned, outlives the server
  absl::Duration max_pull_wait = absl::Seconds(10);
  int max_waiting_pulls = ParameterServerServiceImpl::kDefaultMaxWaitingPulls;
  int max_message_bytes = kMaxMessageBytes;
  // Set: the server replicates its primaries to backups (links()), calling as `name`
  // with these credentials.
  std::shared_ptr<CallCredentials> replication_credentials;
};

// Thread-safe as its service is. The destructor closes the shards served and stops the
// server (waiting up to 5 s for calls in flight).
class InProcessServer {
 public:
  // UNAVAILABLE when no port can be bound; INVALID_ARGUMENT without `callers`.
  static absl::StatusOr<std::unique_ptr<InProcessServer>> Start(InProcessServerOptions options);
  ~InProcessServer();

  const std::string& name() const { return options_.name; }
  int port() const { return rpc_.port; }
  const std::string& address() const { return address_; }
  ParameterServerServiceImpl& service() { return *service_; }
  ReplicationLinks* links() { return links_.get(); }  // null without replication_credentials

 private:
  explicit InProcessServer(InProcessServerOptions options);

  const InProcessServerOptions options_;
  std::unique_ptr<ReplicationLinks> links_;  // outlives the service's replicators
  std::unique_ptr<ParameterServerServiceImpl> service_;
  RunningServer rpc_;
  std::string address_;
};

// Cuts [0, parameters) into `shards` ranges (shard i is [parameters * i / shards,
// parameters * (i + 1) / shards)) and serves shard i as primary on servers[i % size],
// every value `initial_value`, at epoch 1 with every worker active; returns that map.
// *made (when not null) receives the shards, by id. REQUIRES: servers non-empty.
ShardMap ServeEvenShards(const std::vector<InProcessServer*>& servers, int64_t parameters,
                         int shards, TrainingMode mode, int num_workers, float initial_value,
                         std::vector<std::shared_ptr<ParameterShard>>* made = nullptr);

// Serves each of `shards` as primary, shards[i] on servers[i % size], at epoch 1 with
// `num_workers` workers active; returns that map, each shard's assignment read from its
// options (its id; its range, or its embedding bucket). REQUIRES: servers non-empty,
// the shards' ids distinct.
ShardMap ServeShards(const std::vector<InProcessServer*>& servers, int num_workers,
                     const std::vector<std::shared_ptr<ParameterShard>>& shards);

}  // namespace paramserver

#endif  // PARAMSERVER_PS_IN_PROCESS_SERVER_H_
