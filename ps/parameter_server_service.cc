#include "ps/parameter_server_service.h"

#include <algorithm>

#include "absl/base/config.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/rpc/rpc_endpoints.h"
#include "common/rpc/rpc_status.h"
#include "common/wire/shard_call_codec.h"
#include "common/wire/tensor_codec.h"
#include "spdlog/spdlog.h"

namespace paramserver {
namespace {

// How long a worker's call routed with a map this server has yet to install waits for it
// (the scheduler is publishing it; a refusal would be retried after a pause).
constexpr absl::Duration kNewerMapWait = absl::Milliseconds(200);
// How long a Replicate call (all its batches together) waits for room when a backup shard's
// received entries are at ParameterShardOptions::max_received_bytes (its appliers are behind); then
// it takes none of the batch and answers where it is, and the primary sends them again.
constexpr absl::Duration kReceiveRoomWait = absl::Milliseconds(500);

using RawDataService = ParameterServerData::WithRawCallbackMethod_PullShards<
    ParameterServerData::WithRawCallbackMethod_PushShards<ParameterServerData::Service>>;

// ParameterServerData: PullShards and PushShards with gRPC byte buffers for messages
// (the generated service would parse and serialise them with protobuf, copying every
// tensor), registered through the generated raw callback mixins. The handlers of the
// ParameterServerServiceImpl may block (a pull waits for the other workers), so each call
// runs on a thread of `executor`, never on one of gRPC's.
class ShardDataService final : public RawDataService {
 public:
  ShardDataService(ParameterServerServiceImpl* impl, CallExecutor* executor)
      : impl_(impl), executor_(executor) {}

  grpc::ServerUnaryReactor* PullShards(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override {
    return Dispatch(&ParameterServerServiceImpl::PullShards, context, request, response);
  }
  grpc::ServerUnaryReactor* PushShards(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override {
    return Dispatch(&ParameterServerServiceImpl::PushShards, context, request, response);
  }

 private:
  using Handler = grpc::Status (ParameterServerServiceImpl::*)(grpc::ServerContextBase*,
                                                               const grpc::ByteBuffer*,
                                                               grpc::ByteBuffer*);
  grpc::ServerUnaryReactor* Dispatch(Handler handler, grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    // The call (context, request, response) lives until the reactor is finished.
    executor_->Run(
        [=, impl = impl_] { reactor->Finish((impl->*handler)(context, request, response)); });
    return reactor;
  }

  ParameterServerServiceImpl* const impl_;
  CallExecutor* const executor_;
};

}  // namespace

ParameterServerServiceImpl::Metrics::Metrics(MetricsRegistry* registry) {
  const std::string pushes_help =
      "Pushes from workers by outcome (a duplicate is acknowledged, not applied; a late one, "
      "of a sync step completed without it (backup workers), is dropped).";
  pulls = registry->AddCounter(
      "ps_pulls_total", "Shard values served: pulls, and pushes that brought the next step back.");
  pushes_accepted = registry->AddCounter("ps_pushes_total", pushes_help, {{"outcome", "accepted"}});
  pushes_duplicate =
      registry->AddCounter("ps_pushes_total", pushes_help, {{"outcome", "duplicate"}});
  pushes_late = registry->AddCounter("ps_pushes_total", pushes_help, {{"outcome", "late"}});
  pushes_refused = registry->AddCounter("ps_pushes_total", pushes_help, {{"outcome", "refused"}});
  bytes_received = registry->AddCounter("ps_received_bytes_total",
                                        "Tensor bytes received (pushes, replication).");
  bytes_sent = registry->AddCounter("ps_sent_bytes_total", "Tensor bytes sent (pulls).");
  replicated_entries = registry->AddCounter(
      "ps_replicated_entries_total", "Log entries received as a backup (each once, in order).");
  const std::string latency_help = "Time to serve an RPC, waits included.";
  pull_seconds = registry->AddHistogram("ps_rpc_seconds", latency_help, {{"method", "Pull"}},
                                        RpcLatencyBuckets());
  push_seconds = registry->AddHistogram("ps_rpc_seconds", latency_help, {{"method", "Push"}},
                                        RpcLatencyBuckets());
  replicate_seconds = registry->AddHistogram("ps_rpc_seconds", latency_help,
                                             {{"method", "Replicate"}}, RpcLatencyBuckets());
  const std::string rejected_help = "Requests refused, by reason (a status code).";
  for (absl::StatusCode code :
       {absl::StatusCode::kUnauthenticated, absl::StatusCode::kPermissionDenied,
        absl::StatusCode::kInvalidArgument, absl::StatusCode::kFailedPrecondition,
        absl::StatusCode::kResourceExhausted, absl::StatusCode::kUnavailable,
        absl::StatusCode::kDeadlineExceeded}) {
    rejected[code] = registry->AddCounter("ps_rejected_requests_total", rejected_help,
                                          {{"reason", absl::StatusCodeToString(code)}});
  }
}

ParameterServerServiceImpl::ParameterServerServiceImpl(
    const CallerVerifier* callers, absl::Duration max_pull_wait, CheckpointWriter* checkpoints,
    MetricsRegistry* metrics, int max_waiting_pulls, absl::Duration replica_apply_hold)
    : callers_(callers),
      call_executor_(std::make_unique<CallExecutor>(max_waiting_pulls + kExtraCallThreads)),
      data_service_(std::make_unique<ShardDataService>(this, call_executor_.get())),
      max_pull_wait_(max_pull_wait),
      max_waiting_pulls_(max_waiting_pulls),
      metrics_(metrics != nullptr ? std::make_unique<Metrics>(metrics) : nullptr),
      refusals_(metrics, "ps_refused_requests_total"),
      cancellations_(metrics, "ps_cancelled_calls_total", absl::Seconds(10),
                     RefusalLog::Severity::kInfo),
      checkpoints_(checkpoints),
      replica_applier_(ReplicaApplier::DefaultThreads(), replica_apply_hold) {}

void ParameterServerServiceImpl::CountRejection(absl::StatusCode code) {
  if (metrics_ == nullptr) return;
  auto it = metrics_->rejected.find(code);
  if (it != metrics_->rejected.end()) it->second->Increment();
}

void ParameterServerServiceImpl::set_installer(ShardMapInstaller installer) {
  absl::MutexLock lock(&mu_);
  installer_ = std::move(installer);
}

void ParameterServerServiceImpl::InstallShards(const std::string& node_name, int64_t epoch,
                                               std::map<int, ServedShard> shards,
                                               std::set<int> copying) {
  absl::MutexLock lock(&mu_);
  node_name_ = node_name;
  epoch_ = epoch;
  shards_ = std::move(shards);
  for (auto& [id, served] : shards_) {
    if (served.routed_since <= 0 || served.routed_since > epoch) served.routed_since = epoch;
  }
  copying_ = std::move(copying);
}

void ParameterServerServiceImpl::set_initial_values_from(const std::string& node_name) {
  absl::MutexLock lock(&mu_);
  initial_values_from_ = node_name;
}

void ParameterServerServiceImpl::BeginInstall(int64_t epoch) {
  absl::MutexLock lock(&mu_);
  installing_epoch_ = std::max(installing_epoch_, epoch);
}

bool ParameterServerServiceImpl::FinishCopy(int64_t epoch, int shard_id, ServedShard shard) {
  absl::MutexLock lock(&mu_);
  if (epoch != epoch_ || copying_.erase(shard_id) == 0) return false;
  shards_[shard_id] = std::move(shard);
  return true;
}

void ParameterServerServiceImpl::CloseShards() {
  std::vector<std::shared_ptr<ShardReplicator>> replicators;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, served] : shards_) {
      served.shard->Close("the server is shutting down");
      if (served.replicator != nullptr) replicators.push_back(served.replicator);
    }
  }
  for (const auto& replicator : replicators) replicator->Close();
}

int64_t ParameterServerServiceImpl::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

std::map<int, ServedShard> ParameterServerServiceImpl::shards() const {
  absl::MutexLock lock(&mu_);
  return shards_;
}

int64_t ParameterServerServiceImpl::rejected_requests() const {
  absl::MutexLock lock(&mu_);
  return rejected_requests_;
}

absl::Status ParameterServerServiceImpl::EpochRefusalLocked(int shard_id, int64_t epoch) const {
  if (epoch_ == 0) {
    return absl::UnavailableError(absl::StrCat(node_name_, " has not been given its shards yet"));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      epoch < epoch_ ? "stale" : "future", " epoch ", epoch, " for shard ", shard_id, " on ",
      node_name_, ": the current epoch is ", epoch_, "; refresh the shard map"));
}

absl::Status ParameterServerServiceImpl::RefuseRoutedAhead(
    const std::vector<DataPart>& parts) const {
  absl::MutexLock lock(&mu_);
  for (const DataPart& part : parts) {
    if (part.epoch > epoch_) return EpochRefusalLocked(part.shard_id, part.epoch);
  }
  return absl::OkStatus();
}

absl::StatusOr<ServedShard> ParameterServerServiceImpl::FindPrimary(int shard_id, int64_t epoch) {
  absl::MutexLock lock(&mu_);
  if (epoch_ == 0) return EpochRefusalLocked(shard_id, epoch);
  auto it = shards_.find(shard_id);
  // A call routed with an older map reaches the shard if it is served as it was then.
  const bool routed_here =
      epoch == epoch_ || (epoch < epoch_ && it != shards_.end() && it->second.primary &&
                          epoch >= it->second.routed_since);
  if (!routed_here) return EpochRefusalLocked(shard_id, epoch);
  if (it == shards_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat(node_name_, " does not hold shard ", shard_id, " at epoch ", epoch_));
  }
  if (!it->second.primary) {
    return absl::FailedPreconditionError(
        absl::StrCat(node_name_, " is a backup of shard ", shard_id, " at epoch ", epoch_,
                     "; its primary is ", it->second.primary_name));
  }
  return it->second;
}

absl::Status ParameterServerServiceImpl::StaleIfRemapped(absl::Status status, int shard_id,
                                                         int64_t epoch) const {
  if (status.code() != absl::StatusCode::kUnavailable) return status;
  absl::MutexLock lock(&mu_);
  const int64_t newest = std::max(epoch_, installing_epoch_);
  if (epoch >= newest) return status;
  return absl::FailedPreconditionError(absl::StrCat(
      "stale epoch ", epoch, " for shard ", shard_id, " on ", node_name_, ": the current epoch is ",
      newest, " (it came in while the call waited: ", status.message(),
      "); refresh the shard map"));
}

grpc::Status ParameterServerServiceImpl::Reject(const absl::Status& status,
                                                const grpc::ServerContextBase& context) {
  return RejectFrom(status, RefusalCaller(context));
}

grpc::Status ParameterServerServiceImpl::Reject(const absl::Status& status,
                                                const std::string& peer) {
  return RejectFrom(status, RefusalCaller(peer));
}

grpc::Status ParameterServerServiceImpl::RejectFrom(const absl::Status& status,
                                                    const std::string& caller) {
  CountRejection(status.code());
  // Not being ready yet, or a map change, is no fault of the caller's: it retries.
  if (status.code() == absl::StatusCode::kUnavailable) return ToGrpcStatus(status);
  {
    absl::MutexLock lock(&mu_);
    ++rejected_requests_;
  }
  if (status.code() == absl::StatusCode::kFailedPrecondition) {
    spdlog::debug("refused a request from {}: {}", caller, status.ToString());
  } else {
    refusals_.Refused(RefusalKind(status.code()), caller, status);
  }
  return ToGrpcStatus(status);
}

absl::Status ParameterServerServiceImpl::CheckNotCancelled(const grpc::ServerContextBase& context,
                                                           const grpc::ByteBuffer& request,
                                                           const char* method) {
  // gRPC hands a callback method an empty buffer when the call ended before its message
  // arrived: the caller cancelled it or its deadline passed (e.g. while this server was
  // stopped). There is nothing to read, and nothing malformed.
  if (request.Valid() && !context.IsCancelled()) return absl::OkStatus();
  const absl::Status cancelled = absl::CancelledError(absl::StrCat(
      method, request.Valid() ? " cancelled by its caller (deadline or cancellation)"
                              : " ended by its caller before its request arrived (deadline or "
                                "cancellation); not a refusal"));
  cancellations_.Refused(method, RefusalCaller(context), cancelled);
  return cancelled;
}

absl::Status ParameterServerServiceImpl::CheckDataCall(const grpc::ServerContextBase& context,
                                                       const std::vector<DataPart>& parts,
                                                       const char* what) {
  absl::StatusOr<VerifiedCaller> caller = callers_->Identify(context);
  // Only for the cluster's members (a caller with the cluster token): a part routed with
  // a map this server has yet to install (its worker learned it first) waits for it a
  // little, rather than being refused and retried after a pause. The map may name the
  // caller's credential.
  if ((caller.ok() || caller.status().code() == absl::StatusCode::kPermissionDenied) &&
      AwaitMapOf(parts, absl::FromChrono(context.deadline()))) {
    caller = callers_->Identify(context);
  }
  if (caller.ok() || caller.status().code() == absl::StatusCode::kPermissionDenied) {
    // The wait ran out: a part routed with a map still not installed is answered as any
    // part of a future map is (refresh the map and retry), whoever the caller. Who may
    // make the call (a worker registered since, the one that sets initial values) and
    // which shards are primaries here is in that map, not in the one served: judged by
    // the served one, a legitimate call would be refused for good.
    if (absl::Status ahead = RefuseRoutedAhead(parts); !ahead.ok()) {
      Reject(ahead, context);
      return ahead;
    }
    // A credential named only by a map installed since the caller was identified.
    if (!caller.ok()) caller = callers_->Identify(context);
  }
  absl::Status refusal = caller.status();
  if (caller.ok()) refusal = RequireRole(*caller, NODE_ROLE_WORKER, what);
  for (size_t i = 0; refusal.ok() && i < parts.size(); ++i) {
    if (parts[i].worker_rank != caller->rank) {
      refusal = absl::PermissionDeniedError(
          absl::StrCat(caller->name, " may not ", what, " as worker ", parts[i].worker_rank));
    }
  }
  if (refusal.ok()) {
    absl::MutexLock lock(&mu_);
    std::set<int> shard_ids;
    // Only against the map the parts were routed with: a part of another epoch is
    // refused as such (stale or future map, retried), before anything is served.
    const bool at_served_epoch =
        epoch_ > 0 && std::all_of(parts.begin(), parts.end(),
                                  [this](const DataPart& part) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                                    return part.epoch == epoch_;
                                  });
    if (at_served_epoch && parts.size() > std::max<size_t>(1, shards_.size())) {
      refusal = absl::InvalidArgumentError(absl::StrCat("a ", what, " of ", parts.size(),
                                                        " parts: ", node_name_, " holds ",
                                                        shards_.size(), " shards"));
    }
    for (size_t i = 0; refusal.ok() && i < parts.size(); ++i) {
      if (!shard_ids.insert(parts[i].shard_id).second) {
        refusal = absl::InvalidArgumentError(absl::StrCat(
            "a ", what, " names shard ", parts[i].shard_id, " twice (parts carry one shard each)"));
      }
    }
  }
  if (!refusal.ok()) Reject(refusal, context);
  return refusal;
}

bool ParameterServerServiceImpl::AwaitMapOf(const std::vector<DataPart>& parts,
                                            absl::Time deadline) {
  int64_t newest = 0;
  for (const DataPart& part : parts) newest = std::max(newest, part.epoch);
  absl::MutexLock lock(&mu_);
  if (newest <= epoch_ || epoch_ == 0) return false;
  auto installed = [this, newest]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return epoch_ >= newest; };
  mu_.AwaitWithDeadline(absl::Condition(&installed),
                        std::min(deadline, absl::Now() + kNewerMapWait));
  return true;
}

absl::StatusOr<VerifiedCaller> ParameterServerServiceImpl::CheckPeerCall(
    const grpc::ServerContext& context, NodeRole role, int64_t epoch, const char* what) {
  absl::StatusOr<VerifiedCaller> caller = callers_->Identify(context);
  if (!caller.ok() && caller.status().code() == absl::StatusCode::kPermissionDenied) {
    absl::MutexLock lock(&mu_);
    if (epoch > epoch_) {
      return absl::UnavailableError(absl::StrCat(node_name_, " does not serve epoch ", epoch,
                                                 " yet (it serves ", epoch_, ")"));
    }
  }
  absl::Status refusal = caller.ok() ? RequireRole(*caller, role, what) : caller.status();
  if (!refusal.ok()) {
    Reject(refusal, context);
    return refusal;
  }
  return caller;
}

grpc::Status ParameterServerServiceImpl::InstallShardMap(grpc::ServerContext* context,
                                                         const InstallShardMapRequest* request,
                                                         InstallShardMapResponse* response) {
  absl::StatusOr<VerifiedCaller> caller =
      CheckPeerCall(*context, NODE_ROLE_UNSPECIFIED, 0, "InstallShardMap");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  ShardMapInstaller installer;
  {
    absl::MutexLock lock(&mu_);
    installer = installer_;
  }
  if (!installer)
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "this server is still starting");
  absl::StatusOr<int64_t> serving = installer(request->shard_map());
  if (!serving.ok()) return ToGrpcStatus(serving.status());
  response->set_serving_epoch(*serving);
  return grpc::Status::OK;
}

grpc::Status ParameterServerServiceImpl::CheckpointAt(grpc::ServerContext* context,
                                                      const CheckpointAtRequest* request,
                                                      CheckpointAtResponse* response) {
  absl::StatusOr<VerifiedCaller> caller =
      CheckPeerCall(*context, NODE_ROLE_UNSPECIFIED, 0, "CheckpointAt");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (checkpoints_ == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "checkpoint.dir is not set");
  }
  for (const auto& [id, served] : shards()) {
    if (!served.primary) continue;
    if (!served.shard->ScheduleCheckpointAt(request->step())) response->add_passed_shards(id);
    // A hybrid job's table counts pushes, not the steps a checkpoint is scheduled at.
    if (served.shard->options().checkpoint_at_next_update) continue;
    response->set_newest_applied_updates(
        std::max(response->newest_applied_updates(), served.shard->counters().applied_updates));
  }
  return grpc::Status::OK;
}

grpc::Status ParameterServerServiceImpl::Replicate(grpc::ServerContext* context,
                                                   const ReplicateRequest* request,
                                                   ReplicateResponse* response) {
  const absl::Time start = absl::Now();
  int64_t newest_epoch = 0;
  for (const ShardLogBatch& batch : request->shards())
    newest_epoch = std::max(newest_epoch, batch.epoch());
  absl::StatusOr<VerifiedCaller> caller =
      CheckPeerCall(*context, NODE_ROLE_SERVER, newest_epoch, "Replicate");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (metrics_ != nullptr) metrics_->bytes_received->Increment(request->ByteSizeLong());
  // One wait for room for the whole call, well inside the caller's deadline: its
  // answer (every batch's receipt) must reach the primary.
  const absl::Time call_deadline = absl::FromChrono(context->deadline());
  const absl::Time room_by =
      std::min(start + kReceiveRoomWait, start + (call_deadline - start) / 2);
  for (const ShardLogBatch& batch : request->shards()) {
    ShardReplicationResult* result = response->add_results();
    result->set_shard_id(batch.shard_id());
    absl::Status received =
        batch.primary_name() == caller->name
            ? ReceiveReplicatedBatch(batch, context->peer(), room_by, result)
            : absl::PermissionDeniedError(absl::StrCat(
                  caller->name, " may not replicate as ",
                  batch.primary_name().size() <= 64 ? batch.primary_name() : "another server"));
    result->set_code(static_cast<int>(received.code()));
    result->set_message(std::string(received.message()));
    if (received.code() == absl::StatusCode::kPermissionDenied) {
      Reject(received, context->peer());  // counts it
    } else if (!received.ok()) {
      CountRejection(received.code());
    }
  }
  if (metrics_ != nullptr) metrics_->replicate_seconds->ObserveSince(start);
  return grpc::Status::OK;
}

absl::Status ParameterServerServiceImpl::ReceiveReplicatedBatch(const ShardLogBatch& batch,
                                                                const std::string& peer,
                                                                absl::Time room_by,
                                                                ShardReplicationResult* result) {
  std::shared_ptr<ParameterShard> shard;
  {
    absl::MutexLock lock(&mu_);
    if (epoch_ == 0 || batch.epoch() > epoch_ || copying_.count(batch.shard_id()) > 0) {
      return absl::UnavailableError(absl::StrCat(node_name_, " is not ready to back up shard ",
                                                 batch.shard_id(), " at epoch ", batch.epoch(),
                                                 " (it serves epoch ", epoch_, ")"));
    }
    auto it = shards_.find(batch.shard_id());
    if (it == shards_.end() && batch.epoch() < epoch_) {
      // Dropped as its backup by a newer map than the primary's: the primary installs
      // it soon and stops sending. Not a fence: nobody else took the shard over here.
      return absl::UnavailableError(absl::StrCat(node_name_, " no longer backs up shard ",
                                                 batch.shard_id(), " (it serves epoch ", epoch_,
                                                 "; the batch is of epoch ", batch.epoch(), ")"));
    }
    if (it == shards_.end() || it->second.primary ||
        it->second.primary_name != batch.primary_name()) {
      // A fenced primary: it was replaced, or this server no longer backs it up.
      ++rejected_requests_;
      const std::string refusal = absl::StrCat(
          node_name_, " does not back up shard ", batch.shard_id(), " for ", batch.primary_name(),
          " at epoch ", epoch_,
          it == shards_.end()  ? std::string()
          : it->second.primary ? std::string(" (it is the primary now)")
                               : absl::StrCat(" (its primary is ", it->second.primary_name, ")"));
      refusals_.Refused("replication_fenced", RefusalCaller(peer),
                        absl::FailedPreconditionError(refusal));
      return absl::FailedPreconditionError(refusal);
    }
    shard = it->second.shard;
  }
  std::vector<ShardMutation> mutations;
  mutations.reserve(batch.entries_size());
  for (const ShardLogEntry& entry : batch.entries()) {
    absl::StatusOr<ShardMutation> mutation = MutationFromEntry(entry, shard->options());
    if (!mutation.ok()) {
      refusals_.Refused(RefusalKind(mutation.status().code()), RefusalCaller(peer),
                        mutation.status());
      return mutation.status();
    }
    mutations.push_back(*std::move(mutation));
  }
  // In memory, in order: acknowledged so. They apply on the appliers' threads, and
  // before this shard serves as a primary.
  const int64_t received_before = shard->received_index();
  absl::StatusOr<int64_t> received = shard->ReceiveLogEntries(std::move(mutations), room_by);
  if (received.ok() && metrics_ != nullptr && *received > received_before) {
    metrics_->replicated_entries->Increment(*received - received_before);
  }
  if (!received.ok()) {
    switch (received.status().code()) {
      case absl::StatusCode::kFailedPrecondition:  // a gap: the primary resends from here
        break;
      case absl::StatusCode::kAborted:  // promoted here: the sender is a replaced primary
        return absl::FailedPreconditionError(received.status().message());
      default:
        spdlog::error("shard {}: {}", batch.shard_id(), received.status().ToString());
        return received.status();
    }
  }
  if (shard->has_unapplied()) replica_applier_.Schedule(shard);
  result->set_received_index(shard->received_index());
  return absl::OkStatus();
}

int64_t ServingEpochNamed(const grpc::ClientContext& finished) {
  const auto& trailers = finished.GetServerTrailingMetadata();
  const auto named = trailers.find(kServingEpochMetadata);
  int64_t epoch = 0;
  if (named == trailers.end() ||
      !absl::SimpleAtoi(absl::string_view(named->second.data(), named->second.size()), &epoch)) {
    return 0;
  }
  return epoch;
}

grpc::Status ParameterServerServiceImpl::FetchShardState(
    grpc::ServerContext* context, const FetchShardStateRequest* request,
    grpc::ServerWriter<ShardStatePiece>* writer) {
  absl::StatusOr<VerifiedCaller> caller =
      CheckPeerCall(*context, NODE_ROLE_SERVER, request->epoch(), "FetchShardState");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  absl::Status stale;
  int64_t serving = 0;  // the epoch that decided
  {
    absl::MutexLock lock(&mu_);
    serving = epoch_;
    if (request->epoch() > epoch_) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          absl::StrCat(node_name_, " does not serve epoch ", request->epoch(),
                                       " yet (it serves ", epoch_, ")"));
    }
    if (request->epoch() < epoch_) {
      // A copy is for the map it is asked under, whose backups the replicator has.
      stale = absl::FailedPreconditionError(absl::StrCat(
          "stale epoch ", request->epoch(), " for a copy of shard ", request->shard_id(), " on ",
          node_name_, ": the current epoch is ", epoch_, "; refresh the shard map"));
    }
  }
  // A refusal says which epoch this server serves, the one its message names: a backup
  // asking under an older map leaves the copy to the newer map's install
  // (ShardHost::CopyFromPrimary).
  const auto refuse = [&](const absl::Status& why, int64_t epoch_served) {
    context->AddTrailingMetadata(kServingEpochMetadata, absl::StrCat(epoch_served));
    return Reject(why, context->peer());
  };
  if (!stale.ok()) return refuse(stale, serving);
  absl::StatusOr<ServedShard> served = FindPrimary(request->shard_id(), request->epoch());
  // FindPrimary reads the epoch anew (a map may have come in since).
  if (!served.ok()) return refuse(served.status(), epoch());
  // Acknowledgements wait for the copy's holder from before it is taken: an entry
  // applied after the copy is acknowledged only once the backup has it too.
  if (served->replicator != nullptr) served->replicator->CopyStarting(caller->name);
  ReplicaState replica = served->shard->ExportReplicaAsStored();
  if (served->replicator != nullptr)
    served->replicator->BackupHolds(caller->name, replica.log_index);
  const absl::Status sent = WriteReplicaStatePieces(
      replica, kShardStatePieceBytes, kMaxMessageBytes,
      [writer](const ShardStatePiece& piece) { return writer->Write(piece); });
  if (!sent.ok()) {
    spdlog::error("shard {}: copy for {}: {}", request->shard_id(), caller->name,
                  std::string(sent.message()));
    // A state too large to send is a refusal; a backup gone away is not.
    return absl::IsResourceExhausted(sent) ? Reject(sent, context->peer()) : ToGrpcStatus(sent);
  }
  return grpc::Status::OK;
}

}  // namespace paramserver
