// The worker's side of the leases against a scripted scheduler: the examples of a lease
// in the epoch's order, waiting, done, and the answers it must not believe.
#include "worker/data_leaser.h"

#include <deque>
#include <numeric>

#include "catch2/catch.hpp"
#include "worker/batch_order.h"

namespace paramserver {
namespace {

LeaseDataResponse Grant(int epoch, int64_t begin, int64_t end, int64_t first_step) {
  LeaseDataResponse response;
  response.set_outcome(LEASE_GRANTED);
  response.mutable_lease()->set_lease_id(1);
  response.mutable_lease()->set_epoch(epoch);
  response.mutable_lease()->set_begin(begin);
  response.mutable_lease()->set_end(end);
  response.mutable_lease()->set_first_step(first_step);
  return response;
}

LeaseDataResponse Outcome(LeaseOutcome outcome) {
  LeaseDataResponse response;
  response.set_outcome(outcome);
  response.set_retry_after_ms(10);
  return response;
}

// Answers from `script` in order, recording the requests.
struct ScriptedScheduler {
  std::deque<absl::StatusOr<LeaseDataResponse>> script;
  std::vector<LeaseDataRequest> requests;
  LeaseDataCall call() {
    return [this](const LeaseDataRequest& request) -> absl::StatusOr<LeaseDataResponse> {
      requests.push_back(request);
      REQUIRE(!script.empty());
      absl::StatusOr<LeaseDataResponse> next = script.front();
      script.pop_front();
      return next;
    };
  }
};

TEST_CASE("a lease is the epoch's order between its positions; waits and outages ridden out") {
  ScriptedScheduler scheduler;
  scheduler.script = {Outcome(LEASE_WAIT), absl::UnavailableError("restarting"),
                      Grant(1, 20, 40, 7), Outcome(LEASE_DONE)};
  DataLeaser leaser(scheduler.call(), 45, 10, /*seed=*/3, /*shuffle=*/true);
  absl::StatusOr<std::optional<LeasedChunk>> chunk = leaser.Next(7, nullptr, absl::Seconds(30));
  REQUIRE(chunk.ok());
  REQUIRE(chunk->has_value());
  const std::vector<int64_t> order = EpochExampleOrder({0, 45}, 1, 3, true);
  CHECK((*chunk)->examples == std::vector<int64_t>(order.begin() + 20, order.begin() + 40));
  CHECK((*chunk)->batches == 2);
  REQUIRE(scheduler.requests.size() == 3);
  CHECK(scheduler.requests[0].example_count() == 45);
  CHECK(scheduler.requests[0].batch_size() == 10);
  CHECK(scheduler.requests[2].next_step() == 7);
  absl::StatusOr<std::optional<LeasedChunk>> done = leaser.Next(9, nullptr, absl::Seconds(30));
  REQUIRE(done.ok());
  CHECK_FALSE(done->has_value());
}

TEST_CASE("a lease the data cannot hold, or one behind the worker, is an error") {
  ScriptedScheduler scheduler;
  scheduler.script = {Grant(0, 40, 50, 0), Grant(0, 0, 10, 2), Grant(0, 5, 15, 5),
                      absl::PermissionDeniedError("not you")};
  DataLeaser leaser(scheduler.call(), 45, 10, 0, false);
  CHECK(leaser.Next(0, nullptr, absl::Seconds(1)).status().code() ==
        absl::StatusCode::kInternal);  // past the last whole batch (40)
  CHECK(leaser.Next(5, nullptr, absl::Seconds(1)).status().code() ==
        absl::StatusCode::kInternal);  // starts before the worker's next step
  CHECK(leaser.Next(5, nullptr, absl::Seconds(1)).status().code() ==
        absl::StatusCode::kInternal);  // not whole batches
  CHECK(leaser.Next(5, nullptr, absl::Seconds(1)).status().code() ==
        absl::StatusCode::kPermissionDenied);
}

TEST_CASE("a stop request ends the wait") {
  ScriptedScheduler scheduler;
  for (int i = 0; i < 3; ++i) scheduler.script.push_back(Outcome(LEASE_WAIT));
  std::atomic<bool> stop{false};
  int calls = 0;
  DataLeaser leaser(
      [&](const LeaseDataRequest& request) {
        if (++calls == 2) stop.store(true);
        return scheduler.call()(request);
      },
      45, 10, 0, false);
  CHECK(leaser.Next(0, &stop, absl::Seconds(30)).status().code() == absl::StatusCode::kCancelled);
  CHECK(calls == 2);
}

}  // namespace
}  // namespace paramserver
