// The gRPC face of the scheduler: converts requests and statuses; the state lives in
// ClusterRegistry.
#ifndef PARAMSERVER_SCHEDULER_SCHEDULER_SERVICE_H_
#define PARAMSERVER_SCHEDULER_SCHEDULER_SERVICE_H_

#include <atomic>
#include <functional>
#include <string>

#include "common/security/peer_credentials.h"
#include "common/security/refusal_log.h"
#include "proto/scheduler.grpc.pb.h"
#include "scheduler/cluster_registry.h"
#include "scheduler/map_wait_list.h"
#include "scheduler/registration_admission.h"

namespace paramserver {

// Thread-safe. `on_result` is called once, with no lock held, when the job's final
// result arrives; `on_map_change` when a registration changed the shard map;
// `save_state` (may be empty) before a lease is granted or the data declared done is
// answered, so that a scheduler taking over from the saved state knows every lease a
// worker was told of (a failed save answers UNAVAILABLE: the worker asks again and gets
// the same answer).
//
// Who may call what (docs/SECURITY.md): every call needs the cluster token when the
// job has one (else UNAUTHENTICATED, nothing read or changed). Register is rate-limited
// per caller, and its successes for all callers together (RegistrationAdmission;
// UNAVAILABLE: retry later), and checks the advertised address (INVALID_ARGUMENT).
// Heartbeat (and each message of a HeartbeatStream), ReportFinished, ReportResult, Leave,
// DeclareModel, LeaseData, and GetClusterView with a node_name, are accepted only from
// the node they name, proven by its node credential (UNAUTHENTICATED without one,
// PERMISSION_DENIED for another node's; either ends a stream). A heartbeat
// with a figure out of range is INVALID_ARGUMENT (ValidateHeartbeat): nothing of it is
// kept but the sign of life.
//
// Heartbeats, every node's each heartbeat interval (500 ms by default), one stream per
// node (HeartbeatStream; a call each from a node that has no streams), are served on
// gRPC's callback API, on gRPC's own callback threads (two on a 2-core machine), not a
// thread of the synchronous server's pool as the other calls are: measured cheaper
// (docs/PERFORMANCE.md). So a heartbeat must not block: it takes the registry's lock
// (twice: the caller's credential, then the heartbeat) and, on a refusal, the refusal
// log's. GetClusterView is served there too, and blocks no more: a long poll (wait_ms)
// is held in a MapWaitList, not on a thread nor on the registry's lock, and answered
// from the list's thread when a newer map is published (the registry tells the list),
// at the end of its wait, or at AnswerMapWaitsNow.
class SchedulerServiceImpl final
    : public Scheduler::WithCallbackMethod_HeartbeatStream<
          Scheduler::WithCallbackMethod_GetClusterView<
              Scheduler::WithCallbackMethod_Heartbeat<Scheduler::Service>>> {
 public:
  // `cluster_token` empty: no membership check. `refusals` (not owned) logs and counts
  // refused calls.
  SchedulerServiceImpl(ClusterRegistry* registry, std::string cluster_token, RefusalLog* refusals,
                       std::function<void(const JobResult&)> on_result,
                       std::function<void(MapChange)> on_map_change,
                       std::function<absl::Status()> save_state = nullptr);
  ~SchedulerServiceImpl() override;

  // Answers every GetClusterView call held waiting for a map change, and from now on
  // answers them at once; ends each heartbeat stream at its next message (UNAVAILABLE,
  // the scheduler is stopping) and refuses new ones: before the server shuts down,
  // which waits for every call.
  void AnswerMapWaitsNow();
  // How many GetClusterView calls are held waiting for a map change now.
  int map_waits_held() const { return map_waits_.held(); }

  grpc::Status Register(grpc::ServerContext* context, const RegisterRequest* request,
                        RegisterResponse* response) override;
  grpc::ServerUnaryReactor* GetClusterView(grpc::CallbackServerContext* context,
                                           const GetClusterViewRequest* request,
                                           ClusterView* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const HeartbeatRequest* request,
                                      HeartbeatResponse* response) override;
  // Heartbeat's stream, on gRPC's callback threads as Heartbeat: one read or write
  // outstanding at a time, each message answered as Heartbeat answers it.
  grpc::ServerBidiReactor<HeartbeatRequest, HeartbeatResponse>* HeartbeatStream(
      grpc::CallbackServerContext* context) override;
  // Heartbeats answered on streams, and streams opened, since the start.
  int64_t streamed_heartbeats() const { return streamed_heartbeats_.load(); }
  int64_t heartbeat_streams_opened() const { return heartbeat_streams_opened_.load(); }
  // A heartbeat stream opens only from a caller with a node credential, with a deadline
  // at most this far off (so each ends), and while fewer than kMaxHeartbeatStreams are
  // open (RESOURCE_EXHAUSTED past them: the node sends a Heartbeat call instead).
  static constexpr absl::Duration kMaxHeartbeatStreamLife = absl::Hours(1);
  static constexpr int kMaxHeartbeatStreams = 16384;
  grpc::Status ReportFinished(grpc::ServerContext* context, const ReportFinishedRequest* request,
                              ReportFinishedResponse* response) override;
  grpc::Status ReportResult(grpc::ServerContext* context, const ReportResultRequest* request,
                            ReportResultResponse* response) override;
  grpc::Status Leave(grpc::ServerContext* context, const LeaveRequest* request,
                     LeaveResponse* response) override;
  grpc::Status DeclareModel(grpc::ServerContext* context, const DeclareModelRequest* request,
                            DeclareModelResponse* response) override;
  grpc::Status LeaseData(grpc::ServerContext* context, const LeaseDataRequest* request,
                         LeaseDataResponse* response) override;

  // The most GetClusterView calls held waiting for a map change at once. Each holds no
  // thread, but its call's memory, which counts against the scheduler's gRPC memory
  // quota (kSmallServerMemoryQuota, 16 MiB) with every other call, heartbeats
  // included: kept where the thread-per-call design had it, not measured higher. Past
  // it a call is answered at once, and its worker polls every 50 ms instead
  // (worker/recovery.h).
  static constexpr int kMaxMapWaiters = 1024;

 private:
  class HeartbeatStreamReactor;

  // The node credential of a call naming `node_name`, checked: OK only from that node.
  grpc::Status RequireCaller(grpc::ServerContextBase* context, const std::string& node_name,
                             const char* what);
  // Logs (rate-limited) and counts a refusal; returns it as the call's status.
  grpc::Status Refuse(grpc::ServerContextBase* context, const absl::Status& why);
  // Copies a successful result into *response; refuses with a failure.
  template <typename T>
  grpc::Status Answer(const absl::StatusOr<T>& result, T* response,
                      grpc::ServerContextBase* context);
  // GetClusterView's checks: membership, the caller (a named node's sign of life is
  // noted), wait_ms's range. OK or the refusal.
  grpc::Status CheckViewRequest(grpc::ServerContextBase* context,
                                const GetClusterViewRequest& request);
  // GetClusterView's answer: the view now, its map's bytes shared (ViewWithoutMap).
  void FillView(ClusterView* response) const;
  // A heartbeat's answer (Heartbeat's work, whichever API serves it).
  grpc::Status AnswerHeartbeat(grpc::ServerContextBase* context, const HeartbeatRequest& request,
                               HeartbeatResponse* response);

  ClusterRegistry* const registry_;
  const CallerVerifier verifier_;
  RefusalLog* const refusals_;
  RegistrationAdmission registrations_;
  const std::function<void(const JobResult&)> on_result_;
  const std::function<void(MapChange)> on_map_change_;
  const std::function<absl::Status()> save_state_;
  // GetClusterView calls held waiting for a map change (each for at most kMaxMapWaitMs).
  MapWaitList map_waits_;
  std::atomic<bool> stopping_{false};  // AnswerMapWaitsNow was called
  std::atomic<int64_t> streamed_heartbeats_{0};
  std::atomic<int64_t> heartbeat_streams_opened_{0};
  std::atomic<int> open_heartbeat_streams_{0};
};

}  // namespace paramserver

#endif  // PARAMSERVER_SCHEDULER_SCHEDULER_SERVICE_H_
