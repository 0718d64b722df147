#include "worker/recovery.h"

#include <string>
#include <vector>

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

// Records how the recovery asked for the map: "refresh", or "await <ms>" for a long
// poll of that many milliseconds; every answer says the map is unchanged until
// `changed_after` answers have been given.
class MapRequestRecorder final : public PsClient {
 public:
  absl::Status Pull(const StepPull&) override { return absl::OkStatus(); }
  absl::StatusOr<bool> Push(const StepPush&) override { return false; }
  absl::StatusOr<int64_t> StartStep() override { return 0; }
  absl::StatusOr<ShardMapUpdate> RefreshShardMap() override {
    calls.push_back("refresh");
    return Answer();
  }
  absl::StatusOr<ShardMapUpdate> AwaitShardMapChange(absl::Duration wait) override {
    calls.push_back("await " + std::to_string(absl::ToInt64Milliseconds(wait)));
    if (scheduler_away) return absl::UnavailableError("the scheduler is restarting");
    return Answer();
  }
  std::vector<std::string> calls;
  int changed_after = 1 << 30;
  bool self_active = true;      // false: the map counts this worker dead
  bool scheduler_away = false;  // true: every wait fails at once

 private:
  ShardMapUpdate Answer() {
    ShardMapUpdate update;
    update.self_active = self_active;
    update.epoch_changed = static_cast<int>(calls.size()) > changed_after;
    update.epoch = update.epoch_changed ? 2 : 1;
    return update;
  }
};

TEST_CASE("a worker whose server is unreachable waits on the scheduler for the new map") {
  MapRequestRecorder ps;
  ps.changed_after = 2;
  std::optional<absl::Time> give_up_at;
  const absl::Status unreachable = absl::UnavailableError("ps-1 (127.0.0.1:1): connection refused");
  // The first attempt refreshes at once (a planned move's map is already published).
  absl::StatusOr<ShardMapUpdate> update =
      WaitForRecovery(&ps, unreachable, 7, absl::Seconds(30), &give_up_at);
  REQUIRE(update.ok());
  CHECK_FALSE(update->epoch_changed);
  // Later ones wait on the scheduler for a map other than this worker's, 200 ms at a
  // time, and return the new map when it comes.
  update = WaitForRecovery(&ps, unreachable, 7, absl::Seconds(30), &give_up_at);
  REQUIRE(update.ok());
  CHECK_FALSE(update->epoch_changed);
  update = WaitForRecovery(&ps, unreachable, 7, absl::Seconds(30), &give_up_at);
  REQUIRE(update.ok());
  CHECK(update->epoch_changed);
  CHECK(ps.calls == std::vector<std::string>{"refresh", "await 200", "await 200"});
}

TEST_CASE("a refused worker waits for the map that takes it back; a slow pull polls") {
  MapRequestRecorder refused;
  refused.self_active = false;  // declared dead: its heartbeats register it again
  std::optional<absl::Time> give_up_at;
  const absl::Status denied = absl::PermissionDeniedError("worker-1 was declared dead");
  for (int attempt = 0; attempt < 2; ++attempt) {
    REQUIRE(WaitForRecovery(&refused, denied, 3, absl::Seconds(30), &give_up_at).ok());
  }
  CHECK(refused.calls == std::vector<std::string>{"refresh", "await 200"});
  // A pull that timed out waits for slower workers, not for a map: polled every 50 ms.
  MapRequestRecorder slow;
  give_up_at.reset();
  const absl::Status timed_out = absl::DeadlineExceededError("pull: step 3 not complete");
  for (int attempt = 0; attempt < 2; ++attempt) {
    REQUIRE(WaitForRecovery(&slow, timed_out, 3, absl::Seconds(30), &give_up_at).ok());
  }
  CHECK(slow.calls == std::vector<std::string>{"refresh", "refresh"});
}

TEST_CASE("a wait that fails at once still spaces the worker's attempts") {
  MapRequestRecorder ps;
  ps.scheduler_away = true;
  std::optional<absl::Time> give_up_at;
  const absl::Status unreachable = absl::UnavailableError("connection refused");
  REQUIRE(WaitForRecovery(&ps, unreachable, 1, absl::Seconds(30), &give_up_at).ok());
  const absl::Time start = absl::Now();
  for (int attempt = 0; attempt < 3; ++attempt) {
    // "Try again" (an unreachable scheduler is ridden out), but not at once.
    REQUIRE(WaitForRecovery(&ps, unreachable, 1, absl::Seconds(30), &give_up_at).ok());
  }
  CHECK(absl::Now() - start >= absl::Milliseconds(150));  // 3 attempts, 50 ms apart at least
  CHECK(ps.calls.size() == 4);
}

TEST_CASE("the wait for a new map ends by the recovery's deadline") {
  MapRequestRecorder ps;
  std::optional<absl::Time> give_up_at;
  const absl::Status unreachable = absl::UnavailableError("connection refused");
  REQUIRE(WaitForRecovery(&ps, unreachable, 1, absl::Milliseconds(120), &give_up_at).ok());
  REQUIRE(WaitForRecovery(&ps, unreachable, 1, absl::Milliseconds(120), &give_up_at).ok());
  REQUIRE(ps.calls.size() == 2);
  REQUIRE(ps.calls[1].rfind("await ", 0) == 0);
  const int waited_ms = std::stoi(ps.calls[1].substr(6));
  CHECK(waited_ms <= 120);
  CHECK(waited_ms > 0);
  // Past it: the failure, given up.
  absl::SleepFor(absl::Milliseconds(130));
  const absl::StatusOr<ShardMapUpdate> gave_up =
      WaitForRecovery(&ps, unreachable, 1, absl::Milliseconds(120), &give_up_at);
  CHECK(gave_up.status().code() == absl::StatusCode::kUnavailable);
  CHECK(gave_up.status().message().find("gave up after") == 0);
}

}  // namespace
}  // namespace paramserver
