// Helpers of the service's tests (testonly): a real gRPC server on 127.0.0.1 with one
// shard installed, its calls, and what a refusal says.
#ifndef PARAMSERVER_PS_SERVICE_TESTING_H_
#define PARAMSERVER_PS_SERVICE_TESTING_H_

#include <atomic>
#include <limits>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "common/rpc/rpc_endpoints.h"
#include "common/testing/byte_buffers.h"
#include "common/testing/one_shard_calls.h"
#include "common/testing/test_credentials.h"
#include "common/wire/shard_call_codec.h"
#include "common/wire/shard_layout.h"
#include "common/wire/sparse_rows.h"
#include "common/wire/tensor_codec.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "ps/in_process_server.h"
#include "ps/parameter_server_service.h"

namespace paramserver {
namespace service_testing {

inline constexpr int kServerMessageLimit = 1 << 20;

class ServerFixture {
 public:
  explicit ServerFixture(
      int max_waiting_pulls = ParameterServerServiceImpl::kDefaultMaxWaitingPulls)
      : server_(StartServer(credentials_, max_waiting_pulls)), service_(server_->service()) {
    channel_ = CreateChannel(server_->address(), caller_);
    stub_ = ParameterServer::NewStub(channel_);
    data_stub_ = ParameterServerData::NewStub(channel_);
  }
  static std::unique_ptr<InProcessServer> StartServer(const TestCredentials& credentials,
                                                      int max_waiting_pulls) {
    InProcessServerOptions options;
    options.name = "ps-7";
    options.callers = credentials.verifier();
    options.max_pull_wait = absl::Seconds(2);
    options.max_waiting_pulls = max_waiting_pulls;
    options.max_message_bytes = kServerMessageLimit;
    absl::StatusOr<std::unique_ptr<InProcessServer>> server = InProcessServer::Start(options);
    REQUIRE(server.ok());
    return *std::move(server);
  }

  // Shard 4 (3 parameters) at epoch 5, served as it was since `routed_since` (0: 5).
  void Install(TrainingMode mode = TrainingMode::kAsync, int64_t routed_since = 0) {
    ParameterShardOptions options;
    options.shard_id = 4;
    options.range = {0, 3};
    options.mode = mode;
    options.num_workers = 2;
    std::map<int, ServedShard> shards;
    shards[4].shard = std::make_shared<ParameterShard>(options, std::vector<float>{1, 2, 3});
    shards[4].primary_name = "ps-7";
    shards[4].routed_since = routed_since;
    service_.InstallShards("ps-7", /*epoch=*/5, std::move(shards));
  }

  // Calls `method` with `bytes` as the request; the reply's bytes go to *reply.
  grpc::Status RawCall(const char* method, const std::string& bytes, std::string* reply = nullptr) {
    grpc::GenericStub generic(channel_);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::ByteBuffer request = ByteBufferOf(bytes), response;
    grpc::Status result;
    bool done = false;
    absl::Mutex mu;
    generic.UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                      [&](grpc::Status status) {
                        absl::MutexLock lock(&mu);
                        result = status;
                        done = true;
                      });
    absl::MutexLock lock(&mu);
    REQUIRE(mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(10)));
    if (result.ok() && reply != nullptr) *reply = BytesOf(response);
    return result;
  }

  // Calls from now on come from `node_name`, with its credential.
  void ActAs(const std::string& node_name) {
    caller_->SetIdentity(node_name, TestCredentials::TokenOf(node_name));
  }

  grpc::Status Push(int shard, int64_t epoch, int worker, int64_t step, const std::string& gradient,
                    PushResponse* response = nullptr) {
    ActAs("worker-" + std::to_string(worker));
    PushRequest request;
    request.set_shard_id(shard);
    request.set_epoch(epoch);
    request.set_worker_rank(worker);
    request.set_step(step);
    request.set_gradient(gradient);
    PushResponse ignored;
    return PushOne(request, absl::Seconds(5), response != nullptr ? response : &ignored);
  }

  // A push whose reply should carry the values of step + 1.
  grpc::Status PushAndPullNext(int worker, int64_t step, const std::string& gradient,
                               absl::Duration timeout, PushResponse* response) {
    ActAs("worker-" + std::to_string(worker));
    PushRequest request;
    request.set_shard_id(4);
    request.set_epoch(5);
    request.set_worker_rank(worker);
    request.set_step(step);
    request.set_gradient(gradient);
    request.set_pull_next(true);
    return PushOne(request, timeout, response);
  }

  grpc::Status Pull(int shard, int64_t epoch, PullResponse* response) {
    ActAs("worker-0");
    PullRequest request;
    request.set_shard_id(shard);
    request.set_epoch(epoch);
    request.set_worker_rank(0);
    return PullOne(request, absl::Seconds(5), response);
  }

  // One shard's pull or push, as the one part of a PullShards or PushShards call; the
  // part's reply into *response.
  grpc::Status PullOne(const PullRequest& part, absl::Duration timeout, PullResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    return PullOneShard(*data_stub_, &context, part, response);
  }
  grpc::Status PushOne(const PushRequest& part, absl::Duration timeout, PushResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    return PushOneShard(*data_stub_, &context, part, response);
  }

  TestCredentials credentials_;
  std::shared_ptr<CallCredentials> caller_ = TestCredentials::As("worker-0");
  std::unique_ptr<InProcessServer> server_;
  ParameterServerServiceImpl& service_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<ParameterServer::Stub> stub_;
  std::unique_ptr<ParameterServerData::Stub> data_stub_;
};

inline std::string Floats(std::vector<float> values) {
  std::string bytes;
  AppendFloatsLittleEndian(values, &bytes);
  return bytes;
}

inline const char kGarbageBytes[] = "\xff\xff\xff\xff\x0f not a protobuf";
inline const std::string kGarbage(kGarbageBytes, sizeof(kGarbageBytes) - 1);

inline bool Says(const grpc::Status& status, grpc::StatusCode code, const std::string& text) {
  INFO(status.error_code() << ": " << status.error_message());
  return status.error_code() == code && status.error_message().find(text) != std::string::npos;
}

}  // namespace service_testing
}  // namespace paramserver

#endif  // PARAMSERVER_PS_SERVICE_TESTING_H_
