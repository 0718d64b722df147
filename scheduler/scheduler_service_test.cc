// The scheduler's gRPC service in process, over real gRPC on 127.0.0.1: its long polls
// for a new map (GetClusterView with wait_ms), held without a thread each, answered as
// the map is published, at the end of their wait, or when the scheduler stops; a node's
// heartbeats on one stream (HeartbeatStream, SchedulerClient), its refusals, its end.
#include "scheduler/scheduler_service.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"
#include "common/ops/metrics.h"
#include "common/rpc/heartbeat_stream.h"
#include "common/rpc/map_wait.h"
#include "common/rpc/rpc_endpoints.h"
#include "common/rpc/scheduler_client.h"
#include "common/security/refusal_log.h"
#include "scheduler/registry_testing.h"

namespace paramserver {
namespace {

// A scheduler stub for 127.0.0.1:`port` presenting the credential of FormCluster's
// worker `rank` (worker-<rank>, registered from w:<rank>).
std::unique_ptr<Scheduler::Stub> WorkerStub(int port, int rank) {
  auto credentials = std::make_shared<CallCredentials>("");
  credentials->SetIdentity(absl::StrCat("worker-", rank), TokenOf(absl::StrCat("w:", rank)));
  return Scheduler::NewStub(CreateChannel(absl::StrCat("127.0.0.1:", port), credentials));
}

// A formed cluster (2 servers, 2 workers, map epoch 1) behind the real service on a
// port of 127.0.0.1 (`port`, or one free), and worker-0's client, presenting worker-0's
// credential.
struct ServedRegistry {
  explicit ServedRegistry(int port = 0) {
    FormCluster(registry, 2, 2);
    ReportBackupsCopied(registry);
    absl::StatusOr<RunningServer> started =
        StartRpcServer(absl::StrCat("127.0.0.1:", port), {&service});
    REQUIRE(started.ok());
    rpc = *std::move(started);
    stub = WorkerStub(rpc.port, 0);
  }
  ~ServedRegistry() {
    service.AnswerMapWaitsNow();
    rpc.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  // Waits (at most 30 s) until the service holds `count` long polls.
  bool AwaitHeld(int count) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (service.map_waits_held() < count && absl::Now() < deadline)
      absl::SleepFor(absl::Milliseconds(5));
    return service.map_waits_held() == count;
  }

  ClusterRegistry registry{Options(TrainingMode::kSync, 2, 2, 4)};
  MetricsRegistry metrics;
  RefusalLog refusals{&metrics, "refused_total"};
  SchedulerServiceImpl service{&registry, "", &refusals, [](const JobResult&) {}, [](MapChange) {}};
  RunningServer rpc;
  std::unique_ptr<Scheduler::Stub> stub;  // worker-0's
};

// `polls` long polls of worker-0 for a map above epoch `epoch`, each waiting at most
// `wait`, on threads of their own; each records the epoch it got, how long its last
// call took and when it was answered. With `ask_again`, a call that ends without a
// newer map is made again (as a worker does), for at most 30 s.
struct ConcurrentPolls {
  ConcurrentPolls(Scheduler::Stub* stub, int polls, int64_t epoch, absl::Duration wait,
                  bool ask_again = false)
      : epochs(polls), took(polls), answered_at(polls) {
    for (int i = 0; i < polls; ++i) {
      threads.emplace_back([=] {
        const absl::Time give_up = absl::Now() + absl::Seconds(30);
        do {
          GetClusterViewRequest request;
          request.set_node_name("worker-0");
          request.set_wait_for_epoch_above(epoch);
          request.set_wait_ms(static_cast<int32_t>(absl::ToInt64Milliseconds(wait)));
          grpc::ClientContext context;
          context.set_deadline(absl::ToChronoTime(absl::Now() + wait + absl::Seconds(30)));
          ClusterView view;
          const absl::Time start = absl::Now();
          const grpc::Status answered = stub->GetClusterView(&context, request, &view);
          answered_at[i] = absl::Now();
          took[i] = answered_at[i] - start;
          epochs[i] = answered.ok() ? view.shard_map().epoch() : -1;
        } while (ask_again && epochs[i] != -1 && epochs[i] <= epoch && absl::Now() < give_up);
        ++finished;
      });
    }
  }
  // Joins every thread: also when a check throws first.
  ~ConcurrentPolls() { Join(); }
  void Join() {
    for (std::thread& thread : threads) {
      if (thread.joinable()) thread.join();
    }
  }
  std::vector<int64_t> epochs;
  std::vector<absl::Duration> took;
  std::vector<absl::Time> answered_at;
  std::atomic<int> finished{0};
  std::vector<std::thread> threads;
};

TEST_CASE("held long polls are answered as a new map is published, well before their wait ends") {
  ServedRegistry served;
  constexpr int kPolls = 32;
  const absl::Duration wait = absl::Milliseconds(kMaxMapWaitMs);
  ConcurrentPolls polls(served.stub.get(), kPolls, /*epoch=*/1, wait, /*ask_again=*/true);
  REQUIRE(served.AwaitHeld(kPolls));  // every call held, none answered: no map above 1
  CHECK(polls.finished == 0);
  const absl::Time publishing = absl::Now();
  absl::StatusOr<MapChange> lost = served.registry.DeclareDead("ps-1");
  REQUIRE(lost.ok());
  polls.Join();
  for (int i = 0; i < kPolls; ++i) {
    CHECK(polls.epochs[i] == lost->map.epoch());
    // The last call answered by the publication (or, made after it, at once), not at
    // the end of its wait: a call held to its end would be answered up to a whole wait
    // after the publication (all of it less the time the polls took to be held).
    const absl::Time answerable = std::max(publishing, polls.answered_at[i] - polls.took[i]);
    CHECK(polls.answered_at[i] - answerable < wait / 2);
  }
  CHECK(served.service.map_waits_held() == 0);
}

TEST_CASE("a long poll for a map the node lacks is answered at once; with no new map, at its end") {
  ServedRegistry served;
  ConcurrentPolls lacking(served.stub.get(), 1, /*epoch=*/0, absl::Milliseconds(kMaxMapWaitMs));
  lacking.Join();
  CHECK(lacking.epochs[0] == 1);
  CHECK(lacking.took[0] < absl::Milliseconds(kMaxMapWaitMs));
  const absl::Duration wait = absl::Milliseconds(100);
  ConcurrentPolls unchanged(served.stub.get(), 3, /*epoch=*/1, wait);
  unchanged.Join();
  for (int i = 0; i < 3; ++i) {
    CHECK(unchanged.epochs[i] == 1);
    CHECK(unchanged.took[i] >= wait);  // never before its end
  }
}

TEST_CASE("stopping answers the held long polls at once, and later ones are not held") {
  ServedRegistry served;
  constexpr int kPolls = 8;
  const absl::Duration wait = absl::Milliseconds(kMaxMapWaitMs);
  ConcurrentPolls polls(served.stub.get(), kPolls, /*epoch=*/1, wait);
  REQUIRE(served.AwaitHeld(kPolls));
  const absl::Time stopping = absl::Now();
  served.service.AnswerMapWaitsNow();
  polls.Join();
  for (int i = 0; i < kPolls; ++i) {
    CHECK(polls.epochs[i] == 1);  // the view as it is: the node asks again or stops
    // Answered as the scheduler stopped, not at the end of its wait (see above).
    CHECK(polls.answered_at[i] - stopping < wait / 2);
  }
  ConcurrentPolls later(served.stub.get(), 1, /*epoch=*/1, wait);
  later.Join();
  CHECK(later.epochs[0] == 1);
  CHECK(later.took[0] < wait);
  CHECK(served.service.map_waits_held() == 0);
}

HeartbeatRequest BeatOf(const std::string& node_name, int64_t step) {
  HeartbeatRequest request;
  request.set_node_name(node_name);
  request.mutable_progress()->set_step(step);
  return request;
}

TEST_CASE(
    "a finished worker whose view says the job finished has heard it: the scheduler ends "
    "without waiting for its next beat") {
  ServedRegistry served;
  for (const char* name : {"worker-0", "worker-1"}) {
    ReportFinishedRequest finished;
    finished.set_node_name(name);
    finished.set_steps(100);
    REQUIRE(served.registry.ReportFinished(finished, kStart).ok());
  }
  // worker-1 waits for worker-0's result (it would evaluate in a lost worker-0's place).
  std::unique_ptr<Scheduler::Stub> worker_one = WorkerStub(served.rpc.port, 1);
  auto view_of_worker_one = [&] {
    GetClusterViewRequest request;
    request.set_node_name("worker-1");
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    ClusterView view;
    REQUIRE(worker_one->GetClusterView(&context, request, &view).ok());
    return view;
  };
  CHECK_FALSE(view_of_worker_one().job_finished());  // no result yet: nothing heard
  ReportResultRequest result;
  result.set_node_name("worker-0");
  result.set_test_accuracy(0.87);
  REQUIRE(served.registry.ReportResult(result).ok());
  for (const char* name : {"ps-0", "ps-1"}) {
    HeartbeatRequest beat;
    beat.set_node_name(name);
    REQUIRE(served.registry.Heartbeat(beat, kStart)->job_finished());
  }
  CHECK_FALSE(served.registry.all_servers_told_to_stop());
  CHECK(view_of_worker_one().job_finished());
  CHECK(served.registry.all_servers_told_to_stop());
}

TEST_CASE("heartbeats on one stream are answered in turn, each as a call of its own would be") {
  ServedRegistry served;
  HeartbeatStream stream(served.stub.get(), absl::Seconds(10), "heartbeat");
  const int64_t epoch = served.registry.View().shard_map().epoch();
  for (int step = 1; step <= 3; ++step) {
    absl::StatusOr<HeartbeatResponse> answer = stream.Beat(BeatOf("worker-0", step));
    REQUIRE(answer.ok());
    CHECK(answer->epoch() == epoch);
    CHECK(stream.open());
  }
  CHECK(served.service.streamed_heartbeats() == 3);
  CHECK(served.service.heartbeat_streams_opened() == 1);
}

TEST_CASE("a stream's beat naming another node is refused and ends it; the next opens another") {
  ServedRegistry served;
  HeartbeatStream stream(served.stub.get(), absl::Seconds(10), "heartbeat");
  REQUIRE(stream.Beat(BeatOf("worker-0", 1)).ok());
  absl::StatusOr<HeartbeatResponse> posing = stream.Beat(BeatOf("worker-1", 1));
  CHECK(absl::IsPermissionDenied(posing.status()));
  CHECK(posing.status().message().find("heartbeat") != absl::string_view::npos);
  CHECK_FALSE(stream.open());
  CHECK(stream.Beat(BeatOf("worker-0", 2)).ok());
  CHECK(served.service.heartbeat_streams_opened() == 2);
  CHECK(served.service.streamed_heartbeats() == 2);
}

TEST_CASE(
    "a stream opens only with a node credential and a deadline within the scheduler's bound") {
  ServedRegistry served;
  auto anonymous =
      Scheduler::NewStub(CreateChannel(absl::StrCat("127.0.0.1:", served.rpc.port), nullptr));
  HeartbeatStream stranger(anonymous.get(), absl::Seconds(10), "heartbeat");
  CHECK(absl::IsUnauthenticated(stranger.Beat(BeatOf("worker-0", 1)).status()));
  HeartbeatStream endless(served.stub.get(), absl::Seconds(10), "heartbeat",
                          /*stream_lifetime=*/SchedulerServiceImpl::kMaxHeartbeatStreamLife);
  absl::StatusOr<HeartbeatResponse> refused = endless.Beat(BeatOf("worker-0", 1));
  CHECK(absl::IsInvalidArgument(refused.status()));
  CHECK(refused.status().message().find("deadline within") != absl::string_view::npos);
  CHECK(served.service.heartbeat_streams_opened() == 0);
  CHECK(served.service.streamed_heartbeats() == 0);
}

TEST_CASE(
    "a node declared dead is refused on its stream as on a call; a stopping scheduler ends "
    "streams and opens none") {
  ServedRegistry served;
  HeartbeatStream stream(served.stub.get(), absl::Seconds(10), "heartbeat");
  REQUIRE(stream.Beat(BeatOf("worker-0", 1)).ok());
  REQUIRE(served.registry.DeclareDead("worker-0").ok());
  absl::StatusOr<HeartbeatResponse> dead = stream.Beat(BeatOf("worker-0", 2));
  CHECK(absl::IsFailedPrecondition(dead.status()));
  CHECK(dead.status().message().find("declared dead") != absl::string_view::npos);
  CHECK_FALSE(stream.open());

  ServedRegistry stopping;
  HeartbeatStream open(stopping.stub.get(), absl::Seconds(10), "heartbeat");
  REQUIRE(open.Beat(BeatOf("worker-0", 1)).ok());
  stopping.service.AnswerMapWaitsNow();
  absl::StatusOr<HeartbeatResponse> ended = open.Beat(BeatOf("worker-0", 2));
  CHECK(absl::IsUnavailable(ended.status()));
  CHECK(ended.status().message().find("stopping") != absl::string_view::npos);
  CHECK(absl::IsUnavailable(open.Beat(BeatOf("worker-0", 3)).status()));
  CHECK(stopping.service.streamed_heartbeats() == 1);
}

TEST_CASE("a stream older than its lifetime is closed and another opened, with no beat lost") {
  ServedRegistry served;
  // Long enough that beats 2 and 3 come within one lifetime, on a loaded machine too.
  const absl::Duration lifetime = absl::Seconds(1);
  HeartbeatStream stream(served.stub.get(), absl::Seconds(10), "heartbeat", lifetime);
  REQUIRE(stream.Beat(BeatOf("worker-0", 1)).ok());
  absl::SleepFor(lifetime + absl::Milliseconds(50));
  REQUIRE(stream.Beat(BeatOf("worker-0", 2)).ok());
  CHECK(served.service.heartbeat_streams_opened() == 2);
  REQUIRE(stream.Beat(BeatOf("worker-0", 3)).ok());
  CHECK(served.service.heartbeat_streams_opened() == 2);
  CHECK(served.service.streamed_heartbeats() == 3);
}

TEST_CASE("a stream that broke while idle (the scheduler restarted) is replaced within the beat") {
  auto first = std::make_unique<ServedRegistry>();
  const int port = first->rpc.port;
  std::unique_ptr<Scheduler::Stub> stub = WorkerStub(port, 0);
  HeartbeatStream stream(stub.get(), absl::Seconds(10), "heartbeat");
  REQUIRE(stream.Beat(BeatOf("worker-0", 1)).ok());
  first.reset();  // its server stopped: the idle stream is cut
  ServedRegistry second(port);
  absl::StatusOr<HeartbeatResponse> answer = stream.Beat(BeatOf("worker-0", 2));
  REQUIRE(answer.ok());  // not the broken stream's UNAVAILABLE or CANCELLED
  CHECK(answer->epoch() == second.registry.View().shard_map().epoch());
  CHECK(second.service.heartbeat_streams_opened() == 1);
  CHECK(second.service.streamed_heartbeats() == 1);
  CHECK(stream.open());
}

// A scheduler that reads heartbeats on a stream and never answers them.
class SilentScheduler final : public Scheduler::Service {
 public:
  grpc::Status HeartbeatStream(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<HeartbeatResponse, HeartbeatRequest>* stream) override {
    HeartbeatRequest request;
    while (stream->Read(&request)) ++read_;
    return grpc::Status::OK;
  }
  std::atomic<int> read_{0};
};

// A scheduler older than heartbeat streams: a call a heartbeat.
class UnaryOnlyScheduler final : public Scheduler::Service {
 public:
  grpc::Status Heartbeat(grpc::ServerContext*, const HeartbeatRequest* request,
                         HeartbeatResponse* response) override {
    if (request->node_name() == "worker-0") ++calls_;
    response->set_epoch(7);
    return grpc::Status::OK;
  }
  std::atomic<int> calls_{0};
};

TEST_CASE("a beat not answered within its timeout is DEADLINE_EXCEEDED and its stream cancelled") {
  SilentScheduler silent;
  absl::StatusOr<RunningServer> rpc = StartRpcServer("127.0.0.1:0", {&silent});
  REQUIRE(rpc.ok());
  auto stub = Scheduler::NewStub(CreateChannel(absl::StrCat("127.0.0.1:", rpc->port), nullptr));
  HeartbeatStream stream(stub.get(), absl::Milliseconds(300), "heartbeat");
  const absl::Time start = absl::Now();
  absl::StatusOr<HeartbeatResponse> late = stream.Beat(BeatOf("worker-0", 1));
  CHECK(absl::IsDeadlineExceeded(late.status()));
  CHECK(absl::Now() - start < absl::Seconds(5));  // the beat's timeout, and the cancel
  CHECK_FALSE(stream.open());
  const absl::Time read_by = absl::Now() + absl::Seconds(10);
  while (silent.read_ < 1 && absl::Now() < read_by) absl::SleepFor(absl::Milliseconds(5));
  CHECK(silent.read_ == 1);
  rpc->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

TEST_CASE(
    "SchedulerClient heartbeats on one stream, and a call a beat to a scheduler without "
    "streams") {
  ServedRegistry served;
  auto credentials = std::make_shared<CallCredentials>("");
  credentials->SetIdentity("worker-0", TokenOf("w:0"));
  SchedulerClient client(absl::StrCat("127.0.0.1:", served.rpc.port), absl::Seconds(10),
                         credentials);
  for (int step = 1; step <= 3; ++step) REQUIRE(client.Heartbeat(BeatOf("worker-0", step)).ok());
  CHECK(served.service.heartbeat_streams_opened() == 1);
  CHECK(served.service.streamed_heartbeats() == 3);

  UnaryOnlyScheduler older;
  absl::StatusOr<RunningServer> rpc = StartRpcServer("127.0.0.1:0", {&older});
  REQUIRE(rpc.ok());
  SchedulerClient old_client(absl::StrCat("127.0.0.1:", rpc->port), absl::Seconds(10), nullptr);
  for (int step = 1; step <= 2; ++step) {
    absl::StatusOr<HeartbeatResponse> answer = old_client.Heartbeat(BeatOf("worker-0", step));
    REQUIRE(answer.ok());
    CHECK(answer->epoch() == 7);
  }
  CHECK(older.calls_ == 2);
  rpc->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

}  // namespace
}  // namespace paramserver
