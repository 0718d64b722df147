// ClusterMembership against a scripted scheduler over gRPC on 127.0.0.1: registration
// and its log line, heartbeats with the node's name and their answers, a refusal handed
// to on_refused, and a rejoin that is given another name.
#include "common/rpc/cluster_membership.h"

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "catch2/catch.hpp"
#include "common/rpc/rpc_endpoints.h"
#include "common/testing/log_capture.h"
#include "proto/scheduler.grpc.pb.h"

namespace paramserver {
namespace {

// Names nodes from a script ("worker-3", then what `next_names` says); answers
// heartbeats with job_finished once told to, or refuses them.
class ScriptedScheduler final : public Scheduler::Service {
 public:
  grpc::Status Register(grpc::ServerContext*, const RegisterRequest* request,
                        RegisterResponse* response) override {
    absl::MutexLock lock(&mu);
    roles.push_back(request->role());
    addresses.push_back(request->advertised_address());
    response->set_node_name(next_names.empty() ? "worker-3" : next_names.front());
    if (!next_names.empty()) next_names.erase(next_names.begin());
    response->set_rank(3);
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const HeartbeatRequest* request,
                         HeartbeatResponse* response) override {
    absl::MutexLock lock(&mu);
    heartbeat_names.push_back(request->node_name());
    if (refuse_heartbeats) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "declared dead");
    }
    response->set_job_finished(finished);
    return grpc::Status::OK;
  }

  absl::Mutex mu;
  std::vector<NodeRole> roles ABSL_GUARDED_BY(mu);
  std::vector<std::string> addresses ABSL_GUARDED_BY(mu);
  std::vector<std::string> next_names ABSL_GUARDED_BY(mu);
  std::vector<std::string> heartbeat_names ABSL_GUARDED_BY(mu);
  bool finished ABSL_GUARDED_BY(mu) = false;
  bool refuse_heartbeats ABSL_GUARDED_BY(mu) = false;
};

MembershipOptions OptionsFor(int port) {
  MembershipOptions options;
  options.scheduler_address = "127.0.0.1:" + std::to_string(port);
  options.role = NODE_ROLE_WORKER;
  options.advertised_address = "127.0.0.1:7777";
  options.rpc_timeout = absl::Seconds(2);
  options.heartbeat_interval = absl::Milliseconds(20);
  return options;
}

TEST_CASE(
    "a member registers, says so once, and heartbeats under its name until told the "
    "job finished") {
  ScriptedScheduler scheduler;
  absl::StatusOr<RunningServer> server = StartRpcServer("127.0.0.1:0", {&scheduler});
  REQUIRE(server.ok());
  LogCapture log;
  absl::StatusOr<std::unique_ptr<ClusterMembership>> member =
      ClusterMembership::Join(OptionsFor(server->port), absl::Now() + absl::Seconds(10));
  REQUIRE(member.ok());
  CHECK((*member)->node_name() == "worker-3");
  CHECK((*member)->rank() == 3);
  {
    absl::MutexLock lock(&scheduler.mu);
    CHECK(scheduler.roles == std::vector<NodeRole>{NODE_ROLE_WORKER});
    CHECK(scheduler.addresses == std::vector<std::string>{"127.0.0.1:7777"});
  }
  const std::string expected =
      "registered with the scheduler at 127.0.0.1:" + std::to_string(server->port) +
      "; serving on 127.0.0.1:7777 as rank 3; this node's lines are "
      "tagged [worker-3] from here on";
  CHECK(log.text().find(expected) != std::string::npos);

  absl::Mutex mu;
  bool finished = false;
  (*member)->StartHeartbeats(HeartbeatHandlers{[] { return HeartbeatRequest(); },
                                               [&](const HeartbeatResponse& response) {
                                                 absl::MutexLock lock(&mu);
                                                 if (response.job_finished()) finished = true;
                                               },
                                               nullptr,
                                               {}});
  {
    absl::MutexLock lock(&scheduler.mu);
    scheduler.finished = true;
  }
  {
    absl::MutexLock lock(&mu);
    CHECK(mu.AwaitWithTimeout(absl::Condition(&finished), absl::Seconds(10)));
  }
  (*member)->StopHeartbeats();
  absl::MutexLock lock(&scheduler.mu);
  REQUIRE(!scheduler.heartbeat_names.empty());
  for (const std::string& name : scheduler.heartbeat_names) CHECK(name == "worker-3");
}

TEST_CASE(
    "a refused heartbeat goes to on_refused; a rejoin under the same name is taken, "
    "under another refused") {
  ScriptedScheduler scheduler;
  absl::StatusOr<RunningServer> server = StartRpcServer("127.0.0.1:0", {&scheduler});
  REQUIRE(server.ok());
  MembershipOptions options = OptionsFor(server->port);
  options.role = NODE_ROLE_SERVER;
  {
    absl::MutexLock lock(&scheduler.mu);
    scheduler.next_names = {"ps-1", "ps-1", "ps-4"};
    scheduler.refuse_heartbeats = true;
  }
  LogCapture log;
  absl::StatusOr<std::unique_ptr<ClusterMembership>> member =
      ClusterMembership::Join(options, absl::Now() + absl::Seconds(10));
  REQUIRE(member.ok());
  // A server's line names no rank (the launcher and the cloud-init test read it).
  CHECK(
      log.text().find("registered with the scheduler at 127.0.0.1:" + std::to_string(server->port) +
                      "; serving on 127.0.0.1:7777; this node's lines are tagged [ps-1]") !=
      std::string::npos);
  absl::Mutex mu;
  std::string refusal;
  (*member)->StartHeartbeats(HeartbeatHandlers{[] { return HeartbeatRequest(); },
                                               [](const HeartbeatResponse&) {},
                                               [&](const absl::Status& why) {
                                                 absl::MutexLock lock(&mu);
                                                 refusal = std::string(why.message());
                                               },
                                               {}});
  {
    absl::MutexLock lock(&mu);
    auto refused = [&] { return !refusal.empty(); };
    REQUIRE(mu.AwaitWithTimeout(absl::Condition(&refused), absl::Seconds(10)));
    CHECK(refusal.find("declared dead") != std::string::npos);
  }
  (*member)->StopHeartbeats();
  const absl::StatusOr<RegisterResponse> again = (*member)->Rejoin(absl::Now() + absl::Seconds(5));
  REQUIRE(again.ok());
  CHECK(again->node_name() == "ps-1");
  const absl::StatusOr<RegisterResponse> renamed =
      (*member)->Rejoin(absl::Now() + absl::Seconds(5));
  CHECK(renamed.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(renamed.status().message()) ==
        "the scheduler gave this node another name, ps-4, in place of ps-1");
}

TEST_CASE("joining a scheduler that never answers fails at the deadline, naming it") {
  // Port 1 on loopback: nothing listens.
  MembershipOptions options = OptionsFor(1);
  options.rpc_timeout = absl::Milliseconds(200);
  const absl::StatusOr<std::unique_ptr<ClusterMembership>> member =
      ClusterMembership::Join(options, absl::Now() + absl::Seconds(1));
  REQUIRE(!member.ok());
  CHECK(std::string(member.status().message()).find("127.0.0.1:1") != std::string::npos);
}

}  // namespace
}  // namespace paramserver
