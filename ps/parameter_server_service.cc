#include "ps/parameter_server_service.h"

#include "absl/strings/str_cat.h"
#include "common/rpc_status.h"
#include "common/tensor_codec.h"
#include "spdlog/spdlog.h"

namespace paramserver {

ParameterServerServiceImpl::ParameterServerServiceImpl(absl::Duration max_pull_wait, CheckpointWriter* checkpoints)
    : max_pull_wait_(max_pull_wait), checkpoints_(checkpoints) {}

void ParameterServerServiceImpl::set_installer(ShardMapInstaller installer) {
  absl::MutexLock lock(&mu_);
  installer_ = std::move(installer);
}

void ParameterServerServiceImpl::InstallShards(const std::string& node_name, int64_t epoch,
                                               std::map<int, std::shared_ptr<ParameterShard>> shards) {
  absl::MutexLock lock(&mu_);
  node_name_ = node_name;
  epoch_ = epoch;
  shards_ = std::move(shards);
}

void ParameterServerServiceImpl::CloseShards() {
  absl::MutexLock lock(&mu_);
  for (auto& [id, shard] : shards_) shard->Close("the server is shutting down");
}

int64_t ParameterServerServiceImpl::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

std::map<int, std::shared_ptr<ParameterShard>> ParameterServerServiceImpl::shards() const {
  absl::MutexLock lock(&mu_);
  return shards_;
}

int64_t ParameterServerServiceImpl::rejected_requests() const {
  absl::MutexLock lock(&mu_);
  return rejected_requests_;
}

absl::StatusOr<std::shared_ptr<ParameterShard>> ParameterServerServiceImpl::FindShard(int shard_id, int64_t epoch) {
  absl::MutexLock lock(&mu_);
  if (epoch_ == 0) {
    return absl::UnavailableError(absl::StrCat(node_name_, " has not been given its shards yet"));
  }
  if (epoch != epoch_) {
    return absl::FailedPreconditionError(absl::StrCat(epoch < epoch_ ? "stale" : "future", " epoch ", epoch,
                                                      " for shard ", shard_id, " on ", node_name_,
                                                      ": the current epoch is ", epoch_, "; refresh the shard map"));
  }
  auto it = shards_.find(shard_id);
  if (it == shards_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat(node_name_, " does not hold shard ", shard_id, " at epoch ", epoch_));
  }
  return it->second;
}

grpc::Status ParameterServerServiceImpl::Reject(const absl::Status& status, const std::string& peer) {
  // Not being ready yet, or a map change, is no fault of the caller's: it retries.
  if (status.code() == absl::StatusCode::kUnavailable) return ToGrpcStatus(status);
  {
    absl::MutexLock lock(&mu_);
    ++rejected_requests_;
  }
  if (status.code() == absl::StatusCode::kFailedPrecondition) {
    spdlog::debug("refused a request from {}: {}", peer, status.ToString());
  } else {
    spdlog::warn("rejected request from {}: {}", peer, status.ToString());
  }
  return ToGrpcStatus(status);
}

grpc::Status ParameterServerServiceImpl::Pull(grpc::ServerContext* context, const PullRequest* request,
                                              PullResponse* response) {
  absl::StatusOr<std::shared_ptr<ParameterShard>> shard = FindShard(request->shard_id(), request->epoch());
  if (!shard.ok()) return Reject(shard.status(), context->peer());
  const absl::Time deadline = std::min(absl::FromChrono(context->deadline()), absl::Now() + max_pull_wait_);
  absl::StatusOr<PulledValues> pulled = (*shard)->Pull(request->worker_rank(), request->step(), deadline);
  if (!pulled.ok()) {
    if (pulled.status().code() == absl::StatusCode::kInvalidArgument) {
      return Reject(pulled.status(), context->peer());
    }
    return ToGrpcStatus(pulled.status());
  }
  response->set_shard_id(request->shard_id());
  response->set_applied_updates(pulled->applied_updates);
  response->set_start_step(pulled->start_step);
  AppendFloatsLittleEndian(pulled->values, response->mutable_values());
  return grpc::Status::OK;
}

grpc::Status ParameterServerServiceImpl::Push(grpc::ServerContext* context, const PushRequest* request,
                                              PushResponse* response) {
  absl::StatusOr<std::shared_ptr<ParameterShard>> shard = FindShard(request->shard_id(), request->epoch());
  if (!shard.ok()) return Reject(shard.status(), context->peer());
  std::vector<float> gradient((*shard)->options().range.size());
  absl::Status decoded = DecodeFloatsExactly(request->gradient(), absl::MakeSpan(gradient),
                                             absl::StrCat("gradient for shard ", request->shard_id()));
  if (!decoded.ok()) return Reject(decoded, context->peer());
  absl::StatusOr<PushOutcome> outcome = (*shard)->Push(request->worker_rank(), request->step(), gradient);
  if (!outcome.ok()) return Reject(outcome.status(), context->peer());
  if (outcome->checkpoint.has_value() && checkpoints_ != nullptr) {
    outcome->checkpoint->epoch = request->epoch();
    checkpoints_->Enqueue(*std::move(outcome->checkpoint));
  }
  response->set_duplicate(outcome->duplicate);
  response->set_applied_updates(outcome->applied_updates);
  return grpc::Status::OK;
}

grpc::Status ParameterServerServiceImpl::InstallShardMap(grpc::ServerContext*, const InstallShardMapRequest* request,
                                                         InstallShardMapResponse* response) {
  ShardMapInstaller installer;
  {
    absl::MutexLock lock(&mu_);
    installer = installer_;
  }
  if (!installer) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "this server is still starting");
  absl::StatusOr<int64_t> serving = installer(request->shard_map());
  if (!serving.ok()) return ToGrpcStatus(serving.status());
  response->set_serving_epoch(*serving);
  return grpc::Status::OK;
}

grpc::Status ParameterServerServiceImpl::CheckpointAt(grpc::ServerContext*, const CheckpointAtRequest* request,
                                                      CheckpointAtResponse* response) {
  if (checkpoints_ == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "checkpoint.dir is not set");
  }
  for (const auto& [id, shard] : shards()) {
    if (!shard->ScheduleCheckpointAt(request->step())) response->add_passed_shards(id);
  }
  return grpc::Status::OK;
}

}  // namespace paramserver
