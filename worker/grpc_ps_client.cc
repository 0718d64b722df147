#include "worker/grpc_ps_client.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc_endpoints.h"
#include "common/rpc_status.h"
#include "common/tensor_codec.h"

namespace paramserver {
namespace {

// The state of one round of parallel calls. Shared with the gRPC callbacks, so a caller
// that stops waiting (deadline) leaves nothing dangling.
template <typename Request, typename Response>
struct CallRound {
  explicit CallRound(size_t n) : contexts(n), requests(n), responses(n), statuses(n), remaining(n) {}

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
  std::vector<Request> requests;
  std::vector<Response> responses;
  absl::Mutex mu;
  std::vector<grpc::Status> statuses ABSL_GUARDED_BY(mu);
  size_t remaining ABSL_GUARDED_BY(mu);
};

bool IsRetryable(grpc::StatusCode code, bool retry_deadline_exceeded) {
  return code == grpc::StatusCode::UNAVAILABLE ||
         (retry_deadline_exceeded && code == grpc::StatusCode::DEADLINE_EXCEEDED);
}

// Calls `start` for every shard index in `pending` in parallel; on success `on_reply`
// consumes the response. Shards whose call failed with a retryable code are retried
// with exponential backoff until `give_up`. Errors name the shard and server.
template <typename Request, typename Response, typename Fill, typename Start, typename OnReply>
absl::Status CallEveryShard(const std::vector<ShardAssignment>& shards, const char* verb,
                            absl::Duration attempt_timeout, absl::Time give_up,
                            bool retry_deadline_exceeded, Fill fill, Start start, OnReply on_reply) {
  std::vector<size_t> pending(shards.size());
  for (size_t i = 0; i < pending.size(); ++i) pending[i] = i;
  absl::Duration backoff = absl::Milliseconds(20);
  while (true) {
    auto round = std::make_shared<CallRound<Request, Response>>(pending.size());
    const absl::Time attempt_deadline = std::min(give_up, absl::Now() + attempt_timeout);
    for (size_t k = 0; k < pending.size(); ++k) {
      fill(pending[k], &round->requests[k]);
      round->contexts[k].set_deadline(absl::ToChronoTime(attempt_deadline));
      start(pending[k], &round->contexts[k], &round->requests[k], &round->responses[k],
            [round, k](grpc::Status status) { round->Finish(k, std::move(status)); });
    }
    if (!round->WaitUntil(attempt_deadline + absl::Seconds(5))) {
      for (grpc::ClientContext& context : round->contexts) context.TryCancel();
      return absl::DeadlineExceededError(absl::StrCat(verb, ": gRPC did not complete the calls in time"));
    }
    std::vector<size_t> retry;
    grpc::Status last_retryable;
    absl::MutexLock lock(&round->mu);
    for (size_t k = 0; k < pending.size(); ++k) {
      const ShardAssignment& shard = shards[pending[k]];
      const grpc::Status& status = round->statuses[k];
      if (status.ok()) {
        absl::Status consumed = on_reply(pending[k], round->responses[k]);
        if (!consumed.ok()) return consumed;
      } else if (IsRetryable(status.error_code(), retry_deadline_exceeded) && absl::Now() + backoff < give_up) {
        retry.push_back(pending[k]);
        last_retryable = status;
      } else {
        return RpcError(status, absl::StrCat(verb, " shard ", shard.shard_id(), " on ", shard.server_name(),
                                             " (", shard.server_address(), ")"));
      }
    }
    if (retry.empty()) return absl::OkStatus();
    pending = std::move(retry);
    std::this_thread::sleep_for(absl::ToChronoNanoseconds(backoff));
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcPsClient>> GrpcPsClient::Create(GrpcPsClientOptions options,
                                                                   const ShardMap& shard_map) {
  std::unique_ptr<GrpcPsClient> client(new GrpcPsClient(options, shard_map.epoch()));
  int64_t covered = 0;
  for (const ShardAssignment& shard : shard_map.shards()) {
    if (shard.begin() != covered || shard.end() <= shard.begin()) {
      return absl::InvalidArgumentError(absl::StrCat("the shard map (epoch ", shard_map.epoch(),
                                                     ") is not contiguous at shard ", shard.shard_id()));
    }
    covered = shard.end();
    std::unique_ptr<ParameterServer::Stub>& stub = client->stubs_[shard.server_address()];
    if (stub == nullptr) stub = ParameterServer::NewStub(CreateChannel(shard.server_address()));
    client->routes_.push_back({shard, stub.get()});
  }
  if (covered != options.total_parameters) {
    return absl::InvalidArgumentError(absl::StrCat("the shard map covers ", covered,
                                                   " parameters; the model has ", options.total_parameters));
  }
  return client;
}

GrpcPsClient::GrpcPsClient(GrpcPsClientOptions options, int64_t epoch) : options_(options), epoch_(epoch) {}

absl::Status GrpcPsClient::PullAll(int64_t step, absl::Span<float> params) {
  std::vector<ShardAssignment> shards;
  for (const Route& route : routes_) shards.push_back(route.assignment);
  const absl::Time give_up = absl::Now() + options_.pull_timeout;
  return CallEveryShard<PullRequest, PullResponse>(
      shards, "pull", options_.pull_timeout, give_up, /*retry_deadline_exceeded=*/false,
      [&](size_t i, PullRequest* request) {
        request->set_shard_id(shards[i].shard_id());
        request->set_epoch(epoch_);
        request->set_worker_rank(options_.worker_rank);
        request->set_step(step);
      },
      [&](size_t i, grpc::ClientContext* context, PullRequest* request, PullResponse* response,
          std::function<void(grpc::Status)> done) {
        routes_[i].stub->async()->Pull(context, request, response, std::move(done));
      },
      [&](size_t i, const PullResponse& response) {
        const ShardAssignment& shard = shards[i];
        return DecodeFloatsExactly(response.values(),
                                   params.subspan(shard.begin(), shard.end() - shard.begin()),
                                   absl::StrCat("values of shard ", shard.shard_id(), " from ", shard.server_name()));
      });
}

absl::Status GrpcPsClient::PushAll(int64_t step, absl::Span<const float> gradient) {
  std::vector<ShardAssignment> shards;
  for (const Route& route : routes_) shards.push_back(route.assignment);
  const absl::Time give_up = absl::Now() + options_.retry_deadline;
  return CallEveryShard<PushRequest, PushResponse>(
      shards, "push", options_.push_timeout, give_up, /*retry_deadline_exceeded=*/true,
      [&](size_t i, PushRequest* request) {
        const ShardAssignment& shard = shards[i];
        request->set_shard_id(shard.shard_id());
        request->set_epoch(epoch_);
        request->set_worker_rank(options_.worker_rank);
        request->set_step(step);
        AppendFloatsLittleEndian(gradient.subspan(shard.begin(), shard.end() - shard.begin()),
                                 request->mutable_gradient());
      },
      [&](size_t i, grpc::ClientContext* context, PushRequest* request, PushResponse* response,
          std::function<void(grpc::Status)> done) {
        routes_[i].stub->async()->Push(context, request, response, std::move(done));
      },
      [](size_t, const PushResponse&) { return absl::OkStatus(); });
}

}  // namespace paramserver
