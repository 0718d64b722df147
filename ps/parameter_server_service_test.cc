// Bad requests against a real gRPC server on 127.0.0.1: each gets a clear status, and
// the server goes on serving good ones.
#include "ps/parameter_server_service.h"

#include <atomic>
#include <limits>
#include <thread>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "common/rpc_endpoints.h"
#include "common/shard_call_codec.h"
#include "common/shard_layout.h"
#include "common/sparse_rows.h"
#include "common/tensor_codec.h"
#include "common/testing/byte_buffers.h"
#include "common/testing/test_credentials.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "ps/in_process_server.h"

namespace paramserver {
namespace {

using google::protobuf::internal::WireFormatLite;

constexpr int kServerMessageLimit = 1 << 20;

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

  void Install(TrainingMode mode = TrainingMode::kAsync) {
    ParameterShardOptions options;
    options.shard_id = 4;
    options.range = {0, 3};
    options.mode = mode;
    options.num_workers = 2;
    std::map<int, ServedShard> shards;
    shards[4].shard = std::make_shared<ParameterShard>(options, std::vector<float>{1, 2, 3});
    shards[4].primary_name = "ps-7";
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
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return stub_->Push(&context, request, response != nullptr ? response : &ignored);
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
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    return stub_->Push(&context, request, response);
  }

  grpc::Status Pull(int shard, int64_t epoch, PullResponse* response) {
    ActAs("worker-0");
    PullRequest request;
    request.set_shard_id(shard);
    request.set_epoch(epoch);
    request.set_worker_rank(0);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return stub_->Pull(&context, request, response);
  }

  TestCredentials credentials_;
  std::shared_ptr<CallCredentials> caller_ = TestCredentials::As("worker-0");
  std::unique_ptr<InProcessServer> server_;
  ParameterServerServiceImpl& service_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<ParameterServer::Stub> stub_;
  std::unique_ptr<ParameterServerData::Stub> data_stub_;
};

std::string Floats(std::vector<float> values) {
  std::string bytes;
  AppendFloatsLittleEndian(values, &bytes);
  return bytes;
}

const char kGarbageBytes[] = "\xff\xff\xff\xff\x0f not a protobuf";
const std::string kGarbage(kGarbageBytes, sizeof(kGarbageBytes) - 1);

bool Says(const grpc::Status& status, grpc::StatusCode code, const std::string& text) {
  INFO(status.error_code() << ": " << status.error_message());
  return status.error_code() == code && status.error_message().find(text) != std::string::npos;
}

TEST_CASE("a server without shards answers UNAVAILABLE, so callers retry") {
  ServerFixture server;
  PullResponse response;
  CHECK(Says(server.Pull(4, 5, &response), grpc::StatusCode::UNAVAILABLE,
             "not been given its shards"));
  // However many parts a request has: the server cannot judge them yet.
  PullShardsRequest two;
  for (int shard : {4, 5}) {
    PullRequest* part = two.add_shards();
    part->set_shard_id(shard);
    part->set_epoch(1);
  }
  CHECK(Says(server.RawCall(kPullShardsMethod, two.SerializeAsString()),
             grpc::StatusCode::UNAVAILABLE, "not been given its shards"));
}

TEST_CASE("bad requests get a clear status and the server keeps serving") {
  ServerFixture server;
  server.Install();
  const std::string good = Floats({0.1f, 0.2f, 0.3f});
  CHECK(Says(server.Push(4, 4, 0, 0, good), grpc::StatusCode::FAILED_PRECONDITION,
             "stale epoch 4 for shard 4 on ps-7: the current epoch is 5"));
  CHECK(Says(server.Push(9, 5, 0, 0, good), grpc::StatusCode::FAILED_PRECONDITION,
             "ps-7 does not hold shard 9 at epoch 5"));
  CHECK(Says(server.Push(4, 5, 0, 0, Floats({1, 2})), grpc::StatusCode::INVALID_ARGUMENT,
             "expected 3 float32 values (12 bytes), got 8 bytes"));
  CHECK(
      Says(server.Push(4, 5, 0, 0, "1234567"), grpc::StatusCode::INVALID_ARGUMENT, "got 7 bytes"));
  CHECK(Says(server.Push(4, 5, 0, 0, Floats({0, std::numeric_limits<float>::quiet_NaN(), 0})),
             grpc::StatusCode::INVALID_ARGUMENT, "gradient[1] of worker 0 for step 0 is nan"));
  CHECK(Says(server.Push(4, 5, 0, 0, Floats({0, 0, -std::numeric_limits<float>::infinity()})),
             grpc::StatusCode::INVALID_ARGUMENT, "is -inf"));
  CHECK(Says(server.Push(4, 5, 3, 0, good), grpc::StatusCode::INVALID_ARGUMENT,
             "unknown worker rank 3"));
  CHECK(Says(server.Push(4, 5, 0, -1, good), grpc::StatusCode::INVALID_ARGUMENT, "negative step"));
  const std::string oversized(kServerMessageLimit + 64, 'x');
  CHECK(server.Push(4, 5, 0, 0, oversized).error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);

  // A message that is not a PushRequest at all.
  CHECK_FALSE(server.RawCall("/paramserver.ParameterServer/Push", kGarbage).ok());

  PushResponse pushed;
  REQUIRE(server.Push(4, 5, 0, 0, good, &pushed).ok());
  CHECK_FALSE(pushed.duplicate());
  PullResponse pulled;
  REQUIRE(server.Pull(4, 5, &pulled).ok());
  CHECK(pulled.applied_updates() == 1);
  std::vector<float> values(3);
  REQUIRE(DecodeFloatsExactly(pulled.values(), absl::MakeSpan(values), "values").ok());
  CHECK(values[0] < 1.0f);  // moved against a positive gradient
  CHECK(server.service_.rejected_requests() == 8);
}

TEST_CASE("a data call its caller cancels before its request arrives is counted, not refused") {
  ServerFixture server;
  server.Install();
  server.ActAs("worker-0");
  for (const char* method : {kPushShardsMethod, kPullShardsMethod}) {
    INFO(method);
    // The call's headers go out, then the caller gives up before sending its message:
    // what a server woken by SIGCONT sees of the pushes that timed out meanwhile.
    grpc::GenericStub generic(server.channel_);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::CompletionQueue queue;
    std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
        generic.PrepareCall(&context, method, &queue);
    call->StartCall(reinterpret_cast<void*>(1));
    void* tag = nullptr;
    bool ok = false;
    REQUIRE(queue.Next(&tag, &ok));
    REQUIRE(ok);
    context.TryCancel();
    grpc::Status finished;
    call->Finish(&finished, reinterpret_cast<void*>(2));
    REQUIRE(queue.Next(&tag, &ok));
    CHECK(finished.error_code() == grpc::StatusCode::CANCELLED);
    queue.Shutdown();
    while (queue.Next(&tag, &ok)) {
    }
  }
  for (const absl::Time give_up = absl::Now() + absl::Seconds(10);
       server.service_.cancelled_calls() < 2 && absl::Now() < give_up;) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  CHECK(server.service_.cancelled_calls() == 2);
  CHECK(server.service_.rejected_requests() == 0);  // not an attack
  // A malformed request is still one.
  CHECK(Says(server.RawCall(kPushShardsMethod, kGarbage), grpc::StatusCode::INVALID_ARGUMENT,
             "malformed PushShards request"));
  CHECK(server.service_.rejected_requests() == 1);
  CHECK(server.service_.cancelled_calls() == 2);
}

TEST_CASE(
    "initial values are taken only from the worker that declared the model, sized by the "
    "shard, once") {
  ServerFixture f;
  ParameterShardOptions options;
  options.shard_id = 4;
  options.range = {0, 3};
  options.mode = TrainingMode::kSync;
  options.num_workers = 2;
  std::map<int, ServedShard> shards;
  shards[4].shard = ParameterShard::AwaitingInitialValues(options);
  shards[4].primary_name = "ps-7";
  f.service_.InstallShards("ps-7", /*epoch=*/5, std::move(shards));
  f.service_.set_initial_values_from("worker-1");
  const auto set = [&](int worker, const std::string& values, SetInitialValuesResponse* response) {
    f.ActAs("worker-" + std::to_string(worker));
    SetInitialValuesRequest request;
    request.set_shard_id(4);
    request.set_epoch(5);
    request.set_worker_rank(worker);
    request.set_values(values);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return f.stub_->SetInitialValues(&context, request, response);
  };
  SetInitialValuesResponse response;
  const grpc::Status other = set(0, Floats({1, 2, 3}), &response);
  CHECK(other.error_code() == grpc::StatusCode::PERMISSION_DENIED);
  CHECK(other.error_message() ==
        "worker-0 may not set initial values: they are worker-1's (it declared the model)");
  const grpc::Status short_values = set(1, Floats({1, 2}), &response);
  CHECK(short_values.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(short_values.error_message() ==
        "initial values for shard 4: 8 bytes; it holds 3 float32 parameters");
  const grpc::Status not_finite = set(1, Floats({1, NAN, 3}), &response);
  CHECK(not_finite.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  // Until the values are set, a pull waits and says for what.
  PullResponse pulled;
  const grpc::Status waiting = f.Pull(4, 5, &pulled);
  CHECK(waiting.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
  CHECK(absl::StrContains(waiting.error_message(), "has no values yet"));

  REQUIRE(set(1, Floats({1, 2, 3}), &response).ok());
  CHECK_FALSE(response.already_set());
  REQUIRE(set(1, Floats({7, 7, 7}), &response).ok());  // a retry: the first values stand
  CHECK(response.already_set());
  REQUIRE(f.Pull(4, 5, &pulled).ok());
  CHECK(pulled.values() == Floats({1, 2, 3}));
}

// An embedding shard of two tables of dim 1 on bucket 0 of 2, sync, two workers, SGD.
std::shared_ptr<ParameterShard> SgdEmbeddingShard() {
  auto embedding = std::make_shared<EmbeddingShardOptions>();
  embedding->shape = {{1, 1}, 0, 2};
  for (int t = 0; t < 2; ++t) {
    EmbeddingTableOptions table;
    table.dim = 1;
    table.optimizer.type = EmbeddingOptimizerType::kSgd;
    table.optimizer.learning_rate = 0.5;
    table.table_index = t;
    embedding->tables.push_back(table);
  }
  ParameterShardOptions options;
  options.shard_id = 4;
  options.mode = TrainingMode::kSync;
  options.num_workers = 2;
  options.embedding = embedding;
  return std::make_shared<ParameterShard>(options, std::vector<float>());
}

// The first ids of table 0 on bucket 0 of 2, and one on bucket 1.
std::vector<int64_t> BucketIds(int bucket, int n) {
  std::vector<int64_t> ids;
  for (int64_t id = 1; static_cast<int>(ids.size()) < n; ++id) {
    if (EmbeddingShardOf(0, id, 2) == bucket) ids.push_back(id);
  }
  return ids;
}

TEST_CASE("embedding pushes with pull_next: the step's mean applied, the rows asked for sent") {
  ServerFixture server;
  std::map<int, ServedShard> shards;
  shards[4].shard = SgdEmbeddingShard();
  shards[4].primary_name = "ps-7";
  server.service_.InstallShards("ps-7", 5, std::move(shards));
  const std::vector<int64_t> ours = BucketIds(0, 2);
  const auto request = [&](int worker, int64_t step, std::vector<int64_t> ids,
                           std::vector<float> gradient, bool pull_next) {
    PushRequest push;
    push.set_shard_id(4);
    push.set_epoch(5);
    push.set_worker_rank(worker);
    push.set_step(step);
    push.set_ids(EncodeIds(ids));
    push.add_id_counts(static_cast<int32_t>(ids.size()));
    push.add_id_counts(0);
    push.set_gradient(Floats(gradient));
    push.set_pull_next(pull_next);
    return push;
  };
  const auto call = [&](const PushRequest& push, PushResponse* response) {
    server.ActAs("worker-" + std::to_string(push.worker_rank()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return server.stub_->Push(&context, push, response);
  };
  // Ids that are not this shard's are refused before anything is taken.
  PushResponse response;
  CHECK(Says(call(request(0, 0, BucketIds(1, 1), {1}, true), &response),
             grpc::StatusCode::INVALID_ARGUMENT, "embedding shard 4: table C1: id"));
  // Each step, worker 1 pushes rows ours[0] and ours[1] (gradients 4, 6) and worker 0
  // row ours[0] (2): the mean is (2 + 4) / 2 = 3 for ours[0] and 6 / 2 = 3 for ours[1]
  // (worker 0 adds zero), and SGD at 0.5 takes 1.5 from each row.
  const float initial0 = InitialEmbeddingValue(1, 0, ours[0], 0);
  const float initial1 = InitialEmbeddingValue(1, 0, ours[1], 0);
  // Step 0: the last push asks for other rows next (next_ids): it gets those.
  REQUIRE(call(request(1, 0, {ours[0], ours[1]}, {4, 6}, false), &response).ok());
  PushRequest asks_for_next = request(0, 0, {ours[0]}, {2}, true);
  asks_for_next.set_next_ids(EncodeIds({ours[1]}));
  asks_for_next.add_next_id_counts(1);
  asks_for_next.add_next_id_counts(0);
  REQUIRE(call(asks_for_next, &response).ok());
  CHECK(response.pulled());
  CHECK(response.applied_updates() == 1);
  CHECK(response.values() == Floats({initial1 - 1.5f}));
  // Step 1: the last push names no next rows: it gets the rows it pushed.
  REQUIRE(call(request(0, 1, {ours[0]}, {2}, false), &response).ok());
  REQUIRE(call(request(1, 1, {ours[0], ours[1]}, {4, 6}, true), &response).ok());
  CHECK(response.pulled());
  CHECK(response.applied_updates() == 2);
  CHECK(response.values() == Floats({initial0 - 1.5f - 1.5f, initial1 - 1.5f - 1.5f}));
}

TEST_CASE("the push handler called twice applies the update once") {
  ServerFixture server;
  server.Install();
  PushResponse first, second;
  REQUIRE(server.Push(4, 5, 1, 0, Floats({1, 1, 1}), &first).ok());
  REQUIRE(server.Push(4, 5, 1, 0, Floats({1, 1, 1}), &second).ok());
  CHECK_FALSE(first.duplicate());
  CHECK(second.duplicate());
  CHECK(second.applied_updates() == 1);
}

TEST_CASE("a push asked to pull next carries back exactly what a pull of the next step returns") {
  ServerFixture server;
  server.Install();
  PushResponse pushed;
  REQUIRE(
      server.PushAndPullNext(0, 0, Floats({0.5f, -0.5f, 0.0f}), absl::Seconds(5), &pushed).ok());
  CHECK_FALSE(pushed.duplicate());
  REQUIRE(pushed.pulled());
  PullResponse pulled;
  REQUIRE(server.Pull(4, 5, &pulled).ok());
  CHECK(pushed.values() == pulled.values());  // byte for byte
  std::vector<float> values(3);
  REQUIRE(DecodeFloatsExactly(pushed.values(), absl::MakeSpan(values), "values").ok());
  // Adam's first step moves a parameter by about lr = 0.001 against its gradient's sign.
  CHECK(values[0] == Approx(1.0 - 0.001).epsilon(1e-6));
  CHECK(values[1] == Approx(2.0 + 0.001).epsilon(1e-6));
  CHECK(values[2] == 3.0f);
}

TEST_CASE(
    "in sync mode the pull half waits for the other workers, and its timing out does not fail the "
    "push") {
  ServerFixture server;
  server.Install(TrainingMode::kSync);
  PushResponse first;
  REQUIRE(server.PushAndPullNext(0, 0, Floats({1, 1, 1}), absl::Milliseconds(600), &first).ok());
  CHECK_FALSE(first.duplicate());
  CHECK_FALSE(first.pulled());
  CHECK(first.values().empty());
  CHECK(first.pull_error().find("DEADLINE_EXCEEDED") != std::string::npos);

  PushResponse second;
  REQUIRE(server.PushAndPullNext(1, 0, Floats({1, 1, 1}), absl::Seconds(5), &second).ok());
  REQUIRE(second.pulled());
  std::vector<float> values(3);
  REQUIRE(DecodeFloatsExactly(second.values(), absl::MakeSpan(values), "values").ok());
  CHECK(values[0] == Approx(1.0 - 0.001).epsilon(1e-6));  // the step both pushes completed

  // The retried first push (its reply was lost, say) is a duplicate and now pulls.
  PushResponse retried;
  REQUIRE(server.PushAndPullNext(0, 0, Floats({1, 1, 1}), absl::Seconds(5), &retried).ok());
  CHECK(retried.duplicate());
  REQUIRE(retried.pulled());
  CHECK(retried.values() == second.values());
}

TEST_CASE(
    "one call serves every shard of the server, and the first bad part fails it naming that "
    "shard") {
  ServerFixture server;
  ParameterShardOptions options;
  options.mode = TrainingMode::kAsync;
  options.num_workers = 1;
  std::map<int, ServedShard> shards;
  for (int id : {4, 6}) {
    options.shard_id = id;
    options.range = id == 4 ? ParameterRange{0, 2} : ParameterRange{2, 5};
    shards[id].shard =
        std::make_shared<ParameterShard>(options, std::vector<float>(options.range.size(), 1.0f));
  }
  server.service_.InstallShards("ps-7", /*epoch=*/5, std::move(shards));

  auto push = [&](int64_t step, const std::vector<std::pair<int, std::string>>& parts,
                  PushShardsResponse* response) {
    PushShardsRequest request;
    for (const auto& [id, gradient] : parts) {
      PushRequest* part = request.add_shards();
      part->set_shard_id(id);
      part->set_epoch(5);
      part->set_step(step);
      part->set_gradient(gradient);
      part->set_pull_next(true);
    }
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return server.data_stub_->PushShards(&context, request, response);
  };
  PushShardsResponse pushed;
  REQUIRE(push(0, {{4, Floats({1, -1})}, {6, Floats({1, 1, -1})}}, &pushed).ok());
  REQUIRE(pushed.shards_size() == 2);
  std::vector<float> first(2), second(3);
  REQUIRE(pushed.shards(0).pulled());
  REQUIRE(pushed.shards(1).pulled());
  REQUIRE(DecodeFloatsExactly(pushed.shards(0).values(), absl::MakeSpan(first), "shard 4").ok());
  REQUIRE(DecodeFloatsExactly(pushed.shards(1).values(), absl::MakeSpan(second), "shard 6").ok());
  CHECK(first[0] < 1.0f);
  CHECK(first[1] > 1.0f);
  CHECK(second[2] > 1.0f);

  PullShardsRequest pull;
  for (int id : {4, 6}) {
    PullRequest* part = pull.add_shards();
    part->set_shard_id(id);
    part->set_epoch(5);
    part->set_step(1);
  }
  PullShardsResponse pulled;
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    REQUIRE(server.data_stub_->PullShards(&context, pull, &pulled).ok());
  }
  REQUIRE(pulled.shards_size() == 2);
  CHECK(pulled.shards(0).shard_id() == 4);
  CHECK(pulled.shards(0).values() == pushed.shards(0).values());
  CHECK(pulled.shards(1).values() == pushed.shards(1).values());

  // Step 1: shard 4's part is good, shard 6's has the wrong size. The call fails naming
  // shard 6; shard 4's part stands, and is a duplicate when the corrected call comes.
  PushShardsResponse refused;
  CHECK(Says(push(1, {{4, Floats({1, 1})}, {6, Floats({1})}}, &refused),
             grpc::StatusCode::INVALID_ARGUMENT, "gradient for shard 6"));
  PushShardsResponse retried;
  REQUIRE(push(1, {{4, Floats({1, 1})}, {6, Floats({1, 1, 1})}}, &retried).ok());
  CHECK(retried.shards(0).duplicate());
  CHECK_FALSE(retried.shards(1).duplicate());
  CHECK(retried.shards(0).applied_updates() == 2);
  CHECK(retried.shards(1).applied_updates() == 2);
}

TEST_CASE(
    "PushShards and PullShards read any protobuf encoding of their messages and refuse what is not "
    "one") {
  ServerFixture server;
  server.Install();
  CHECK(Says(server.RawCall(kPushShardsMethod, kGarbage), grpc::StatusCode::INVALID_ARGUMENT,
             "malformed PushShards request"));
  CHECK(Says(server.RawCall(kPullShardsMethod, kGarbage), grpc::StatusCode::INVALID_ARGUMENT,
             "malformed PullShards request"));
  // A part ending inside its gradient.
  std::string truncated;
  {
    google::protobuf::io::StringOutputStream stream(&truncated);
    google::protobuf::io::CodedOutputStream out(&stream);
    out.WriteTag(WireFormatLite::MakeTag(1, WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
    out.WriteVarint32(4);
    out.WriteTag(WireFormatLite::MakeTag(5, WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
    out.WriteVarint32(12);
    out.WriteRaw("ab", 2);
  }
  CHECK(Says(server.RawCall(kPushShardsMethod, truncated), grpc::StatusCode::INVALID_ARGUMENT,
             "malformed PushShards request"));

  // One part with its fields in reverse order, the gradient in the middle, and a field
  // this server does not know: protobuf reads that, so must the server.
  const std::string gradient = Floats({0.5f, -0.5f, 0.25f});
  std::string request;
  {
    std::string part;
    google::protobuf::io::StringOutputStream part_stream(&part);
    google::protobuf::io::CodedOutputStream out(&part_stream);
    WireFormatLite::WriteInt64(99, 12345, &out);  // unknown
    WireFormatLite::WriteEnum(7, WIRE_FLOAT32, &out);
    WireFormatLite::WriteBool(6, true, &out);  // pull_next
    WireFormatLite::WriteBytes(5, gradient, &out);
    WireFormatLite::WriteInt64(4, 0, &out);  // step
    WireFormatLite::WriteInt32(3, 1, &out);  // worker_rank
    WireFormatLite::WriteInt64(2, 5, &out);  // epoch
    WireFormatLite::WriteInt32(1, 4, &out);  // shard_id
    out.Trim();
    google::protobuf::io::StringOutputStream stream(&request);
    google::protobuf::io::CodedOutputStream request_out(&stream);
    WireFormatLite::WriteBytes(1, part, &request_out);
  }
  std::string reply_bytes;
  server.ActAs("worker-1");
  REQUIRE(server.RawCall(kPushShardsMethod, request, &reply_bytes).ok());
  PushShardsResponse reply;
  REQUIRE(reply.ParseFromString(reply_bytes));
  REQUIRE(reply.shards_size() == 1);
  CHECK_FALSE(reply.shards(0).duplicate());
  CHECK(reply.shards(0).applied_updates() == 1);
  REQUIRE(reply.shards(0).pulled());
  PullResponse pulled;
  REQUIRE(server.Pull(4, 5, &pulled).ok());
  CHECK(pulled.applied_updates() == 1);
  CHECK(reply.shards(0).values() == pulled.values());  // the values after worker 1's push
  std::vector<float> values(3);
  REQUIRE(DecodeFloatsExactly(pulled.values(), absl::MakeSpan(values), "values").ok());
  CHECK(values[0] < 1.0f);  // moved against a positive gradient
  CHECK(values[1] > 2.0f);
}

TEST_CASE("tensors travel in the request's encoding; the server keeps float32") {
  ServerFixture server;
  server.Install();
  PushRequest push;
  push.set_shard_id(4);
  push.set_epoch(5);
  push.set_encoding(WIRE_BFLOAT16);
  push.set_pull_next(true);
  AppendEncoded(WireDtype::kBfloat16, {0.5f, -0.25f, 0.0f}, push.mutable_gradient());
  PushResponse pushed;
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    REQUIRE(server.stub_->Push(&context, push, &pushed).ok());
  }
  REQUIRE(pushed.pulled());
  CHECK(pushed.values().size() == 3 * 2);  // bfloat16: two bytes a value

  PullResponse exact;
  REQUIRE(server.Pull(4, 5, &exact).ok());  // float32
  std::vector<float> full(3), half(3);
  REQUIRE(DecodeFloatsExactly(exact.values(), absl::MakeSpan(full), "float32").ok());
  REQUIRE(
      DecodeExactly(WireDtype::kBfloat16, pushed.values(), absl::MakeSpan(half), "bfloat16").ok());
  for (int i = 0; i < 3; ++i) {
    CHECK(half[i] == Bfloat16ToFloat(FloatToBfloat16(full[i])));
  }
  CHECK(full[0] != half[0]);  // 1 - 0.001 is not a bfloat16: the server kept more bits

  push.set_step(1);
  push.set_encoding(static_cast<WireEncoding>(7));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  CHECK(Says(server.stub_->Push(&context, push, &pushed), grpc::StatusCode::INVALID_ARGUMENT,
             "unknown tensor encoding 7"));
  push.set_encoding(WIRE_FLOAT16);
  push.set_gradient(std::string(5, '\0'));
  grpc::ClientContext again;
  again.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  CHECK(Says(server.stub_->Push(&again, push, &pushed), grpc::StatusCode::INVALID_ARGUMENT,
             "expected 3 float16 values (6 bytes), got 5 bytes"));
}

// A PushShards request of one part whose bytes are `part`.
std::string OnePart(const std::string& part) {
  std::string request;
  google::protobuf::io::StringOutputStream stream(&request);
  google::protobuf::io::CodedOutputStream out(&stream);
  WireFormatLite::WriteBytes(1, part, &out);
  out.Trim();
  return request;
}

// PushRequest fields in wire form: shard 4, epoch 5, worker 0, step 0.
std::string PushHeader() {
  std::string part;
  google::protobuf::io::StringOutputStream stream(&part);
  google::protobuf::io::CodedOutputStream out(&stream);
  WireFormatLite::WriteInt32(1, 4, &out);
  WireFormatLite::WriteInt64(2, 5, &out);
  WireFormatLite::WriteInt32(3, 0, &out);
  WireFormatLite::WriteInt64(4, 0, &out);
  out.Trim();
  return part;
}

std::string Varint(uint64_t value) {
  std::string bytes;
  google::protobuf::io::StringOutputStream stream(&bytes);
  google::protobuf::io::CodedOutputStream out(&stream);
  out.WriteVarint64(value);
  out.Trim();
  return bytes;
}

TEST_CASE(
    "strict with peers: lengths past the end, varints wider than their field, more parts than "
    "shards") {
  ServerFixture server;
  server.Install();
  server.ActAs("worker-0");
  const std::string gradient = Floats({0.5f, -0.5f, 0.25f});
  std::string good_part = PushHeader();
  {
    google::protobuf::io::StringOutputStream stream(&good_part);
    google::protobuf::io::CodedOutputStream out(&stream);
    WireFormatLite::WriteBytes(5, gradient, &out);
  }
  // A part that declares more bytes than the message has: refused, nothing applied.
  const std::string whole = OnePart(good_part);
  std::string long_part = std::string("\x0a") + Varint(good_part.size() + 1000) + good_part;
  CHECK(Says(server.RawCall(kPushShardsMethod, long_part), grpc::StatusCode::INVALID_ARGUMENT,
             "part 0 declares " + std::to_string(good_part.size() + 1000) +
                 " bytes but the message ends after " + std::to_string(good_part.size())));
  // A part length wider than 31 bits.
  CHECK(Says(server.RawCall(kPushShardsMethod,
                            std::string("\x0a") + Varint(uint64_t{1} << 40) + good_part),
             grpc::StatusCode::INVALID_ARGUMENT, "part 0 declares 1099511627776 bytes"));
  // A gradient length of 2^40: named as it is, not truncated to 32 bits.
  CHECK(Says(server.RawCall(kPushShardsMethod,
                            OnePart(PushHeader() + "\x2a" + Varint(uint64_t{1} << 40) + gradient)),
             grpc::StatusCode::INVALID_ARGUMENT,
             "malformed PushShards request: a gradient of 1099511627776 bytes"));
  // worker_rank (int32) holding 2^33.
  CHECK(Says(
      server.RawCall(kPushShardsMethod, OnePart(PushHeader() + "\x18" + Varint(uint64_t{1} << 33))),
      grpc::StatusCode::INVALID_ARGUMENT, "field 3 holds 8589934592, wider than its 32 bits"));
  // One part per shard, and no more parts than the server holds.
  CHECK(Says(server.RawCall(kPushShardsMethod, whole + whole), grpc::StatusCode::INVALID_ARGUMENT,
             "a push of 2 parts: ps-7 holds 1 shards"));
  PullShardsRequest many;
  for (int i = 0; i < 20000; ++i) {
    PullRequest* part = many.add_shards();
    part->set_shard_id(4);
    part->set_epoch(5);
  }
  CHECK(Says(server.RawCall(kPullShardsMethod, many.SerializeAsString()),
             grpc::StatusCode::INVALID_ARGUMENT, "a pull of 20000 parts: ps-7 holds 1 shards"));
  // Routed with a newer map, which may give this server more shards: refused as a newer
  // epoch is (the worker retries once the server has the map), not as malformed.
  PullShardsRequest newer;
  for (int shard : {4, 5}) {
    PullRequest* part = newer.add_shards();
    part->set_shard_id(shard);
    part->set_epoch(6);
  }
  CHECK(Says(server.RawCall(kPullShardsMethod, newer.SerializeAsString()),
             grpc::StatusCode::FAILED_PRECONDITION, "future epoch 6"));
  CHECK(server.service_.shards().at(4).shard->counters().applied_updates == 0);
  REQUIRE(server.RawCall(kPushShardsMethod, whole).ok());  // and it still serves
  CHECK(server.service_.shards().at(4).shard->counters().applied_updates == 1);
}

TEST_CASE("strict with peers: pulls served at once are bounded, past the bound refused") {
  ServerFixture server(/*max_waiting_pulls=*/2);
  server.Install(TrainingMode::kSync);
  // Two pulls of step 1 wait for the step (no push yet); a third is refused at once.
  std::vector<std::thread> waiting;
  std::atomic<int> finished{0};
  for (int i = 0; i < 2; ++i) {
    waiting.emplace_back([&] {
      PullResponse ignored;
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(3)));
      PullRequest request;
      request.set_shard_id(4);
      request.set_epoch(5);
      request.set_step(1);
      server.stub_->Pull(&context, request, &ignored);
      ++finished;
    });
  }
  const absl::Time give_up = absl::Now() + absl::Seconds(2);
  grpc::Status third;
  do {
    absl::SleepFor(absl::Milliseconds(50));
    PullResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(300)));
    PullRequest request;
    request.set_shard_id(4);
    request.set_epoch(5);
    request.set_step(1);
    third = server.stub_->Pull(&context, request, &response);
  } while (third.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED && absl::Now() < give_up);
  CHECK(Says(third, grpc::StatusCode::RESOURCE_EXHAUSTED, "already serves 2 pulls"));
  for (std::thread& thread : waiting) thread.join();
  CHECK(finished == 2);
  // Once they are done, pulls are served again.
  PullResponse response;
  CHECK(server.Pull(4, 5, &response).ok());
}

}  // namespace
}  // namespace paramserver
