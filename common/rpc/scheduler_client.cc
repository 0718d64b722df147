#include "common/rpc/scheduler_client.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/rpc/map_wait.h"
#include "common/rpc/retry_policy.h"
#include "common/rpc/rpc_endpoints.h"
#include "common/rpc/rpc_status.h"
#include "common/security/secrets.h"
#include "spdlog/spdlog.h"

namespace paramserver {
namespace {

constexpr absl::Duration kPollInterval = absl::Milliseconds(50);
// Between registration attempts: a fixed interval (the scheduler may be starting).
constexpr BackoffPolicy kRegisterRetryInterval{absl::Milliseconds(200), absl::Milliseconds(200)};
constexpr absl::Duration kProgressLogInterval = absl::Seconds(5);

// One unary call to the scheduler with a deadline; errors say what was attempted.
template <typename Response, typename Request, typename Method>
absl::StatusOr<Response> CallScheduler(Scheduler::Stub& stub, Method method, const Request& request,
                                       absl::Duration timeout, const std::string& what) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  Response response;
  const grpc::Status status = (stub.*method)(&context, request, &response);
  if (!status.ok()) return RpcError(status, what);
  return response;
}

}  // namespace

SchedulerClient::SchedulerClient(const std::string& scheduler_address, absl::Duration rpc_timeout,
                                 std::shared_ptr<CallCredentials> credentials)
    : address_(scheduler_address),
      rpc_timeout_(rpc_timeout),
      credentials_(std::move(credentials)),
      stub_(Scheduler::NewStub(CreateChannel(scheduler_address, credentials_))) {}

absl::StatusOr<RegisterResponse> SchedulerClient::Register(NodeRole role,
                                                           const std::string& advertised_address,
                                                           absl::Time deadline) {
  RegisterRequest request;
  request.set_role(role);
  request.set_advertised_address(advertised_address);
  // The node's credential: the scheduler never sees anything it could re-create it
  // from but this request.
  const std::string node_token = NewSecretToken();
  request.set_node_token(node_token);
  {
    absl::MutexLock lock(&mu_);
    request.set_previous_node_token(last_node_token_);
  }
  absl::Time next_log = absl::Now() + kProgressLogInterval;
  ExponentialBackoff backoff(kRegisterRetryInterval);
  while (true) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(std::min(deadline, absl::Now() + rpc_timeout_)));
    RegisterResponse response;
    grpc::Status status = stub_->Register(&context, request, &response);
    if (status.ok()) {
      if (credentials_ != nullptr) credentials_->SetIdentity(response.node_name(), node_token);
      absl::MutexLock lock(&mu_);
      last_node_token_ = node_token;
      return response;
    }
    // Unreachable, another process's node still alive at our address, or too many
    // registrations at once (UNAVAILABLE): all pass.
    const bool retryable = IsRetryable(static_cast<absl::StatusCode>(status.error_code()),
                                       /*deadline_exceeded_too=*/true);
    if (!retryable || !backoff.CanRetryBefore(deadline)) {
      return RpcError(status, absl::StrCat("register with the scheduler at ", address_));
    }
    if (absl::Now() >= next_log) {
      spdlog::info("waiting for the scheduler at {}: {}", address_, status.error_message());
      next_log = absl::Now() + kProgressLogInterval;
    }
    backoff.Wait();
  }
}

absl::StatusOr<ClusterView> SchedulerClient::GetClusterView(const std::string& node_name) {
  GetClusterViewRequest request;
  request.set_node_name(node_name);
  return CallScheduler<ClusterView>(*stub_, &Scheduler::Stub::GetClusterView, request, rpc_timeout_,
                                    absl::StrCat("get the cluster view from ", address_));
}

absl::StatusOr<ClusterView> SchedulerClient::AwaitMapChange(const std::string& node_name,
                                                            int64_t epoch, absl::Duration wait) {
  GetClusterViewRequest request;
  request.set_node_name(node_name);
  request.set_wait_for_epoch_above(epoch);
  const absl::Duration bounded =
      std::clamp(wait, absl::ZeroDuration(), absl::Milliseconds(kMaxMapWaitMs));
  request.set_wait_ms(static_cast<int32_t>(absl::ToInt64Milliseconds(bounded)));
  return CallScheduler<ClusterView>(*stub_, &Scheduler::Stub::GetClusterView, request,
                                    rpc_timeout_ + bounded,
                                    absl::StrCat("await a map change from ", address_));
}

absl::StatusOr<ClusterView> SchedulerClient::PollClusterView(
    const std::string& node_name, absl::Time deadline, const std::string& waiting_for,
    const std::function<std::string(const ClusterView&)>& still_missing,
    const std::function<bool()>& stopped) {
  absl::Time next_log = absl::Now() + kProgressLogInterval;
  std::string missing = "the scheduler's answer";
  while (absl::Now() < deadline) {
    if (stopped && stopped()) {
      return absl::CancelledError(
          absl::StrCat("stopped while waiting for ", waiting_for, ": still missing ", missing));
    }
    absl::StatusOr<ClusterView> view = GetClusterView(node_name);
    if (view.ok()) {
      missing = still_missing(*view);
      if (missing.empty()) return view;
    } else if (view.status().code() != absl::StatusCode::kUnavailable) {
      return view.status();
    }
    if (absl::Now() >= next_log) {
      spdlog::info("waiting for {}: still missing {}", waiting_for, missing);
      next_log = absl::Now() + kProgressLogInterval;
    }
    std::this_thread::sleep_for(absl::ToChronoNanoseconds(kPollInterval));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("gave up waiting for ", waiting_for, ": still missing ", missing));
}

absl::StatusOr<ClusterView> SchedulerClient::WaitForReady(const std::string& node_name,
                                                          absl::Time deadline,
                                                          const std::function<bool()>& stopped) {
  return PollClusterView(
      node_name, deadline, "the cluster to form",
      [](const ClusterView& view) {
        if (view.ready()) return std::string();
        // Nodes past a range's min may register before the cluster forms: none missing then.
        return absl::StrCat(std::max(0, view.expected_servers() - view.registered_servers()),
                            " of ", view.expected_servers(), " servers and ",
                            std::max(0, view.expected_workers() - view.registered_workers()),
                            " of ", view.expected_workers(), " workers");
      },
      stopped);
}

absl::StatusOr<ClusterView> SchedulerClient::WaitForWorkersFinished(const std::string& node_name,
                                                                    absl::Time deadline) {
  return PollClusterView(node_name, deadline, "every worker to finish",
                         [](const ClusterView& view) {
                           const int still_training = view.live_workers() - view.workers_finished();
                           if (still_training <= 0) return std::string();
                           return absl::StrCat(still_training, " worker(s) still training");
                         });
}

absl::StatusOr<HeartbeatResponse> SchedulerClient::Heartbeat(const HeartbeatRequest& request) {
  const std::string what = absl::StrCat("heartbeat to ", address_);
  absl::MutexLock lock(&heartbeat_mu_);
  if (!heartbeats_unary_) {
    if (heartbeat_stream_ == nullptr)
      heartbeat_stream_ = std::make_unique<HeartbeatStream>(stub_.get(), rpc_timeout_, what);
    absl::StatusOr<HeartbeatResponse> answer = heartbeat_stream_->Beat(request);
    // RESOURCE_EXHAUSTED: the scheduler holds too many streams; this beat as a call.
    if (!absl::IsUnimplemented(answer.status()) && !absl::IsResourceExhausted(answer.status()))
      return answer;
    if (absl::IsUnimplemented(answer.status())) {
      spdlog::info("the scheduler at {} serves no heartbeat streams: a call a heartbeat", address_);
      heartbeats_unary_ = true;
      heartbeat_stream_.reset();
    }
  }
  return CallScheduler<HeartbeatResponse>(*stub_, &Scheduler::Stub::Heartbeat, request,
                                          rpc_timeout_, what);
}

void SchedulerClient::CloseHeartbeatStream() {
  absl::MutexLock lock(&heartbeat_mu_);
  if (heartbeat_stream_ != nullptr) heartbeat_stream_->Close();
}

absl::StatusOr<ReportFinishedResponse> SchedulerClient::ReportFinished(
    const ReportFinishedRequest& request) {
  return CallScheduler<ReportFinishedResponse>(*stub_, &Scheduler::Stub::ReportFinished, request,
                                               rpc_timeout_,
                                               absl::StrCat("report finished to ", address_));
}

absl::StatusOr<LeaveResponse> SchedulerClient::Leave(const std::string& node_name,
                                                     const std::string& reason) {
  LeaveRequest request;
  request.set_node_name(node_name);
  request.set_reason(reason);
  return CallScheduler<LeaveResponse>(*stub_, &Scheduler::Stub::Leave, request, rpc_timeout_,
                                      absl::StrCat("leave the job as ", node_name));
}

absl::StatusOr<LeaseDataResponse> SchedulerClient::LeaseData(const LeaseDataRequest& request) {
  return CallScheduler<LeaseDataResponse>(*stub_, &Scheduler::Stub::LeaseData, request,
                                          rpc_timeout_, absl::StrCat("lease data from ", address_));
}

absl::StatusOr<DeclareModelResponse> SchedulerClient::DeclareModel(
    const DeclareModelRequest& request) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout_));
  DeclareModelResponse response;
  const grpc::Status status = stub_->DeclareModel(&context, request, &response);
  if (status.ok()) return response;
  // The scheduler's verdict on the model (how it differs from the job's) in its own
  // words: the script's author reads it as the exception's message.
  if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
      status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  }
  return RpcError(status, absl::StrCat("declare the model to ", address_));
}

absl::Status SchedulerClient::ReportResult(const ReportResultRequest& request) {
  return CallScheduler<ReportResultResponse>(*stub_, &Scheduler::Stub::ReportResult, request,
                                             rpc_timeout_,
                                             absl::StrCat("report the result to ", address_))
      .status();
}

}  // namespace paramserver
