#include "scheduler/scheduler_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/rpc/map_wait.h"
#include "common/rpc/rpc_status.h"
#include "google/protobuf/unknown_field_set.h"
#include "scheduler/heartbeat_validation.h"
#include "spdlog/spdlog.h"

namespace paramserver {
namespace {

// Per caller, a node's registration and a few retries; for all callers together,
// enough successful registrations for a whole cluster at once, then a few a second.
RegistrationAdmission::Limits RegistrationLimits(const ClusterRegistry& registry) {
  const ClusterView view = registry.View();
  RegistrationAdmission::Limits limits;
  limits.registrations_burst =
      std::max(32, 2 * (view.expected_servers() + view.expected_workers()));
  return limits;
}

}  // namespace

SchedulerServiceImpl::SchedulerServiceImpl(ClusterRegistry* registry, std::string cluster_token,
                                           RefusalLog* refusals,
                                           std::function<void(const JobResult&)> on_result,
                                           std::function<void(MapChange)> on_map_change,
                                           std::function<absl::Status()> save_state)
    : registry_(registry),
      verifier_(std::move(cluster_token),
                [registry](const std::string& name) { return registry->FindCredential(name); }),
      refusals_(refusals),
      registrations_(RegistrationLimits(*registry)),
      on_result_(std::move(on_result)),
      on_map_change_(std::move(on_map_change)),
      save_state_(std::move(save_state)),
      map_waits_(kMaxMapWaiters, /*published_epoch=*/0) {
  registry_->SetMapListener([this](int64_t epoch) { map_waits_.Published(epoch); });
}

grpc::Status SchedulerServiceImpl::Refuse(grpc::ServerContextBase* context,
                                          const absl::Status& why) {
  refusals_->Refused(RefusalKind(why.code()), RefusalCaller(*context), why);
  return ToGrpcStatus(why);
}

grpc::Status SchedulerServiceImpl::RequireCaller(grpc::ServerContextBase* context,
                                                 const std::string& node_name, const char* what) {
  absl::StatusOr<VerifiedCaller> caller = verifier_.Identify(*context);
  if (!caller.ok()) return Refuse(context, caller.status());
  if (caller->name != node_name) {
    return Refuse(context, absl::PermissionDeniedError(
                               absl::StrCat(caller->name, " may not send ", what, " for ",
                                            node_name.size() <= 64 ? node_name : "another node")));
  }
  return grpc::Status::OK;
}

template <typename T>
grpc::Status SchedulerServiceImpl::Answer(const absl::StatusOr<T>& result, T* response,
                                          grpc::ServerContextBase* context) {
  if (!result.ok()) return Refuse(context, result.status());
  *response = *result;
  return grpc::Status::OK;
}

grpc::Status SchedulerServiceImpl::Register(grpc::ServerContext* context,
                                            const RegisterRequest* request,
                                            RegisterResponse* response) {
  if (absl::Status member = verifier_.CheckMembership(*context); !member.ok()) {
    return Refuse(context, member);
  }
  if (absl::Status admitted = registrations_.Admit(
          RegistrationCaller(context->peer(), request->advertised_address()), absl::Now());
      !admitted.ok()) {
    return Refuse(context, admitted);
  }
  if (absl::Status address = CheckAdvertisedAddress(request->advertised_address()); !address.ok()) {
    return Refuse(context, address);
  }
  std::optional<MapChange> change;
  absl::StatusOr<RegisterResponse> registered =
      registry_->Register(request->role(), request->advertised_address(), request->node_token(),
                          absl::Now(), &change, request->previous_node_token());
  if (change.has_value()) on_map_change_(*std::move(change));
  if (registered.ok()) {
    registrations_.NoteRegistered(absl::Now());
    spdlog::info("registered {} at {}", registered->node_name(), request->advertised_address());
    const ClusterView view = registry_->View();
    if (view.ready() && view.registered_servers() + view.registered_workers() ==
                            view.expected_servers() + view.expected_workers()) {
      spdlog::info("cluster complete: {} servers, {} workers, {} shards at epoch {}",
                   view.expected_servers(), view.expected_workers(), view.shard_map().shards_size(),
                   view.shard_map().epoch());
    }
  }
  return Answer(registered, response, context);
}

SchedulerServiceImpl::~SchedulerServiceImpl() {
  registry_->SetMapListener(nullptr);  // before map_waits_ goes
}

void SchedulerServiceImpl::AnswerMapWaitsNow() {
  stopping_ = true;
  map_waits_.Close();
}

grpc::ServerUnaryReactor* SchedulerServiceImpl::GetClusterView(grpc::CallbackServerContext* context,
                                                               const GetClusterViewRequest* request,
                                                               ClusterView* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (grpc::Status refused = CheckViewRequest(context, *request); !refused.ok()) {
    reactor->Finish(refused);
    return reactor;
  }
  // A long poll is held in map_waits_ (no thread waits for it) and answered from there;
  // past kMaxMapWaiters, or with the map already newer, it is answered now.
  // A finished worker answered here that the job finished counts as told
  // (NoteToldJobFinished; CheckViewRequest checked that the caller is the node it names).
  auto answer = [this, reactor, response, node_name = request->node_name()](MapWaitList::Outcome) {
    FillView(response);
    if (response->job_finished() && !node_name.empty()) registry_->NoteToldJobFinished(node_name);
    reactor->Finish(grpc::Status::OK);
  };
  if (request->wait_ms() > 0 &&
      map_waits_.Hold(request->wait_for_epoch_above(),
                      absl::Now() + absl::Milliseconds(request->wait_ms()), answer)) {
    return reactor;
  }
  answer(MapWaitList::Outcome::kNewMap);
  return reactor;
}

grpc::Status SchedulerServiceImpl::CheckViewRequest(grpc::ServerContextBase* context,
                                                    const GetClusterViewRequest& request) {
  if (absl::Status member = verifier_.CheckMembership(*context); !member.ok()) {
    return Refuse(context, member);
  }
  if (!request.node_name().empty()) {
    // A sign of life counts only from the node itself.
    if (grpc::Status allowed = RequireCaller(context, request.node_name(), "signs of life");
        !allowed.ok()) {
      return allowed;
    }
    registry_->NoteAlive(request.node_name(), absl::Now());
  }
  if (request.wait_ms() < 0 || request.wait_ms() > kMaxMapWaitMs) {
    return Refuse(context, absl::InvalidArgumentError(absl::StrCat(
                               "wait_ms ", request.wait_ms(), " is out of range: 0 to ",
                               kMaxMapWaitMs, " ms of waiting for a map change")));
  }
  if (request.wait_ms() > 0 && request.node_name().empty()) {
    // Only a node (checked above to be the one it names) may have its call held.
    return Refuse(context, absl::InvalidArgumentError(
                               "a wait for a map change (wait_ms) names the node that waits "
                               "(node_name)"));
  }
  return grpc::Status::OK;
}

void SchedulerServiceImpl::FillView(ClusterView* response) const {
  std::shared_ptr<const std::string> map_bytes;
  *response = registry_->ViewWithoutMap(&map_bytes);
  if (map_bytes != nullptr) {
    // The map as its field's bytes (ClusterView.shard_map), serialized once per map for
    // every caller: a node parses the answer exactly as if the field had been set.
    ClusterView::GetReflection()->MutableUnknownFields(response)->AddLengthDelimited(
        ClusterView::kShardMapFieldNumber, *map_bytes);
  }
}

grpc::ServerUnaryReactor* SchedulerServiceImpl::Heartbeat(grpc::CallbackServerContext* context,
                                                          const HeartbeatRequest* request,
                                                          HeartbeatResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(AnswerHeartbeat(context, *request, response));
  return reactor;
}

// One node's heartbeat stream. Reads a beat, answers it, reads the next: a single read
// or write outstanding at a time, so every callback runs alone, and Finish is called
// once, from the callback that ends the stream. Deletes itself when the call is done.
class SchedulerServiceImpl::HeartbeatStreamReactor final
    : public grpc::ServerBidiReactor<HeartbeatRequest, HeartbeatResponse> {
 public:
  HeartbeatStreamReactor(SchedulerServiceImpl* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context) {
    if (grpc::Status refused = Admit(); !refused.ok()) {
      Finish(refused);
      return;
    }
    counted_ = true;
    ++service_->heartbeat_streams_opened_;
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    // Not ok: the node closed its side, or the call ended (cancelled, its deadline).
    if (!ok) return Finish(grpc::Status::OK);
    if (service_->stopping_) {
      return Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the scheduler is stopping"));
    }
    response_.Clear();
    if (grpc::Status answered = service_->AnswerHeartbeat(context_, request_, &response_);
        !answered.ok()) {
      return Finish(answered);
    }
    ++service_->streamed_heartbeats_;
    StartWrite(&response_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      return Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the heartbeat stream broke"));
    }
    StartRead(&request_);
  }

  void OnDone() override {
    if (counted_) --service_->open_heartbeat_streams_;
    delete this;
  }

 private:
  // Whether the stream may open: a caller with a node credential (each message is
  // checked against it too), a deadline within kMaxHeartbeatStreamLife, room under
  // kMaxHeartbeatStreams, and a scheduler not stopping. Counts it when it may.
  grpc::Status Admit() {
    if (service_->stopping_) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the scheduler is stopping");
    }
    if (absl::StatusOr<VerifiedCaller> caller = service_->verifier_.Identify(*context_);
        !caller.ok()) {
      return service_->Refuse(context_, caller.status());
    }
    if (context_->deadline() >
        absl::ToChronoTime(absl::Now() + SchedulerServiceImpl::kMaxHeartbeatStreamLife)) {
      return service_->Refuse(
          context_, absl::InvalidArgumentError(absl::StrCat(
                        "a heartbeat stream needs a deadline within ",
                        absl::FormatDuration(SchedulerServiceImpl::kMaxHeartbeatStreamLife))));
    }
    if (++service_->open_heartbeat_streams_ > SchedulerServiceImpl::kMaxHeartbeatStreams) {
      --service_->open_heartbeat_streams_;
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          "too many heartbeat streams open: send a Heartbeat call");
    }
    return grpc::Status::OK;
  }

  SchedulerServiceImpl* const service_;
  grpc::CallbackServerContext* const context_;
  bool counted_ = false;  // in open_heartbeat_streams_
  HeartbeatRequest request_;
  HeartbeatResponse response_;
};

grpc::ServerBidiReactor<HeartbeatRequest, HeartbeatResponse>* SchedulerServiceImpl::HeartbeatStream(
    grpc::CallbackServerContext* context) {
  return new HeartbeatStreamReactor(this, context);
}

grpc::Status SchedulerServiceImpl::AnswerHeartbeat(grpc::ServerContextBase* context,
                                                   const HeartbeatRequest& request,
                                                   HeartbeatResponse* response) {
  if (grpc::Status allowed = RequireCaller(context, request.node_name(), "heartbeats");
      !allowed.ok())
    return allowed;
  // No figure of a heartbeat is kept (or shown) unless every figure in it is in range.
  // The node proved who it is, so its sign of life counts (a diverged loss is not a
  // death) and it is answered as any heartbeat is (the epoch, the end of the job, the
  // scheduler's identity): the refusal is logged and counted here, not fatal there.
  if (absl::Status valid = ValidateHeartbeat(request); !valid.ok()) {
    refusals_->Refused(RefusalKind(valid.code()), RefusalCaller(*context), valid);
    HeartbeatRequest figureless;
    figureless.set_node_name(request.node_name());
    figureless.set_serving_epoch(std::max<int64_t>(0, request.serving_epoch()));
    return Answer(registry_->Heartbeat(figureless, absl::Now()), response, context);
  }
  return Answer(registry_->Heartbeat(request, absl::Now()), response, context);
}

grpc::Status SchedulerServiceImpl::ReportFinished(grpc::ServerContext* context,
                                                  const ReportFinishedRequest* request,
                                                  ReportFinishedResponse* response) {
  if (grpc::Status allowed = RequireCaller(context, request->node_name(), "ReportFinished");
      !allowed.ok()) {
    return allowed;
  }
  absl::StatusOr<ReportFinishedResponse> finished =
      registry_->ReportFinished(*request, absl::Now());
  if (finished.ok()) {
    spdlog::info("{} finished: {} steps, {} samples in {:.1f} s ({} of {} workers done)",
                 request->node_name(), request->steps(), request->samples(), request->seconds(),
                 finished->workers_finished(), finished->workers_total());
  }
  return Answer(finished, response, context);
}

grpc::Status SchedulerServiceImpl::ReportResult(grpc::ServerContext* context,
                                                const ReportResultRequest* request,
                                                ReportResultResponse*) {
  if (grpc::Status allowed = RequireCaller(context, request->node_name(), "ReportResult");
      !allowed.ok()) {
    return allowed;
  }
  absl::StatusOr<JobResult> result = registry_->ReportResult(*request);
  if (!result.ok()) return Refuse(context, result.status());
  on_result_(*result);
  return grpc::Status::OK;
}

grpc::Status SchedulerServiceImpl::DeclareModel(grpc::ServerContext* context,
                                                const DeclareModelRequest* request,
                                                DeclareModelResponse* response) {
  if (grpc::Status allowed = RequireCaller(context, request->node_name(), "DeclareModel");
      !allowed.ok()) {
    return allowed;
  }
  absl::StatusOr<DeclareModelResponse> declared =
      registry_->DeclareModel(request->node_name(), request->model(), absl::Now());
  if (declared.ok() && declared->sets_initial_values()) {
    spdlog::info(
        "{} declared the model ({} tensors, {} embedding tables): its values are the "
        "initial ones",
        request->node_name(), request->model().tensors_size(), request->model().tables_size());
  }
  return Answer(declared, response, context);
}

grpc::Status SchedulerServiceImpl::LeaseData(grpc::ServerContext* context,
                                             const LeaseDataRequest* request,
                                             LeaseDataResponse* response) {
  if (grpc::Status allowed = RequireCaller(context, request->node_name(), "LeaseData");
      !allowed.ok()) {
    return allowed;
  }
  absl::StatusOr<LeaseDataResponse> leased = registry_->LeaseData(*request);
  if (leased.ok() && leased->outcome() != LEASE_WAIT && save_state_) {
    if (const absl::Status saved = save_state_(); !saved.ok()) {
      return Refuse(context, absl::UnavailableError(absl::StrCat("the lease could not be saved (",
                                                                 saved.message(), "): ask again")));
    }
  }
  return Answer(leased, response, context);
}

grpc::Status SchedulerServiceImpl::Leave(grpc::ServerContext* context, const LeaveRequest* request,
                                         LeaveResponse* response) {
  if (grpc::Status allowed = RequireCaller(context, request->node_name(), "Leave"); !allowed.ok())
    return allowed;
  absl::StatusOr<MapChange> change = registry_->Leave(request->node_name());
  if (!change.ok()) return Refuse(context, change.status());
  spdlog::warn("{} leaves the job: {}", request->node_name(), request->reason());
  response->set_epoch(change->map.epoch());
  on_map_change_(*std::move(change));
  return grpc::Status::OK;
}

}  // namespace paramserver
