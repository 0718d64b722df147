// The gRPC face of a parameter server: validates each request (epoch, shard, sizes)
// and hands it to the ParameterShard that holds the data. No training logic here.
#ifndef PARAMSERVER_PS_PARAMETER_SERVER_SERVICE_H_
#define PARAMSERVER_PS_PARAMETER_SERVER_SERVICE_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/parameter_server.grpc.pb.h"
#include "ps/checkpoint_writer.h"
#include "ps/parameter_shard.h"

namespace paramserver {

// Called for InstallShardMap; returns the epoch now served, or why the map could not
// be installed.
using ShardMapInstaller = std::function<absl::StatusOr<int64_t>(const ShardMap&)>;

// Thread-safe. Until InstallShards is called every request gets UNAVAILABLE.
class ParameterServerServiceImpl final : public ParameterServer::Service {
 public:
  // `max_pull_wait` caps how long a pull waits, whatever deadline the caller set.
  // `checkpoints` (may be null: no checkpoints) receives the snapshots pushes produce.
  // `installer` handles InstallShardMap (may be empty until set_installer).
  ParameterServerServiceImpl(absl::Duration max_pull_wait, CheckpointWriter* checkpoints);

  void set_installer(ShardMapInstaller installer) ABSL_LOCKS_EXCLUDED(mu_);

  // Serves `shards` (keyed by shard id) at shard-map epoch `epoch` from now on, as
  // `node_name` (used in error messages). Shards no longer served are not closed here.
  void InstallShards(const std::string& node_name, int64_t epoch,
                     std::map<int, std::shared_ptr<ParameterShard>> shards) ABSL_LOCKS_EXCLUDED(mu_);

  // Closes every shard: waiting pulls return UNAVAILABLE at once.
  void CloseShards() ABSL_LOCKS_EXCLUDED(mu_);

  int64_t epoch() const ABSL_LOCKS_EXCLUDED(mu_);
  std::map<int, std::shared_ptr<ParameterShard>> shards() const ABSL_LOCKS_EXCLUDED(mu_);

  // Requests refused before reaching a shard (stale epoch, unknown shard, bad bytes).
  int64_t rejected_requests() const ABSL_LOCKS_EXCLUDED(mu_);

  grpc::Status Pull(grpc::ServerContext* context, const PullRequest* request, PullResponse* response) override;
  grpc::Status Push(grpc::ServerContext* context, const PushRequest* request, PushResponse* response) override;
  grpc::Status InstallShardMap(grpc::ServerContext* context, const InstallShardMapRequest* request,
                               InstallShardMapResponse* response) override;
  grpc::Status CheckpointAt(grpc::ServerContext* context, const CheckpointAtRequest* request,
                            CheckpointAtResponse* response) override;

 private:
  // The shard for a request routed with `epoch`, or FAILED_PRECONDITION / UNAVAILABLE.
  absl::StatusOr<std::shared_ptr<ParameterShard>> FindShard(int shard_id, int64_t epoch) ABSL_LOCKS_EXCLUDED(mu_);
  grpc::Status Reject(const absl::Status& status, const std::string& peer) ABSL_LOCKS_EXCLUDED(mu_);

  const absl::Duration max_pull_wait_;
  CheckpointWriter* const checkpoints_;
  mutable absl::Mutex mu_;
  std::string node_name_ ABSL_GUARDED_BY(mu_) = "this server";
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, std::shared_ptr<ParameterShard>> shards_ ABSL_GUARDED_BY(mu_);
  int64_t rejected_requests_ ABSL_GUARDED_BY(mu_) = 0;
  ShardMapInstaller installer_ ABSL_GUARDED_BY(mu_);
};

}  // namespace paramserver

#endif  // PARAMSERVER_PS_PARAMETER_SERVER_SERVICE_H_
