// The gRPC face of the scheduler: converts requests and statuses; the state lives in
// ClusterRegistry.
#ifndef PARAMSERVER_SCHEDULER_SCHEDULER_SERVICE_H_
#define PARAMSERVER_SCHEDULER_SCHEDULER_SERVICE_H_

#include <functional>

#include "proto/scheduler.grpc.pb.h"
#include "scheduler/cluster_registry.h"

namespace paramserver {

// Thread-safe. `on_result` is called once, with no lock held, when the job's final
// result arrives; `on_map_change` when a registration changed the shard map.
class SchedulerServiceImpl final : public Scheduler::Service {
 public:
  SchedulerServiceImpl(ClusterRegistry* registry, std::function<void(const JobResult&)> on_result,
                       std::function<void(MapChange)> on_map_change);

  grpc::Status Register(grpc::ServerContext* context, const RegisterRequest* request,
                        RegisterResponse* response) override;
  grpc::Status GetClusterView(grpc::ServerContext* context, const GetClusterViewRequest* request,
                              ClusterView* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const HeartbeatRequest* request,
                         HeartbeatResponse* response) override;
  grpc::Status ReportFinished(grpc::ServerContext* context, const ReportFinishedRequest* request,
                              ReportFinishedResponse* response) override;
  grpc::Status ReportResult(grpc::ServerContext* context, const ReportResultRequest* request,
                            ReportResultResponse* response) override;
  grpc::Status Leave(grpc::ServerContext* context, const LeaveRequest* request, LeaveResponse* response) override;

 private:
  ClusterRegistry* const registry_;
  const std::function<void(const JobResult&)> on_result_;
  const std::function<void(MapChange)> on_map_change_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_SCHEDULER_SCHEDULER_SERVICE_H_
