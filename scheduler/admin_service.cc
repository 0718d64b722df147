#include "scheduler/admin_service.h"

#include "absl/strings/str_cat.h"
#include "common/rpc/rpc_status.h"
#include "common/security/admin_token.h"
#include "scheduler/cluster_status.h"
#include "spdlog/spdlog.h"

namespace paramserver {

AdminServiceImpl::AdminServiceImpl(ClusterRegistry* registry, std::string cluster_token,
                                   std::string admin_token, bool reads_need_token,
                                   AdminActions actions, RefusalLog* refusals)
    : registry_(registry),
      membership_(std::move(cluster_token), [](const std::string&) { return std::nullopt; }),
      admin_token_(std::move(admin_token)),
      reads_need_token_(reads_need_token),
      actions_(std::move(actions)),
      refusals_(refusals) {}

grpc::Status AdminServiceImpl::Refuse(grpc::ServerContext* context, absl::string_view kind,
                                      const absl::Status& why) const {
  refusals_->Refused(kind, RefusalCaller(*context), why);
  return ToGrpcStatus(why);
}

grpc::Status AdminServiceImpl::Authorize(grpc::ServerContext* context, bool changes_the_job,
                                         const char* what) const {
  if (absl::Status member = membership_.CheckMembership(*context); !member.ok()) {
    return Refuse(context, "unauthenticated",
                  absl::UnauthenticatedError(
                      absl::StrCat(what, ": ", member.message(),
                                   " (psctl --cluster-token-file or PSCTL_CLUSTER_TOKEN_FILE)")));
  }
  if (!changes_the_job && !reads_need_token_) return grpc::Status::OK;
  if (admin_token_.empty()) {
    return Refuse(context, "admin_permission",
                  absl::PermissionDeniedError(
                      absl::StrCat(what,
                                   " needs the admin token, and this job has none: set "
                                   "security.admin_token_file in the cluster spec")));
  }
  const auto& metadata = context->client_metadata();
  auto presented = metadata.find(kAuthorizationMetadata);
  if (presented == metadata.end()) {
    return Refuse(context, "admin_unauthenticated",
                  absl::UnauthenticatedError(absl::StrCat(
                      what, " needs the admin token (psctl --token-file or PSCTL_TOKEN_FILE)")));
  }
  if (!BearerMatches(absl::string_view(presented->second.data(), presented->second.size()),
                     admin_token_)) {
    return Refuse(context, "admin_permission",
                  absl::PermissionDeniedError(absl::StrCat(what, ": wrong admin token")));
  }
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::GetStatus(grpc::ServerContext* context,
                                         const GetStatusRequest* request, ClusterStatus* response) {
  if (grpc::Status allowed = Authorize(context, false, "status"); !allowed.ok()) return allowed;
  *response = DescribeCluster(registry_->TakeSnapshot(request->with_history()), absl::Now());
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::RequestCheckpoint(grpc::ServerContext* context,
                                                 const RequestCheckpointRequest*,
                                                 RequestCheckpointResponse* response) {
  if (grpc::Status allowed = Authorize(context, true, "checkpoint"); !allowed.ok()) return allowed;
  absl::StatusOr<int64_t> step = actions_.request_checkpoint();
  if (!step.ok()) return ToGrpcStatus(step.status());
  spdlog::info("checkpoint at step {} requested by {}", *step, context->peer());
  response->set_step(*step);
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::DrainServer(grpc::ServerContext* context,
                                           const DrainServerRequest* request,
                                           DrainServerResponse* response) {
  if (grpc::Status allowed = Authorize(context, true, "drain"); !allowed.ok()) return allowed;
  absl::StatusOr<MapChange> change = registry_->Drain(request->node_name());
  if (!change.ok()) return Refuse(context, "admin_drain", change.status());
  spdlog::info("drain of {} requested by {}", request->node_name(), context->peer());
  response->set_epoch(change->map.epoch());
  actions_.on_map_change(*std::move(change));
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::Shutdown(grpc::ServerContext* context, const ShutdownRequest*,
                                        ShutdownResponse*) {
  if (grpc::Status allowed = Authorize(context, true, "shutdown"); !allowed.ok()) return allowed;
  spdlog::warn("shutdown of the whole job requested by {}", context->peer());
  registry_->RequestShutdown();
  actions_.on_shutdown();
  return grpc::Status::OK;
}

}  // namespace paramserver
