// What servers and workers ask of the scheduler: registration, the cluster view,
// heartbeats and job completion, each with a deadline.
#ifndef PARAMSERVER_COMMON_RPC_SCHEDULER_CLIENT_H_
#define PARAMSERVER_COMMON_RPC_SCHEDULER_CLIENT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/rpc/heartbeat_stream.h"
#include "common/security/peer_credentials.h"
#include "proto/scheduler.grpc.pb.h"

namespace paramserver {

// Thread-safe (gRPC stubs are). Every call has a per-attempt timeout of `rpc_timeout`.
class SchedulerClient {
 public:
  // Every call carries `credentials` (may be null: none); a successful Register sets
  // their identity to the node's new name and the token it registered with.
  SchedulerClient(const std::string& scheduler_address, absl::Duration rpc_timeout,
                  std::shared_ptr<CallCredentials> credentials = nullptr);

  const std::string& scheduler_address() const { return address_; }

  // Registers this node with a credential it makes now (a new one each call, the same
  // for the call's retries; the scheduler keeps only its digest), retrying while the
  // scheduler is unreachable (it may start after us) until `deadline`. Errors other
  // than UNAVAILABLE are returned at once.
  absl::StatusOr<RegisterResponse> Register(NodeRole role, const std::string& advertised_address,
                                            absl::Time deadline);

  // Polls until the cluster view is ready (every expected node registered), logging who
  // is still missing every few seconds. DEADLINE_EXCEEDED naming the missing nodes;
  // CANCELLED once `stopped` (when given; asked before every poll) says so.
  absl::StatusOr<ClusterView> WaitForReady(const std::string& node_name, absl::Time deadline,
                                           const std::function<bool()>& stopped = nullptr);

  // Polls until every worker has reported finished. DEADLINE_EXCEEDED saying how many
  // are still training.
  absl::StatusOr<ClusterView> WaitForWorkersFinished(const std::string& node_name,
                                                     absl::Time deadline);

  absl::StatusOr<ClusterView> GetClusterView(const std::string& node_name);
  // The view once its shard map's epoch is above `epoch`, or after `wait` (at most
  // kMaxMapWaitMs, common/rpc/map_wait.h; longer is cut to it), whichever comes first:
  // a node waiting for a map change hears of it as the scheduler publishes it.
  absl::StatusOr<ClusterView> AwaitMapChange(const std::string& node_name, int64_t epoch,
                                             absl::Duration wait);
  // This node's heartbeat, on its heartbeat stream (HeartbeatStream; one beat at a time
  // per client), or as a call of its own to a scheduler that serves no streams.
  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request)
      ABSL_LOCKS_EXCLUDED(heartbeat_mu_);
  // Ends the heartbeat stream, if one is open (this node stops heartbeating).
  void CloseHeartbeatStream() ABSL_LOCKS_EXCLUDED(heartbeat_mu_);
  absl::StatusOr<ReportFinishedResponse> ReportFinished(const ReportFinishedRequest& request);
  absl::Status ReportResult(const ReportResultRequest& request);
  // This node leaves the job (a spot interruption notice). Errors as above.
  absl::StatusOr<LeaveResponse> Leave(const std::string& node_name, const std::string& reason);
  // A model.type torch worker declares its model. Errors as above; the scheduler's
  // refusals (a model that differs from the job's, naming the tensor) in its words.
  absl::StatusOr<DeclareModelResponse> DeclareModel(const DeclareModelRequest& request);
  // data.sharding: dynamic: this worker's next lease (LeaseDataRequest in
  // proto/scheduler.proto). Errors as above.
  absl::StatusOr<LeaseDataResponse> LeaseData(const LeaseDataRequest& request);

 private:
  // Polls the cluster view until `still_missing` returns "" for it, logging what is
  // still missing every few seconds. DEADLINE_EXCEEDED naming it at `deadline`; CANCELLED
  // once `stopped` (when given) says so.
  absl::StatusOr<ClusterView> PollClusterView(
      const std::string& node_name, absl::Time deadline, const std::string& waiting_for,
      const std::function<std::string(const ClusterView&)>& still_missing,
      const std::function<bool()>& stopped = nullptr);

  std::string address_;
  absl::Duration rpc_timeout_;
  const std::shared_ptr<CallCredentials> credentials_;
  std::unique_ptr<Scheduler::Stub> stub_;
  absl::Mutex heartbeat_mu_;  // held for a beat
  std::unique_ptr<HeartbeatStream> heartbeat_stream_ ABSL_GUARDED_BY(heartbeat_mu_);
  bool heartbeats_unary_ ABSL_GUARDED_BY(heartbeat_mu_) = false;  // the scheduler has no streams
  // The token of this process's last registration (RegisterRequest.previous_node_token).
  absl::Mutex mu_;
  std::string last_node_token_ ABSL_GUARDED_BY(mu_);
};

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_RPC_SCHEDULER_CLIENT_H_
