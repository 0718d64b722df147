// Bad requests against a real gRPC server on 127.0.0.1: each gets a clear status, and
// the server goes on serving good ones.
#include <atomic>
#include <limits>
#include <thread>

#include "ps/service_testing.h"

namespace paramserver {
namespace {

using namespace service_testing;  // NOLINT: the shared fixture of these tests

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

  // A message that is not a PushShardsRequest at all.
  CHECK_FALSE(server.RawCall(kPushShardsMethod, kGarbage).ok());

  PushResponse pushed;
  REQUIRE(server.Push(4, 5, 0, 0, good, &pushed).ok());
  CHECK_FALSE(pushed.duplicate());
  PullResponse pulled;
  REQUIRE(server.Pull(4, 5, &pulled).ok());
  CHECK(pulled.applied_updates() == 1);
  std::vector<float> values(3);
  REQUIRE(DecodeFloatsExactly(pulled.values(), absl::MakeSpan(values), "values").ok());
  CHECK(values[0] < 1.0f);  // moved against a positive gradient
  // The 8 refusals above and the garbage message: the batched call's own parser refuses
  // it (and counts it), where gRPC's protobuf parsing dropped it uncounted.
  CHECK(server.service_.rejected_requests() == 9);
}

TEST_CASE(
    "a call routed with an older map reaches a shard served as it was then; one routed before "
    "is refused as stale") {
  ServerFixture server;
  // Kept as it was since epoch 3 (the maps since added a backup, say).
  server.Install(TrainingMode::kAsync, /*routed_since=*/3);
  const std::string gradient = Floats({0.1f, 0.2f, 0.3f});
  PushResponse pushed;
  CHECK(server.Push(4, 3, 0, 0, gradient, &pushed).ok());
  CHECK(server.Push(4, 4, 1, 0, gradient).ok());
  CHECK(Says(server.Push(4, 2, 0, 1, gradient), grpc::StatusCode::FAILED_PRECONDITION,
             "stale epoch 2 for shard 4 on ps-7: the current epoch is 5"));
  CHECK(Says(server.Push(4, 6, 0, 1, gradient), grpc::StatusCode::FAILED_PRECONDITION,
             "future epoch 6"));
  PullResponse pulled;
  REQUIRE(server.Pull(4, 3, &pulled).ok());
  CHECK(pulled.applied_updates() == 2);  // both pushes applied, once each

  // A shard given its routed_since by nobody serves the installed epoch only.
  server.Install();
  CHECK(Says(server.Push(4, 4, 0, 0, gradient), grpc::StatusCode::FAILED_PRECONDITION,
             "stale epoch 4 for shard 4 on ps-7: the current epoch is 5"));
}

TEST_CASE(
    "a call routed with a map the server has yet to install waits for it a little, rather than "
    "being refused") {
  ServerFixture server;
  server.Install();  // epoch 5
  std::thread installer([&] {
    absl::SleepFor(absl::Milliseconds(50));
    server.service_.InstallShards("ps-7", 6, server.service_.shards());
  });
  const grpc::Status pushed = server.Push(4, 6, 0, 0, Floats({0.1f, 0.2f, 0.3f}));
  installer.join();
  CHECK(pushed.ok());
  // A map that does not come: refused as routed with a future map, after the wait.
  CHECK(Says(server.Push(4, 7, 0, 1, Floats({0.1f, 0.2f, 0.3f})),
             grpc::StatusCode::FAILED_PRECONDITION, "future epoch 7 for shard 4 on ps-7"));
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
  const auto set = [&](int worker, const std::string& values, SetInitialValuesResponse* response,
                       int64_t epoch = 5) {
    f.ActAs("worker-" + std::to_string(worker));
    SetInitialValuesRequest request;
    request.set_shard_id(4);
    request.set_epoch(epoch);
    request.set_worker_rank(worker);
    request.set_values(values);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return f.stub_->SetInitialValues(&context, request, response);
  };
  SetInitialValuesResponse response;
  // Routed with a map this server has not installed (who may set them is in it): answered
  // as any call of a future map is (refresh and retry), not refused by the map served now.
  const grpc::Status ahead = set(0, Floats({1, 2, 3}), &response, /*epoch=*/6);
  CHECK(ahead.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(absl::StrContains(ahead.error_message(), "future epoch 6 for shard 4 on ps-7"));
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
      PullOneShard(*server.data_stub_, &context, request, &ignored);
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
    third = PullOneShard(*server.data_stub_, &context, request, &response);
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
