// The scheduler's admin service (proto/admin.proto): the cluster at a glance for
// operators and psctl, and the calls that change the job, which need the admin token.
#ifndef PARAMSERVER_SCHEDULER_ADMIN_SERVICE_H_
#define PARAMSERVER_SCHEDULER_ADMIN_SERVICE_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "common/security/peer_credentials.h"
#include "common/security/refusal_log.h"
#include "proto/admin.grpc.pb.h"
#include "scheduler/cluster_registry.h"

namespace paramserver {

struct AdminActions {
  std::function<absl::StatusOr<int64_t>()> request_checkpoint;  // the step every shard writes
  std::function<void(MapChange)> on_map_change;                 // a drain's new map, to publish
  std::function<void()> on_shutdown;                            // the job was shut down
};

// Thread-safe. Calls that change the job need metadata "authorization: Bearer <token>"
// matching `admin_token`: none is UNAUTHENTICATED, a wrong one PERMISSION_DENIED, both
// logged (rate-limited) and counted as kinds "admin_unauthenticated" and
// "admin_permission" in `refusals`; a call without the cluster token as "unauthenticated". With an
// empty `admin_token` they are all refused (PERMISSION_DENIED naming security.admin_token_file).
// GetStatus needs the token too when `reads_need_token`.
class AdminServiceImpl final : public Admin::Service {
 public:
  // `cluster_token` empty: no membership check; otherwise every call needs it
  // (UNAUTHENTICATED), and the admin token on top where said above. `refusals` (not
  // owned, outlives this) logs and counts refused calls.
  AdminServiceImpl(ClusterRegistry* registry, std::string cluster_token, std::string admin_token,
                   bool reads_need_token, AdminActions actions, RefusalLog* refusals);

  grpc::Status GetStatus(grpc::ServerContext* context, const GetStatusRequest* request,
                         ClusterStatus* response) override;
  grpc::Status RequestCheckpoint(grpc::ServerContext* context,
                                 const RequestCheckpointRequest* request,
                                 RequestCheckpointResponse* response) override;
  grpc::Status DrainServer(grpc::ServerContext* context, const DrainServerRequest* request,
                           DrainServerResponse* response) override;
  grpc::Status Shutdown(grpc::ServerContext* context, const ShutdownRequest* request,
                        ShutdownResponse* response) override;

 private:
  // OK if the caller may make call `what`; the refusal otherwise (and logs it).
  grpc::Status Authorize(grpc::ServerContext* context, bool changes_the_job,
                         const char* what) const;
  // Logs (rate-limited) and counts refusal `why` of kind `kind`; returns it.
  grpc::Status Refuse(grpc::ServerContext* context, absl::string_view kind,
                      const absl::Status& why) const;

  ClusterRegistry* const registry_;
  const CallerVerifier membership_;
  const std::string admin_token_;
  const bool reads_need_token_;
  const AdminActions actions_;
  RefusalLog* const refusals_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_SCHEDULER_ADMIN_SERVICE_H_
