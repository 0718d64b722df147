#include "scheduler/scheduler_service.h"

#include "common/rpc_status.h"
#include "spdlog/spdlog.h"

namespace paramserver {
namespace {

// Copies a successful result into *response; logs and converts a failure.
template <typename T>
grpc::Status Answer(const absl::StatusOr<T>& result, T* response, grpc::ServerContext* context) {
  if (!result.ok()) {
    spdlog::warn("refused a request from {}: {}", context->peer(), result.status().ToString());
    return ToGrpcStatus(result.status());
  }
  *response = *result;
  return grpc::Status::OK;
}

}  // namespace

SchedulerServiceImpl::SchedulerServiceImpl(ClusterRegistry* registry,
                                           std::function<void(const JobResult&)> on_result,
                                           std::function<void(MapChange)> on_map_change)
    : registry_(registry),
      on_result_(std::move(on_result)),
      on_map_change_(std::move(on_map_change)) {}

grpc::Status SchedulerServiceImpl::Register(grpc::ServerContext* context, const RegisterRequest* request,
                                            RegisterResponse* response) {
  std::optional<MapChange> change;
  absl::StatusOr<RegisterResponse> registered =
      registry_->Register(request->role(), request->advertised_address(), absl::Now(), &change);
  if (change.has_value()) on_map_change_(*std::move(change));
  if (registered.ok()) {
    spdlog::info("registered {} at {}", registered->node_name(), request->advertised_address());
    const ClusterView view = registry_->View();
    if (view.ready() && view.registered_servers() + view.registered_workers() ==
                            view.expected_servers() + view.expected_workers()) {
      spdlog::info("cluster complete: {} servers, {} workers, {} shards at epoch {}", view.expected_servers(),
                   view.expected_workers(), view.shard_map().shards_size(), view.shard_map().epoch());
    }
  }
  return Answer(registered, response, context);
}

grpc::Status SchedulerServiceImpl::GetClusterView(grpc::ServerContext*, const GetClusterViewRequest* request,
                                                  ClusterView* response) {
  if (!request->node_name().empty()) registry_->NoteAlive(request->node_name(), absl::Now());
  *response = registry_->View();
  return grpc::Status::OK;
}

grpc::Status SchedulerServiceImpl::Heartbeat(grpc::ServerContext* context, const HeartbeatRequest* request,
                                             HeartbeatResponse* response) {
  return Answer(registry_->Heartbeat(*request, absl::Now()), response, context);
}

grpc::Status SchedulerServiceImpl::ReportFinished(grpc::ServerContext* context,
                                                  const ReportFinishedRequest* request,
                                                  ReportFinishedResponse* response) {
  absl::StatusOr<ReportFinishedResponse> finished = registry_->ReportFinished(*request, absl::Now());
  if (finished.ok()) {
    spdlog::info("{} finished: {} steps, {} samples in {:.1f} s ({} of {} workers done)", request->node_name(),
                 request->steps(), request->samples(), request->seconds(), finished->workers_finished(),
                 finished->workers_total());
  }
  return Answer(finished, response, context);
}

grpc::Status SchedulerServiceImpl::ReportResult(grpc::ServerContext* context, const ReportResultRequest* request,
                                                ReportResultResponse*) {
  absl::StatusOr<JobResult> result = registry_->ReportResult(*request);
  if (!result.ok()) {
    spdlog::warn("refused a result from {}: {}", context->peer(), result.status().ToString());
    return ToGrpcStatus(result.status());
  }
  on_result_(*result);
  return grpc::Status::OK;
}

grpc::Status SchedulerServiceImpl::Leave(grpc::ServerContext* context, const LeaveRequest* request,
                                         LeaveResponse* response) {
  absl::StatusOr<MapChange> change = registry_->Leave(request->node_name());
  if (!change.ok()) {
    spdlog::warn("refused to let {} leave ({}): {}", request->node_name(), context->peer(), change.status().ToString());
    return ToGrpcStatus(change.status());
  }
  spdlog::warn("{} leaves the job: {}", request->node_name(), request->reason());
  response->set_epoch(change->map.epoch());
  on_map_change_(*std::move(change));
  return grpc::Status::OK;
}

}  // namespace paramserver
