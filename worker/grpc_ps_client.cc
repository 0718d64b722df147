#include "worker/grpc_ps_client.h"

#include <algorithm>
#include <cmath>
#include <future>
#include <limits>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/base/status_macros.h"
#include "common/model/optimizer_groups.h"
#include "common/model/step_optimizer.h"
#include "common/rpc/retry_policy.h"
#include "common/rpc/rpc_endpoints.h"
#include "common/rpc/rpc_status.h"
#include "common/wire/shard_call_codec.h"
#include "common/wire/shard_layout.h"
#include "common/wire/tensor_codec.h"
#include "spdlog/spdlog.h"

namespace paramserver {
namespace {

// Between retries of a call to the servers.
constexpr BackoffPolicy kServerCallBackoff{absl::Milliseconds(20), absl::Seconds(1)};
// For this long after it moved to a new map, a wait for the next one (AwaitShardMapChange)
// lasts at most kSettlingWait: the servers may still be installing the new map.
constexpr absl::Duration kSettlingAfterMapChange = absl::Seconds(1);
constexpr absl::Duration kSettlingWait = absl::Milliseconds(50);

// WireEncoding (proto) and WireDtype (common) number the encodings alike.
static_assert(static_cast<int>(WireDtype::kFloat32) == WIRE_FLOAT32 &&
                  static_cast<int>(WireDtype::kBfloat16) == WIRE_BFLOAT16 &&
                  static_cast<int>(WireDtype::kFloat16) == WIRE_FLOAT16,
              "WireEncoding and WireDtype disagree");

// The state of one round of parallel calls. Shared with the gRPC callbacks, so a caller
// that stops waiting (deadline) leaves nothing dangling.
struct CallRound {
  explicit CallRound(size_t n)
      : contexts(n), requests(n), responses(n), statuses(n), remaining(n) {}

  void Finish(size_t i, grpc::Status status) ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    statuses[i] = std::move(status);
    --remaining;
  }

  bool WaitUntil(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu) {
    absl::MutexLock lock(&mu);
    auto all_done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return remaining == 0; };
    return mu.AwaitWithDeadline(absl::Condition(&all_done), deadline);
  }

  std::vector<grpc::ClientContext> contexts;
  std::vector<grpc::ByteBuffer> requests;
  std::vector<grpc::ByteBuffer> responses;
  absl::Mutex mu;
  std::vector<grpc::Status> statuses ABSL_GUARDED_BY(mu);
  size_t remaining ABSL_GUARDED_BY(mu);
};

// Calls `method` on every server group in parallel (one call each, carrying all of its
// shards; `fill` writes the request bytes); on success `on_reply` consumes the reply. Groups whose
// call failed with a retryable code are retried with exponential backoff until `give_up`. Errors
// name the server and its shards.
template <typename Fill, typename OnReply>
absl::Status CallEveryServer(const std::vector<ServerGroup>& groups, const char* verb,
                             const char* method, absl::Duration attempt_timeout, absl::Time give_up,
                             bool retry_deadline_exceeded, RpcFaultInjector* faults, Fill fill,
                             OnReply on_reply) {
  std::vector<size_t> pending(groups.size());
  for (size_t i = 0; i < pending.size(); ++i) pending[i] = i;
  ExponentialBackoff backoff(kServerCallBackoff);
  while (true) {
    auto round = std::make_shared<CallRound>(pending.size());
    const absl::Time attempt_deadline = absl::Now() + attempt_timeout;
    for (size_t k = 0; k < pending.size(); ++k) {
      fill(pending[k], &round->requests[k]);
      round->contexts[k].set_deadline(absl::ToChronoTime(attempt_deadline));
      const RpcFault fault = faults != nullptr ? faults->NextCall() : RpcFault();
      if (fault.delay > absl::ZeroDuration()) absl::SleepFor(fault.delay);
      if (fault.drop_request) {
        round->Finish(
            k, grpc::Status(grpc::StatusCode::UNAVAILABLE, "injected fault: request dropped"));
        continue;
      }
      groups[pending[k]].stub->UnaryCall(
          &round->contexts[k], method, grpc::StubOptions(), &round->requests[k],
          &round->responses[k],
          [round, k, drop_response = fault.drop_response](grpc::Status status) {
            if (drop_response && status.ok()) {
              status =
                  grpc::Status(grpc::StatusCode::UNAVAILABLE, "injected fault: response dropped");
            }
            round->Finish(k, std::move(status));
          });
    }
    if (!round->WaitUntil(attempt_deadline + absl::Seconds(5))) {
      for (grpc::ClientContext& context : round->contexts) context.TryCancel();
      // A request may refer to the caller's tensor memory (EncodePushShards): do not
      // return while gRPC could still read it. Cancelled calls complete promptly.
      if (!round->WaitUntil(absl::Now() + absl::Seconds(30))) {
        spdlog::critical(
            "{}: gRPC did not complete cancelled calls within 30 s; their buffers cannot be "
            "released "
            "safely; aborting",
            verb);
        std::abort();
      }
      return absl::DeadlineExceededError(
          absl::StrCat(verb, ": gRPC did not complete the calls in time"));
    }
    std::vector<size_t> retry;
    absl::MutexLock lock(&round->mu);
    for (size_t k = 0; k < pending.size(); ++k) {
      const ServerGroup& group = groups[pending[k]];
      const grpc::Status& status = round->statuses[k];
      if (status.ok()) {
        absl::Status consumed = on_reply(pending[k], round->responses[k]);  // may consume it
        if (!consumed.ok()) return consumed;
      } else if (IsRetryable(static_cast<absl::StatusCode>(status.error_code()),
                             retry_deadline_exceeded) &&
                 backoff.CanRetryBefore(give_up)) {
        retry.push_back(pending[k]);
      } else {
        return RpcError(
            status, absl::StrCat(verb, " shard", group.shard_ids.size() == 1 ? " " : "s ",
                                 absl::StrJoin(group.shard_ids, ", "), " on ", group.server_name,
                                 " (", group.server_address, ")"));
      }
    }
    if (retry.empty()) return absl::OkStatus();
    pending = std::move(retry);
    backoff.Wait();
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcPsClient>> GrpcPsClient::Create(
    GrpcPsClientOptions options, const ShardMap& shard_map,
    std::function<absl::StatusOr<ShardMap>()> fetch_map) {
  std::unique_ptr<GrpcPsClient> client(new GrpcPsClient(options, std::move(fetch_map)));
  if (absl::Status routed = client->Route(shard_map); !routed.ok()) return routed;
  // A worker that starts after a rollback does not replay it.
  client->rewind_epoch_seen_ = shard_map.rewind_epoch();
  return client;
}

GrpcPsClient::GrpcPsClient(GrpcPsClientOptions options,
                           std::function<absl::StatusOr<ShardMap>()> fetch_map)
    : options_(options), fetch_map_(std::move(fetch_map)) {}

absl::Status GrpcPsClient::Route(const ShardMap& shard_map) {
  int64_t covered = 0;
  int buckets = 0;
  std::set<int> buckets_seen;
  for (const ShardAssignment& shard : shard_map.shards()) {
    if (shard.kind() == SHARD_KIND_EMBEDDING_ROWS) {
      if (options_.embedding_dims.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the shard map (epoch ", shard_map.epoch(), ") gives shard ", shard.shard_id(),
            " embedding rows, but this worker's model has no embedding tables"));
      }
      if (buckets == 0) buckets = shard.embedding_buckets();
      if (shard.embedding_buckets() != buckets || shard.embedding_bucket() < 0 ||
          shard.embedding_bucket() >= buckets ||
          !buckets_seen.insert(shard.embedding_bucket()).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the shard map (epoch ", shard_map.epoch(), ") gives shard ", shard.shard_id(),
            " embedding bucket ", shard.embedding_bucket(), " of ", shard.embedding_buckets(),
            ": not one cut of the key space, each bucket once"));
      }
      continue;
    }
    if (shard.kind() != SHARD_KIND_DENSE_RANGE) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the shard map (epoch ", shard_map.epoch(), ") gives shard ", shard.shard_id(),
          " the kind ", ShardKind_Name(shard.kind()), ", which this worker does not train"));
    }
    if (shard.begin() != covered || shard.end() <= shard.begin()) {
      return absl::InvalidArgumentError(absl::StrCat("the shard map (epoch ", shard_map.epoch(),
                                                     ") is not contiguous at shard ",
                                                     shard.shard_id()));
    }
    covered = shard.end();
  }
  if (covered != options_.total_parameters) {
    return absl::InvalidArgumentError(absl::StrCat("the shard map covers ", covered,
                                                   " parameters; the model has ",
                                                   options_.total_parameters));
  }
  if (!options_.embedding_dims.empty() && static_cast<int>(buckets_seen.size()) != buckets) {
    return absl::InvalidArgumentError(
        absl::StrCat("the shard map (epoch ", shard_map.epoch(), ") holds ", buckets_seen.size(),
                     " embedding shards of ", buckets, "; the model's tables need every bucket"));
  }
  if (!options_.embedding_dims.empty() && buckets == 0) {
    return absl::InvalidArgumentError(absl::StrCat("the shard map (epoch ", shard_map.epoch(),
                                                   ") has no embedding shards for this model's ",
                                                   options_.embedding_dims.size(), " tables"));
  }
  embedding_buckets_ = buckets;
  shards_.assign(shard_map.shards().begin(), shard_map.shards().end());
  groups_.clear();
  std::map<std::string, size_t> group_of_address;
  for (size_t i = 0; i < shards_.size(); ++i) {
    const ShardAssignment& shard = shards_[i];
    auto [it, added] = group_of_address.emplace(shard.server_address(), groups_.size());
    if (added) {
      std::unique_ptr<grpc::GenericStub>& stub = stubs_[shard.server_address()];
      if (stub == nullptr)
        stub = std::make_unique<grpc::GenericStub>(
            CreateChannel(shard.server_address(), options_.credentials));
      groups_.push_back(
          ServerGroup{stub.get(), shard.server_name(), shard.server_address(), {}, {}});
    }
    groups_[it->second].shard_indices.push_back(i);
    groups_[it->second].shard_ids.push_back(shard.shard_id());
  }
  epoch_ = shard_map.epoch();
  return absl::OkStatus();
}

absl::StatusOr<ShardMapUpdate> GrpcPsClient::RefreshShardMap() {
  absl::StatusOr<ShardMap> map = fetch_map_();
  if (!map.ok()) return map.status();
  return FollowMap(*map);
}

absl::StatusOr<ShardMapUpdate> GrpcPsClient::AwaitShardMapChange(absl::Duration wait) {
  if (!options_.await_map) return PsClient::AwaitShardMapChange(wait);
  if (absl::Now() - followed_map_at_ < kSettlingAfterMapChange) {
    // Just moved to a new map: a server may still be installing it, and is tried again
    // soon rather than after a full wait for a map that is not coming.
    wait = std::min(wait, kSettlingWait);
  }
  absl::StatusOr<ShardMap> map = options_.await_map(epoch_, wait);
  if (!map.ok()) return map.status();
  return FollowMap(*map);
}

absl::StatusOr<ShardMapUpdate> GrpcPsClient::FollowMap(const ShardMap& map) {
  ShardMapUpdate update;
  update.epoch = map.epoch();
  update.self_active =
      options_.worker_rank >= map.active_workers_size() || map.active_workers(options_.worker_rank);
  if (map.epoch() != epoch_) {
    if (absl::Status routed = Route(map); !routed.ok()) return routed;
    followed_map_at_ = absl::Now();
    update.epoch_changed = true;
    if (map.rewind_epoch() > rewind_epoch_seen_) {
      rewind_epoch_seen_ = map.rewind_epoch();
      update.rewind_to = map.rewind_step();
    }
  }
  if (update.self_active && options_.rejoin_pending != nullptr && options_.rejoin_pending->load()) {
    // Re-admitted: the step this worker was stopped at is stale (in sync mode the others
    // went on without it). Until the servers serve the map that admits it again, this
    // fails and the caller tries again.
    PS_ASSIGN_OR_RETURN(const int64_t start_step, StartStep());
    options_.rejoin_pending->store(false);
    ++rejoins_;
    update.rejoined = true;
    update.rewind_to = start_step;
  }
  return update;
}

absl::Status GrpcPsClient::Pull(const StepPull& pull) {
  if (pull.into.rows.size() != pull.into.ids.size()) {
    return absl::InvalidArgumentError(absl::StrCat("a pull of ", pull.into.ids.size(),
                                                   " tables' rows into ", pull.into.rows.size(),
                                                   " tables"));
  }
  PS_ASSIGN_OR_RETURN(RowRouting routing, RouteRows(pull.into.ids));
  PS_RETURN_IF_ERROR(
      PullShards(pull.step, pull.into.params, &routing, nullptr, pull.clip_coefficient));
  ScatterRows(routing, pull.into.ids, pull.into.rows);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> GrpcPsClient::StartStep() {
  std::vector<float> scratch(options_.total_parameters);
  std::vector<int64_t> start_steps(shards_.size(), 0);
  PS_ASSIGN_OR_RETURN(RowRouting no_rows, RouteRows({}));
  PS_RETURN_IF_ERROR(PullShards(0, absl::MakeSpan(scratch), &no_rows, &start_steps));
  // The dense shards' step (a model of tables alone: the tables' slowest worker's).
  std::optional<int64_t> start;
  for (size_t i = 0; i < shards_.size(); ++i) {
    if (CountsSteps(shards_[i])) start = std::min(start.value_or(start_steps[i]), start_steps[i]);
  }
  return start.value_or(*std::min_element(start_steps.begin(), start_steps.end()));
}

bool GrpcPsClient::CountsSteps(const ShardAssignment& shard) const {
  return !options_.async_tables || shard.kind() != SHARD_KIND_EMBEDDING_ROWS;
}

absl::Status GrpcPsClient::PullShards(int64_t step, absl::Span<float> params, RowRouting* routing,
                                      std::vector<int64_t>* start_steps, float clip_coefficient) {
  return CallEveryServer(
      groups_, "pull", kPullShardsMethod, options_.pull_timeout,
      absl::Now() + options_.retry_deadline,
      /*retry_deadline_exceeded=*/false, options_.faults.get(),
      [&](size_t g, grpc::ByteBuffer* request) {
        PullShardsRequest pull;
        for (size_t i : groups_[g].shard_indices) {
          PullRequest* part = pull.add_shards();
          part->set_shard_id(shards_[i].shard_id());
          part->set_epoch(epoch_);
          part->set_worker_rank(options_.worker_rank);
          part->set_step(step);
          part->set_encoding(static_cast<WireEncoding>(options_.wire_dtype));
          SetRowIds(shards_[i], *routing, part->mutable_id_counts(), part->mutable_ids());
          if (shards_[i].kind() != SHARD_KIND_EMBEDDING_ROWS)
            part->set_clip_coefficient(clip_coefficient);
        }
        *request = EncodePullShards(pull);
      },
      [&](size_t g, grpc::ByteBuffer& response) -> absl::Status {
        PS_ASSIGN_OR_RETURN(
            std::vector<ReplyPart> parts,
            DecodeShardsReply(ReplyKind::kPull, &response, options_.wire_dtype,
                              ShardSpans(groups_[g], params, routing), groups_[g].server_name));
        const std::vector<size_t>& indices = groups_[g].shard_indices;
        for (size_t k = 0; k < indices.size(); ++k) {
          // An embedding shard asked for no rows sends none.
          const ShardAssignment& shard = shards_[indices[k]];
          const bool rows_expected = shard.kind() != SHARD_KIND_EMBEDDING_ROWS ||
                                     !routing->values[shard.embedding_bucket()].empty();
          if (rows_expected && !parts[k].has_values) {
            return absl::InternalError(absl::StrCat(
                groups_[g].server_name, " sent no values for shard ", shard.shard_id()));
          }
          if (start_steps != nullptr) (*start_steps)[indices[k]] = parts[k].start_step;
        }
        return absl::OkStatus();
      });
}

std::vector<absl::Span<float>> GrpcPsClient::ShardSpans(const ServerGroup& group,
                                                        absl::Span<float> flat,
                                                        RowRouting* routing) const {
  std::vector<absl::Span<float>> spans;
  for (size_t i : group.shard_indices) {
    const ShardAssignment& shard = shards_[i];
    if (shard.kind() == SHARD_KIND_EMBEDDING_ROWS) {
      spans.push_back(absl::MakeSpan(routing->values[shard.embedding_bucket()]));
      continue;
    }
    spans.push_back(flat.empty() ? absl::Span<float>()
                                 : flat.subspan(shard.begin(), shard.end() - shard.begin()));
  }
  return spans;
}

std::vector<ServerGroup> GrpcPsClient::GroupsOfShards(size_t first, size_t last) const {
  std::vector<ServerGroup> groups;
  for (const ServerGroup& group : groups_) {
    ServerGroup part{group.stub, group.server_name, group.server_address, {}, {}};
    for (size_t k = 0; k < group.shard_indices.size(); ++k) {
      if (group.shard_indices[k] < first || group.shard_indices[k] >= last) continue;
      part.shard_indices.push_back(group.shard_indices[k]);
      part.shard_ids.push_back(group.shard_ids[k]);
    }
    if (!part.shard_indices.empty()) groups.push_back(std::move(part));
  }
  return groups;
}

void GrpcPsClient::PushReplies::Add(const PushReplies& other) {
  shards_pulled += other.shards_pulled;
  PushAcknowledgement& mine = acknowledgement;
  const PushAcknowledgement& theirs = other.acknowledgement;
  if (theirs.shards == 0) return;
  mine.least_shard_step = mine.shards == 0
                              ? theirs.least_shard_step
                              : std::min(mine.least_shard_step, theirs.least_shard_step);
  mine.shards += theirs.shards;
  mine.late_shards += theirs.late_shards;
}

absl::StatusOr<bool> GrpcPsClient::Push(const StepPush& push) {
  PS_ASSIGN_OR_RETURN(RoutedPush routed, RoutePush(push));
  PS_ASSIGN_OR_RETURN(const PushReplies replies, PushShards(groups_, &routed));
  last_push_ = replies.acknowledgement;
  if (!push.next.has_value() || replies.shards_pulled != shards_.size()) return false;
  ScatterRows(routed.next_rows, push.next->ids, push.next->rows);
  return true;
}

absl::StatusOr<GrpcPsClient::PushReplies> GrpcPsClient::PushShards(
    const std::vector<ServerGroup>& groups, RoutedPush* routed) const {
  const StepPush& push = *routed->push;
  const bool pull_next = push.next.has_value();
  // Waiting for the next step's values, or (clipped) for every worker's push of the step,
  // is a pull's wait: the attempt may take as long.
  const absl::Duration attempt_timeout = pull_next || push.clip_grad_norm > 0
                                             ? options_.push_timeout + options_.pull_timeout
                                             : options_.push_timeout;
  const absl::Span<float> next_params = pull_next ? push.next->params : absl::Span<float>();
  const bool clipped = push.clip_grad_norm > 0;
  if (clipped && (pull_next || push.step_sum_squares == nullptr)) {
    return absl::InvalidArgumentError(
        "a clipped push gathers the step's sums of squares and pulls nothing with it");
  }
  std::vector<double> sums(clipped ? shards_.size() : 0, 0.0);  // per shard, in map order
  // The replies are read one at a time, on this thread (CallEveryServer's on_reply).
  PushReplies replies;
  PS_RETURN_IF_ERROR(CallEveryServer(
      groups, "push", kPushShardsMethod, attempt_timeout, absl::Now() + options_.retry_deadline,
      /*retry_deadline_exceeded=*/true, options_.faults.get(),
      [&](size_t g, grpc::ByteBuffer* request) {
        std::vector<PushPart> parts;
        for (size_t i : groups[g].shard_indices) {
          const ShardAssignment& shard = shards_[i];
          PushPart& part = parts.emplace_back();
          part.header.set_shard_id(shard.shard_id());
          part.header.set_epoch(epoch_);
          part.header.set_worker_rank(options_.worker_rank);
          part.header.set_step(push.step);
          part.header.set_encoding(static_cast<WireEncoding>(options_.wire_dtype));
          part.header.set_pull_next(pull_next);
          part.header.set_skip_step(push.skip);
          if (shard.kind() == SHARD_KIND_EMBEDDING_ROWS) {
            if (!push.skip) {
              SetRowIds(shard, routed->rows, part.header.mutable_id_counts(),
                        part.header.mutable_ids());
              part.gradient = routed->rows.values[shard.embedding_bucket()];
            }
            // The next step reads the next batch's rows (none when it reads none).
            if (pull_next) {
              SetRowIds(shard, routed->next_rows, part.header.mutable_next_id_counts(),
                        part.header.mutable_next_ids());
            }
            continue;
          }
          if (push.skip) continue;  // no gradient, no settings
          part.header.set_clip_grad_norm(push.clip_grad_norm);
          part.gradient = push.gradient.subspan(shard.begin(), shard.end() - shard.begin());
          if (push.settings != nullptr && !push.settings->empty()) {
            StepHyperparametersToProto(push.settings->front().options.type,
                                       SegmentsWithin(*push.settings, {shard.begin(), shard.end()}),
                                       part.header.mutable_optimizer());
          }
        }
        // Refers to the gradients (float32): CallEveryServer returns only after gRPC let go.
        *request = EncodePushShards(parts, options_.wire_dtype);
      },
      [&](size_t g, grpc::ByteBuffer& response) -> absl::Status {
        PS_ASSIGN_OR_RETURN(
            std::vector<ReplyPart> parts,
            DecodeShardsReply(ReplyKind::kPush, &response, options_.wire_dtype,
                              ShardSpans(groups[g], next_params, &routed->next_rows),
                              groups[g].server_name));
        const std::vector<size_t>& indices = groups[g].shard_indices;
        for (size_t k = 0; k < parts.size(); ++k) {
          const ShardAssignment& shard = shards_[indices[k]];
          // An embedding shard asked for no rows sends none back.
          const bool none_expected = shard.kind() == SHARD_KIND_EMBEDDING_ROWS &&
                                     routed->next_rows.values[shard.embedding_bucket()].empty();
          if (CountsSteps(shard))
            replies.Add(PushReplies{0, {1, parts[k].late ? 1 : 0, parts[k].applied_updates}});
          if (pull_next && parts[k].pulled && (parts[k].has_values || none_expected))
            ++replies.shards_pulled;
          if (!clipped || shard.kind() == SHARD_KIND_EMBEDDING_ROWS) continue;
          const double sum = parts[k].step_sum_squares;
          if (!(std::isfinite(sum) && sum >= 0)) {
            return absl::InternalError(absl::StrCat(groups[g].server_name, " reported a sum of ",
                                                    "squares of ", sum, " for shard ",
                                                    shard.shard_id()));
          }
          sums[indices[k]] = sum;
        }
        return absl::OkStatus();
      }));
  if (clipped) {
    double total = 0;
    for (double sum : sums) total += sum;
    *push.step_sum_squares = total;
  }
  return replies;
}

// Buckets are whole shards, taken from the last shard down.
class GrpcStreamedPush final : public StreamedPush {
 public:
  GrpcStreamedPush(GrpcPsClient* client, const StepPush& push)
      : client_(client), push_(push), sent_from_(client->shards_.size()) {
    absl::StatusOr<GrpcPsClient::RoutedPush> routed = client->RoutePush(push_);
    if (routed.ok() &&
        (!push_.ids.empty() || (push_.next.has_value() && !push_.next->ids.empty()))) {
      routed = absl::InvalidArgumentError("a streamed push carries no embedding rows");
    }
    if (routed.ok()) {
      routed_ = *std::move(routed);
      routed_.push = &push_;
    } else {
      refused_ = routed.status();
      sent_from_ = 0;  // nothing is sent
    }
  }

  ~GrpcStreamedPush() override {
    for (std::future<absl::StatusOr<GrpcPsClient::PushReplies>>& bucket : early_) {
      if (bucket.valid()) bucket.wait();
    }
  }

  void Ready(int64_t from) override {
    std::optional<std::vector<ServerGroup>> bucket =
        TakeBucket(from, client_->options_.push_bucket_values);
    if (!bucket.has_value()) return;
    early_.push_back(std::async(std::launch::async, [this, groups = *std::move(bucket)] {
      return client_->PushShards(groups, &routed_);
    }));
  }

  int64_t early_buckets() const override { return static_cast<int64_t>(early_.size()); }

  absl::StatusOr<bool> Finish() override {
    if (!refused_.ok()) return refused_;
    // The last bucket goes on this thread: a push that was never split costs no thread.
    std::optional<std::vector<ServerGroup>> last = TakeBucket(0, 0);
    absl::StatusOr<GrpcPsClient::PushReplies> replies =
        last.has_value() ? client_->PushShards(*last, &routed_) : GrpcPsClient::PushReplies{};
    for (std::future<absl::StatusOr<GrpcPsClient::PushReplies>>& bucket : early_) {
      absl::StatusOr<GrpcPsClient::PushReplies> early = bucket.get();
      if (!replies.ok()) continue;  // keeps the first error
      if (early.ok()) {
        replies->Add(*early);
      } else {
        replies = early.status();
      }
    }
    if (!replies.ok()) return replies.status();
    client_->last_push_ = replies->acknowledgement;
    return push_.next.has_value() && replies->shards_pulled == client_->shards_.size();
  }

 private:
  // The unsent shards inside gradient[from, end), as calls per server, if they hold at
  // least min_values values (they count as sent from then on).
  std::optional<std::vector<ServerGroup>> TakeBucket(int64_t from, int64_t min_values) {
    const std::vector<ShardAssignment>& shards = client_->shards_;
    size_t first = sent_from_;
    while (first > 0 && shards[first - 1].begin() >= from) --first;
    if (first == sent_from_ || shards[sent_from_ - 1].end() - shards[first].begin() < min_values)
      return std::nullopt;
    std::vector<ServerGroup> groups = client_->GroupsOfShards(first, sent_from_);
    sent_from_ = first;
    return groups;
  }

  GrpcPsClient* const client_;
  const StepPush push_;
  // No rows: the buckets' threads only read it (the dense values go to disjoint spans).
  GrpcPsClient::RoutedPush routed_{};
  absl::Status refused_;
  size_t sent_from_;  // shards_[sent_from_, end) are sent
  // The buckets Ready sent.
  std::vector<std::future<absl::StatusOr<GrpcPsClient::PushReplies>>> early_;
};

std::unique_ptr<StreamedPush> GrpcPsClient::StartStreamedPush(const StepPush& push) {
  return std::make_unique<GrpcStreamedPush>(this, push);
}

}  // namespace paramserver
