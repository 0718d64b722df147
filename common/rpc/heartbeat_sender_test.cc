// HeartbeatSender against a scheduler that never answers: the outage policy fires once,
// after its limit and not before, with a line that says for how long and why.
#include "common/rpc/heartbeat_sender.h"

#include <atomic>
#include <string>

#include "absl/synchronization/mutex.h"
#include "catch2/catch.hpp"

namespace paramserver {
namespace {

TEST_CASE("a scheduler that does not answer is given up on once, after the outage limit") {
  // Port 1 on loopback: nothing listens, every heartbeat fails at once.
  SchedulerClient scheduler("127.0.0.1:1", absl::Milliseconds(200));
  absl::Mutex mu;
  int calls = 0;
  std::string message;
  absl::Time fired_at;
  const absl::Time started = absl::Now();
  {
    HeartbeatSender sender(
        &scheduler, "worker-0", absl::Milliseconds(20), [] { return HeartbeatRequest(); },
        [](const HeartbeatResponse&) {}, nullptr,
        SchedulerOutagePolicy{absl::Milliseconds(400), [&](const absl::Status& why) {
                                absl::MutexLock lock(&mu);
                                ++calls;
                                message = std::string(why.message());
                                fired_at = absl::Now();
                                CHECK(why.code() == absl::StatusCode::kUnavailable);
                              }});
    absl::SleepFor(absl::Milliseconds(1500));
  }
  absl::MutexLock lock(&mu);
  CHECK(calls == 1);
  CHECK(fired_at - started >= absl::Milliseconds(400));
  CHECK(message.find(
            "the scheduler at 127.0.0.1:1 has not answered for 0 s (this node's limit: 0 s, from "
            "cluster.recovery_timeout_ms); the last error: UNAVAILABLE") == 0);
}

}  // namespace
}  // namespace paramserver
