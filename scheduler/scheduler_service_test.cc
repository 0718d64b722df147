// The scheduler's gRPC service in process, over real gRPC on 127.0.0.1: its long polls
// for a new map (GetClusterView with wait_ms), held without a thread each, answered as
// the map is published, at the end of their wait, or when the scheduler stops.
#include "scheduler/scheduler_service.h"

#include <atomic>
#include <thread>
#include <vector>

#include "catch2/catch.hpp"
#include "common/ops/metrics.h"
#include "common/rpc/map_wait.h"
#include "common/rpc/rpc_endpoints.h"
#include "common/security/refusal_log.h"
#include "scheduler/registry_testing.h"

namespace paramserver {
namespace {

// A formed cluster (2 servers, 2 workers, map epoch 1) behind the real service on a
// port of 127.0.0.1, and worker-0's client, presenting worker-0's credential.
struct ServedRegistry {
  ServedRegistry() {
    FormCluster(registry, 2, 2);
    ReportBackupsCopied(registry);
    absl::StatusOr<RunningServer> started = StartRpcServer("127.0.0.1:0", {&service});
    REQUIRE(started.ok());
    rpc = *std::move(started);
    auto credentials = std::make_shared<CallCredentials>("");
    credentials->SetIdentity("worker-0", TokenOf("w:0"));
    stub = Scheduler::NewStub(CreateChannel(absl::StrCat("127.0.0.1:", rpc.port), credentials));
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
// `wait`, on threads of their own; each records the epoch it got and how long its last
// call took. With `ask_again`, a call that ends without a newer map is made again (as a
// worker does), for at most 30 s.
struct ConcurrentPolls {
  ConcurrentPolls(Scheduler::Stub* stub, int polls, int64_t epoch, absl::Duration wait,
                  bool ask_again = false)
      : epochs(polls), took(polls) {
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
          took[i] = absl::Now() - start;
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
  absl::StatusOr<MapChange> lost = served.registry.DeclareDead("ps-1");
  REQUIRE(lost.ok());
  polls.Join();
  for (int i = 0; i < kPolls; ++i) {
    CHECK(polls.epochs[i] == lost->map.epoch());
    // The last call answered by the publication (or, made after it, at once), not at
    // the end of its wait.
    CHECK(polls.took[i] < wait);
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
  served.service.AnswerMapWaitsNow();
  polls.Join();
  for (int i = 0; i < kPolls; ++i) {
    CHECK(polls.epochs[i] == 1);  // the view as it is: the node asks again or stops
    CHECK(polls.took[i] < wait);
  }
  ConcurrentPolls later(served.stub.get(), 1, /*epoch=*/1, wait);
  later.Join();
  CHECK(later.epochs[0] == 1);
  CHECK(later.took[0] < wait);
  CHECK(served.service.map_waits_held() == 0);
}

}  // namespace
}  // namespace paramserver
