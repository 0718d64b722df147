#include "tests/joined_member.h"

#include "catch2/catch.hpp"

namespace paramserver {

std::unique_ptr<JoinedMember> JoinAsLastWorker(const std::string& scheduler_address,
                                               const std::string& cluster_token, int workers_before,
                                               absl::Duration heartbeat_interval) {
  auto member = std::make_unique<JoinedMember>();
  member->credentials = std::make_shared<CallCredentials>(cluster_token);
  member->scheduler =
      std::make_unique<SchedulerClient>(scheduler_address, absl::Seconds(5), member->credentials);
  SchedulerClient& scheduler = *member->scheduler;
  for (const absl::Time give_up = absl::Now() + absl::Seconds(60);;) {
    absl::StatusOr<ClusterView> forming = scheduler.GetClusterView("");
    REQUIRE(forming.ok());
    if (forming->registered_workers() == workers_before) break;
    REQUIRE(absl::Now() < give_up);
    absl::SleepFor(absl::Milliseconds(50));
  }
  absl::StatusOr<RegisterResponse> registered =
      scheduler.Register(NODE_ROLE_WORKER, "127.0.0.1:9", absl::Now() + absl::Seconds(20));
  REQUIRE(registered.ok());
  REQUIRE(registered->rank() == workers_before);
  member->registration = *registered;
  // A member in good standing: it heartbeats (as itself) like any worker.
  member->heartbeats = std::make_unique<HeartbeatSender>(
      &scheduler, registered->node_name(), heartbeat_interval, [] { return HeartbeatRequest(); },
      [](const HeartbeatResponse&) {}, [](const absl::Status&) {});
  absl::StatusOr<ClusterView> view =
      scheduler.WaitForReady(registered->node_name(), absl::Now() + absl::Seconds(30));
  REQUIRE(view.ok());
  member->view = *std::move(view);
  return member;
}

}  // namespace paramserver
