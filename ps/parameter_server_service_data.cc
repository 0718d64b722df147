// ParameterServerServiceImpl's data path: pulls and pushes (every shard a worker has on
// this server in one call), a torch model's first values and an embedding table's
// export.
#include <algorithm>

#include "absl/base/config.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/step_optimizer.h"
#include "common/rpc/progress_watchdog.h"
#include "common/rpc/rpc_status.h"
#include "common/wire/shard_call_codec.h"
#include "common/wire/sparse_rows.h"
#include "common/wire/tensor_codec.h"
#include "ps/parameter_server_service.h"
#include "spdlog/spdlog.h"

namespace paramserver {

namespace {

absl::StatusOr<WireDtype> EncodingOf(WireEncoding encoding) {
  switch (encoding) {
    case WIRE_FLOAT32:
      return WireDtype::kFloat32;
    case WIRE_BFLOAT16:
      return WireDtype::kBfloat16;
    case WIRE_FLOAT16:
      return WireDtype::kFloat16;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown tensor encoding ",
                                                     static_cast<int>(encoding),
                                                     " (float32, bfloat16, float16 known)"));
  }
}

}  // namespace

grpc::Status ParameterServerServiceImpl::ExportRows(
    grpc::ServerContext* context, const ExportRowsRequest* request,
    grpc::ServerWriter<ExportRowsResponse>* writer) {
  if (absl::Status allowed = CheckDataCall(
          *context, {{request->shard_id(), request->worker_rank(), request->epoch()}}, "export");
      !allowed.ok()) {
    return ToGrpcStatus(allowed);
  }
  absl::StatusOr<ServedShard> served = FindPrimary(request->shard_id(), request->epoch());
  if (!served.ok()) return Reject(served.status(), context->peer());
  // Each export holds its table's sorted ids (8 bytes a row) and a thread while it
  // streams: a few at once (the job's finisher reads one at a time).
  if (exports_in_flight_.fetch_add(1) >= kMaxExportsAtOnce) {
    exports_in_flight_.fetch_sub(1);
    return Reject(absl::ResourceExhaustedError(absl::StrCat(
                      "this server already streams ", kMaxExportsAtOnce, " exports; retry later")),
                  context->peer());
  }
  absl::Cleanup end_export = [this] { exports_in_flight_.fetch_sub(1); };
  const int table = request->table();
  absl::StatusOr<std::vector<int64_t>> ids;
  {
    // The wait is a pull's, and counts as one.
    if (absl::Status slot = TakePullSlot(); !slot.ok()) return Reject(slot, context->peer());
    absl::Cleanup give_back_slot = [this] { ReturnPullSlot(); };
    ids =
        served->shard->ExportRowIds(request->worker_rank(), request->step(), PullDeadline(*context),
                                    table, request->from_start(), request->after_id());
  }
  if (!ids.ok()) {
    if (ids.status().code() == absl::StatusCode::kInvalidArgument)
      return Reject(ids.status(), context->peer());
    return ToGrpcStatus(ids.status());
  }
  // ExportRowIds accepted the table: the shard holds rows of this dim.
  const int64_t dim = served->shard->options().embedding->tables[table].dim;
  const int64_t asked = request->max_rows() > 0 ? request->max_rows() : kMaxExportRows;
  const int64_t page_rows =
      std::max<int64_t>(1, std::min({asked, kMaxExportRows, kExportPageBytes / (8 + 4 * dim)}));
  // A worker that stops taking pages (its flow control full) is let go.
  ProgressWatchdog writes(kExportWriteStall, [context] { context->TryCancel(); });
  std::vector<int64_t> held_ids;
  std::vector<float> rows;
  size_t begin = 0;
  do {
    const size_t end = std::min(ids->size(), begin + static_cast<size_t>(page_rows));
    if (context->IsCancelled()) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "the export's caller went away");
    }
    // Each page from the primary of the request's epoch, as a call of its own would be.
    served = FindPrimary(request->shard_id(), request->epoch());
    if (!served.ok()) return Reject(served.status(), context->peer());
    held_ids.clear();
    rows.clear();
    if (absl::Status read = served->shard->ExportRowsOf(
            table, absl::MakeConstSpan(*ids).subspan(begin, end - begin), &held_ids, &rows);
        !read.ok()) {
      return ToGrpcStatus(read);
    }
    ExportRowsResponse page;
    AppendIds(held_ids, page.mutable_ids());
    AppendFloatsLittleEndian(rows, page.mutable_rows());
    page.set_done(end == ids->size());
    if (!writer->Write(page)) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "the export's caller stopped reading");
    }
    writes.Progress();
    begin = end;
  } while (begin < ids->size());
  return grpc::Status::OK;
}

grpc::Status ParameterServerServiceImpl::SetInitialValues(grpc::ServerContext* context,
                                                          const SetInitialValuesRequest* request,
                                                          SetInitialValuesResponse* response) {
  if (absl::Status allowed =
          CheckDataCall(*context, {{request->shard_id(), request->worker_rank(), request->epoch()}},
                        "set initial values");
      !allowed.ok()) {
    return ToGrpcStatus(allowed);
  }
  absl::Status refusal;
  {
    absl::StatusOr<VerifiedCaller> caller = callers_->Identify(*context);
    absl::MutexLock lock(&mu_);
    if (!caller.ok() || caller->name != initial_values_from_) {
      refusal = absl::PermissionDeniedError(absl::StrCat(
          caller.ok() ? caller->name : "an unknown caller", " may not set initial values: ",
          initial_values_from_.empty()
              ? std::string("this job's are model.init_from's")
              : absl::StrCat("they are ", initial_values_from_, "'s (it declared the model)")));
    }
  }
  if (!refusal.ok()) return Reject(refusal, context->peer());
  absl::StatusOr<ServedShard> served = FindPrimary(request->shard_id(), request->epoch());
  if (!served.ok()) return Reject(served.status(), context->peer());
  ParameterShard& shard = *served->shard;
  // Sized by the shard, not by the peer: the bytes must be exactly its range.
  const int64_t size = shard.options().range.size();
  if (shard.is_embedding() ||
      static_cast<int64_t>(request->values().size()) != size * int64_t{sizeof(float)}) {
    return Reject(
        absl::InvalidArgumentError(absl::StrCat(
            "initial values for shard ", request->shard_id(), ": ", request->values().size(),
            " bytes; it holds ",
            shard.is_embedding() ? std::string("embedding rows, which start from the seed")
                                 : absl::StrCat(size, " float32 parameters"))),
        context->peer());
  }
  std::vector<float> values(size);
  DecodeFloatsLittleEndian(request->values(), values.data());
  absl::StatusOr<PushOutcome> outcome = shard.SetInitialValues(values);
  if (!outcome.ok()) return Reject(outcome.status(), context->peer());
  if (served->replicator != nullptr) {
    const absl::Time deadline =
        std::min(PullDeadline(*context) - absl::Milliseconds(100), absl::Now() + absl::Seconds(10));
    if (absl::Status replicated = served->replicator->WaitReplicated(outcome->log_index, deadline);
        !replicated.ok()) {
      return ToGrpcStatus(replicated);
    }
  }
  if (outcome->checkpoint.has_value() && checkpoints_ != nullptr) {
    // The step-0 checkpoint: a rollback before the first periodic one comes back here.
    outcome->checkpoint->epoch = request->epoch();
    checkpoints_->Enqueue(*std::move(outcome->checkpoint));
  }
  if (!outcome->duplicate) {
    spdlog::info("shard {}: initial values set by worker {}", request->shard_id(),
                 request->worker_rank());
  }
  response->set_already_set(outcome->duplicate);
  return grpc::Status::OK;
}

grpc::Status ParameterServerServiceImpl::PullShards(grpc::ServerContextBase* context,
                                                    const grpc::ByteBuffer* request,
                                                    grpc::ByteBuffer* response) {
  const absl::Time start = absl::Now();
  const absl::Time deadline = PullDeadline(*context);
  // Membership first: an outsider's cancelled call is an outsider's, not a cancellation.
  if (absl::Status member = callers_->CheckMembership(*context); !member.ok())
    return Reject(member, *context);
  if (absl::Status cancelled = CheckNotCancelled(*context, *request, "PullShards");
      !cancelled.ok()) {
    return ToGrpcStatus(cancelled);
  }
  absl::StatusOr<PullShardsRequest> parsed = DecodePullShards(*request);
  grpc::Status status = parsed.ok() ? grpc::Status::OK : Reject(parsed.status(), context->peer());
  if (status.ok()) {
    std::vector<DataPart> data_parts;
    for (const PullRequest& part : parsed->shards()) {
      data_parts.push_back({part.shard_id(), part.worker_rank(), part.epoch()});
    }
    status = ToGrpcStatus(CheckDataCall(*context, data_parts, "pull"));
  }
  ShardsReplyWriter reply(ReplyKind::kPull);
  for (int i = 0; status.ok() && i < parsed->shards_size(); ++i) {
    PullResponse header;
    std::string bytes = reply_buffers_->Take();
    std::shared_ptr<const std::vector<float>> shared;
    status = ServePull(parsed->shards(i), deadline, context->peer(), &header,
                       OutgoingValues{&bytes, &shared});
    if (!status.ok()) {
      status = ToGrpcStatus(StaleIfRemapped(ToAbslStatus(status), parsed->shards(i).shard_id(),
                                            parsed->shards(i).epoch()));
    }
    if (status.ok()) reply.AddPart(header, ValuesSlice(std::move(bytes), std::move(shared)));
  }
  if (status.ok()) *response = reply.Finish();
  if (metrics_ != nullptr) metrics_->pull_seconds->ObserveSince(start);
  return status;
}

absl::Status ParameterServerServiceImpl::TakePullSlot() {
  if (waiting_pulls_.fetch_add(1, std::memory_order_relaxed) < max_waiting_pulls_)
    return absl::OkStatus();
  ReturnPullSlot();
  return absl::ResourceExhaustedError(
      absl::StrCat("this server already serves ", max_waiting_pulls_, " pulls; retry later"));
}

absl::Time ParameterServerServiceImpl::PullDeadline(const grpc::ServerContextBase& context) const {
  return std::min(absl::FromChrono(context.deadline()), absl::Now() + max_pull_wait_);
}

absl::StatusOr<CheckedRowIds> ParameterServerServiceImpl::RequestedRows(
    const ParameterShard& shard, const std::string& ids,
    const google::protobuf::RepeatedField<int32_t>& counts, absl::string_view what) {
  if (!shard.is_embedding()) {
    if (ids.empty() && counts.empty()) return CheckedRowIds();
    return absl::InvalidArgumentError(absl::StrCat(
        "shard ", shard.options().shard_id, " holds dense parameters; ids name embedding rows"));
  }
  absl::StatusOr<std::vector<int64_t>> decoded = DecodeIds(ids);
  absl::Status refused = decoded.status();
  if (decoded.ok()) {
    absl::StatusOr<CheckedRowIds> rows =
        CheckedRowIds::Check(RowIds{{counts.begin(), counts.end()}, *std::move(decoded)},
                             shard.options().embedding->shape);
    if (rows.ok()) return rows;
    refused = rows.status();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("embedding shard ", shard.options().shard_id, ": ", what, refused.message()));
}

absl::Status ParameterServerServiceImpl::PullValues(ParameterShard& shard, int worker_rank,
                                                    int64_t step, absl::Time deadline,
                                                    WireDtype encoding, OutgoingValues values,
                                                    PulledValues* info, const CheckedRowIds& rows) {
  if (shard.is_embedding()) {
    return shard.PullRowsInto(worker_rank, step, deadline, rows, encoding, values.bytes, info);
  }
#ifdef ABSL_IS_LITTLE_ENDIAN
  if (values.shared != nullptr && encoding == WireDtype::kFloat32) {
    return shard.PullShared(worker_rank, step, deadline, values.shared, info);
  }
#endif
  return shard.PullInto(worker_rank, step, deadline, encoding, values.bytes, info);
}

grpc::Slice ParameterServerServiceImpl::ValuesSlice(
    std::string bytes, std::shared_ptr<const std::vector<float>> shared) {
  if (shared == nullptr) return SliceGivingBack(reply_buffers_, std::move(bytes));
  reply_buffers_->GiveBack(std::move(bytes));  // unused
  const size_t size = shared->size() * sizeof(float);
  const float* data = shared->data();
  return SliceKeepingAlive(std::move(shared), data, size);
}

absl::Status ParameterServerServiceImpl::ApplyClippedStep(const ServedShard& served,
                                                          const PullRequest& request,
                                                          absl::Time deadline) {
  if (served.shard->is_embedding() || served.shard->options().mode != TrainingMode::kSync) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", request.shard_id(),
                     ": a clip coefficient for a shard that holds "
                     "no clipped steps (only a sync job's dense shards do)"));
  }
  PS_ASSIGN_OR_RETURN(PushOutcome outcome, served.shard->ApplyClippedStep(
                                               request.step() - 1, request.clip_coefficient()));
  if (outcome.checkpoint.has_value() && checkpoints_ != nullptr) {
    outcome.checkpoint->epoch = request.epoch();
    checkpoints_->Enqueue(*std::move(outcome.checkpoint));
  }
  // No value of the step leaves before every backup holds it (as a push's acknowledgement
  // waits for that).
  if (served.replicator == nullptr) return absl::OkStatus();
  return served.replicator->WaitReplicated(outcome.log_index,
                                           std::min(deadline, absl::Now() + absl::Seconds(10)));
}

grpc::Status ParameterServerServiceImpl::ServePull(const PullRequest& request, absl::Time deadline,
                                                   const std::string& peer, PullResponse* response,
                                                   OutgoingValues values) {
  absl::StatusOr<WireDtype> encoding = EncodingOf(request.encoding());
  if (!encoding.ok()) return Reject(encoding.status(), peer);
  absl::StatusOr<ServedShard> served = FindPrimary(request.shard_id(), request.epoch());
  if (!served.ok()) return Reject(served.status(), peer);
  absl::StatusOr<CheckedRowIds> rows =
      RequestedRows(*served->shard, request.ids(), request.id_counts());
  if (!rows.ok()) return Reject(rows.status(), peer);
  if (request.clip_coefficient() != 0) {
    if (absl::Status applied = ApplyClippedStep(*served, request, deadline); !applied.ok()) {
      if (applied.code() == absl::StatusCode::kInvalidArgument) return Reject(applied, peer);
      return ToGrpcStatus(applied);
    }
  }
  if (absl::Status slot = TakePullSlot(); !slot.ok()) return Reject(slot, peer);
  absl::Cleanup give_back_slot = [this] { ReturnPullSlot(); };
  PulledValues pulled;
  absl::Status status = PullValues(*served->shard, request.worker_rank(), request.step(), deadline,
                                   *encoding, values, &pulled, *rows);
  if (!status.ok()) {
    if (status.code() == absl::StatusCode::kInvalidArgument) return Reject(status, peer);
    return ToGrpcStatus(status);
  }
  response->set_shard_id(request.shard_id());
  response->set_applied_updates(pulled.applied_updates);
  response->set_start_step(pulled.start_step);
  if (metrics_ != nullptr) {
    metrics_->pulls->Increment();
    metrics_->bytes_sent->Increment(values.size());
  }
  return grpc::Status::OK;
}

grpc::Status ParameterServerServiceImpl::PushShards(grpc::ServerContextBase* context,
                                                    const grpc::ByteBuffer* request,
                                                    grpc::ByteBuffer* response) {
  const absl::Time start = absl::Now();
  // Membership first: an outsider's cancelled call is an outsider's, not a cancellation.
  if (absl::Status member = callers_->CheckMembership(*context); !member.ok())
    return Reject(member, *context);
  if (absl::Status cancelled = CheckNotCancelled(*context, *request, "PushShards");
      !cancelled.ok()) {
    return ToGrpcStatus(cancelled);
  }
  absl::StatusOr<std::vector<PushPartView>> parts = DecodePushShards(*request);
  absl::Status status = parts.status();
  if (!parts.ok()) {
    if (metrics_ != nullptr) metrics_->pushes_refused->Increment();
    Reject(status, context->peer());
  } else {
    std::vector<DataPart> data_parts;
    for (const PushPartView& part : *parts) {
      data_parts.push_back(
          {part.header.shard_id(), part.header.worker_rank(), part.header.epoch()});
    }
    status = CheckDataCall(*context, data_parts, "push");
  }
  // Every shard takes its gradient first, then each is acknowledged in turn: in sync
  // mode the shards' steps complete together instead of one after another.
  std::vector<AcceptedPush> accepted;
  for (size_t i = 0; status.ok() && i < parts->size(); ++i) {
    const PushPartView& part = (*parts)[i];
    absl::StatusOr<AcceptedPush> one = AcceptPush(
        part.header, part.gradient_bytes,
        [&](WireDtype encoding, absl::Span<float> out) {
          return ReadGradient(*request, part, encoding, out,
                              absl::StrCat("gradient for shard ", part.header.shard_id()));
        },
        context->peer());
    status = one.status();
    if (status.ok()) accepted.push_back(*std::move(one));
  }
  ShardsReplyWriter reply(ReplyKind::kPush);
  for (size_t i = 0; status.ok() && i < accepted.size(); ++i) {
    PushResponse header;
    std::string bytes = reply_buffers_->Take();
    std::shared_ptr<const std::vector<float>> shared;
    status = FinishPush((*parts)[i].header, accepted[i], absl::FromChrono(context->deadline()),
                        &header, OutgoingValues{&bytes, &shared});
    status = StaleIfRemapped(status, (*parts)[i].header.shard_id(), (*parts)[i].header.epoch());
    if (status.ok()) reply.AddPart(header, ValuesSlice(std::move(bytes), std::move(shared)));
  }
  if (status.ok()) *response = reply.Finish();
  if (metrics_ != nullptr) metrics_->push_seconds->ObserveSince(start);
  return ToGrpcStatus(status);
}

absl::StatusOr<ParameterServerServiceImpl::AcceptedPush> ParameterServerServiceImpl::AcceptPush(
    const PushRequest& request, size_t gradient_bytes, const GradientReader& read_gradient,
    const std::string& peer) {
  if (metrics_ != nullptr) metrics_->bytes_received->Increment(gradient_bytes);
  auto refuse = [&](const absl::Status& status) {
    if (metrics_ != nullptr) metrics_->pushes_refused->Increment();
    Reject(status, peer);
    return status;
  };
  absl::StatusOr<WireDtype> encoding = EncodingOf(request.encoding());
  if (!encoding.ok()) return refuse(encoding.status());
  absl::StatusOr<ServedShard> served = FindPrimary(request.shard_id(), request.epoch());
  if (!served.ok()) return refuse(served.status());
  ParameterShard& shard = *served->shard;
  const bool skip = request.skip_step();
  if (skip && (gradient_bytes != 0 || !request.ids().empty() || request.id_counts_size() != 0)) {
    return refuse(absl::InvalidArgumentError(absl::StrCat(
        "shard ", request.shard_id(), ": worker ", request.worker_rank(), "'s push for step ",
        request.step(), " skips the step but carries a gradient: a skipped step sends none")));
  }
  // A skipped step's push to an embedding shard names no row of any table.
  absl::StatusOr<CheckedRowIds> rows =
      skip && shard.is_embedding()
          ? CheckedRowIds::Check(
                RowIds{std::vector<int32_t>(shard.options().embedding->shape.dims.size(), 0), {}},
                shard.options().embedding->shape)
          : RequestedRows(shard, request.ids(), request.id_counts());
  if (!rows.ok()) return refuse(rows.status());
  // What a pull_next sends back: the next batch's rows when given (checked now, before
  // the push is taken, against the shard as a pull's are), else the pushed ones.
  CheckedRowIds next_rows;
  if (shard.is_embedding() && request.pull_next()) {
    if (!request.next_ids().empty() || !request.next_id_counts().empty()) {
      absl::StatusOr<CheckedRowIds> next =
          RequestedRows(shard, request.next_ids(), request.next_id_counts(), "next rows: ");
      if (!next.ok()) return refuse(next.status());
      next_rows = *std::move(next);
    } else {
      next_rows = *rows;
    }
  }
  // The ids decide the gradient's size: checked (above) before anything is sized by them.
  const int64_t size = skip ? 0
                       : shard.is_embedding()
                           ? RowFloats(rows->view(), shard.options().embedding->shape.dims)
                           : shard.options().range.size();
  // Uninitialised: decoding writes every element. The shard may keep the buffer (a sync
  // push waits in it for its step) and hand back a spare one, which goes to the pool.
  ShardPush push{request.worker_rank(), request.step(), gradient_buffers_->TakeFitting(size),
                 *std::move(rows)};
  push.gradient.resize(size);
  absl::Cleanup give_back = [&] { gradient_buffers_->GiveBack(std::move(push.gradient)); };
  absl::Status decoded =
      read_gradient(*encoding, absl::Span<float>(push.gradient.data(), push.gradient.size()));
  if (!decoded.ok()) return refuse(decoded);
  push.skip = skip;
  push.clip_grad_norm = request.clip_grad_norm();
  if (push.clip_grad_norm != 0 &&
      (skip || shard.is_embedding() || shard.options().mode != TrainingMode::kSync)) {
    return refuse(absl::InvalidArgumentError(absl::StrCat(
        "shard ", request.shard_id(), ": worker ", request.worker_rank(), "'s push for step ",
        request.step(),
        " asks for clipping: only a sync job's dense shards clip a step, and not a skipped one")));
  }
  if (push.clip_grad_norm != 0 && request.pull_next()) {
    return refuse(absl::InvalidArgumentError(
        absl::StrCat("shard ", request.shard_id(), ": worker ", request.worker_rank(),
                     "'s push for step ", request.step(),
                     " asks for clipping and pull_next: a clipped step applies only once its "
                     "coefficient comes with a pull")));
  }
  if (request.has_optimizer() && !skip) {  // a skipped step updates nothing
    absl::StatusOr<StepHyperparameters> settings =
        shard.is_embedding()
            ? absl::InvalidArgumentError(
                  "an embedding shard trains with "
                  "training.embedding_optimizer, not a step's settings")
            : StepHyperparametersFromProto(request.optimizer(), shard.options().optimizer, size);
    if (!settings.ok()) {
      return refuse(absl::InvalidArgumentError(
          absl::StrCat("shard ", request.shard_id(), ": worker ", request.worker_rank(),
                       "'s push for step ", request.step(), ": ", settings.status().message())));
    }
    push.settings = *std::move(settings);
  }
  absl::StatusOr<PushOutcome> outcome = shard.Push(&push);
  if (!outcome.ok()) return refuse(outcome.status());
  if (metrics_ != nullptr) {
    (outcome->duplicate ? metrics_->pushes_duplicate
     : outcome->late    ? metrics_->pushes_late
                        : metrics_->pushes_accepted)
        ->Increment();
  }
  return AcceptedPush{*std::move(served), *std::move(outcome), *encoding, std::move(next_rows)};
}

absl::Status ParameterServerServiceImpl::FinishPush(const PushRequest& request,
                                                    AcceptedPush& accepted,
                                                    absl::Time call_deadline,
                                                    PushResponse* response, OutgoingValues values) {
  ParameterShard& shard = *accepted.served.shard;
  PushOutcome& outcome = accepted.outcome;
  if (accepted.served.replicator != nullptr) {
    // Acknowledge only what every backup holds: in sync mode, the step this push is
    // part of (so the ack waits for the other workers' pushes, as the next pull would).
    const absl::Time deadline =
        std::min(call_deadline - absl::Milliseconds(100), absl::Now() + absl::Seconds(10));
    int64_t log_index = outcome.log_index;
    // A clipped step is logged when its coefficient comes (ServePull waits for the
    // backups then, before any value of it leaves).
    if (shard.options().mode == TrainingMode::kSync && request.clip_grad_norm() == 0) {
      PS_ASSIGN_OR_RETURN(log_index, shard.AwaitStepApplied(request.step(), deadline));
    }
    if (request.clip_grad_norm() == 0)
      PS_RETURN_IF_ERROR(accepted.served.replicator->WaitReplicated(log_index, deadline));
  }
  if (request.clip_grad_norm() != 0) {
    const absl::Time deadline =
        std::min(call_deadline - absl::Milliseconds(100), absl::Now() + max_pull_wait_);
    // A pull's wait: it takes one of the pull slots.
    PS_RETURN_IF_ERROR(TakePullSlot());
    absl::Cleanup give_back_slot = [this] { ReturnPullSlot(); };
    PS_ASSIGN_OR_RETURN(const double sum_squares,
                        shard.AwaitStepSumSquares(request.step(), deadline));
    response->set_step_sum_squares(sum_squares);
  }
  if (outcome.checkpoint.has_value() && checkpoints_ != nullptr) {
    outcome.checkpoint->epoch = request.epoch();
    checkpoints_->Enqueue(*std::move(outcome.checkpoint));
  }
  response->set_duplicate(outcome.duplicate);
  response->set_late(outcome.late);
  response->set_applied_updates(outcome.applied_updates);
  if (request.pull_next()) {
    // The push stands whatever happens here; a pull that cannot be served now is left
    // to the worker's next pull.
    const absl::Time deadline =
        std::min(call_deadline - absl::Milliseconds(100), absl::Now() + max_pull_wait_);
    absl::Status pulled = TakePullSlot();
    if (pulled.ok()) {
      pulled = PullValues(shard, request.worker_rank(), request.step() + 1, deadline,
                          accepted.encoding, values, nullptr, accepted.next_rows);
      ReturnPullSlot();
    }
    response->set_pulled(pulled.ok());
    if (!pulled.ok()) {
      values.bytes->clear();
      response->set_pull_error(pulled.ToString());
    } else if (metrics_ != nullptr) {
      metrics_->pulls->Increment();
      metrics_->bytes_sent->Increment(values.size());
    }
  }
  return absl::OkStatus();
}

}  // namespace paramserver
