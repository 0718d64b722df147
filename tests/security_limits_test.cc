// The limits of docs/SECURITY.md, measured against a real scheduler process on
// 127.0.0.1 with a cluster token and an admin token: what its health service tells an
// outsider, what a flood of refused admin calls leaves in its log and metrics, what
// oversized unauthenticated messages do to its memory, and whether a genuine node
// registers while a member floods Register.
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "catch2/catch.hpp"
#include "common/rpc/rpc_endpoints.h"
#include "common/security/admin_token.h"
#include "common/security/peer_credentials.h"
#include "common/testing/local_cluster.h"
#include "common/testing/temp_dir.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "httplib.h"
#include "proto/admin.grpc.pb.h"
#include "proto/scheduler.grpc.pb.h"
#include "tests/cluster_config.h"

namespace paramserver {
namespace {

// A context with a deadline: every call ends.
struct Call {
  explicit Call(absl::Duration timeout = absl::Seconds(10)) {
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  }
  grpc::ClientContext context;
};

// Calls `method` with `request` (raw bytes) on `channel`, blocking; the reply's bytes
// go to *reply.
grpc::Status RawCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                     const grpc::ByteBuffer& request, std::string* reply = nullptr,
                     absl::Duration timeout = absl::Seconds(10)) {
  grpc::GenericStub generic(channel);
  Call call(timeout);
  grpc::ByteBuffer request_copy = request, response;
  grpc::Status result;
  bool done = false;
  absl::Mutex mu;
  generic.UnaryCall(&call.context, method, grpc::StubOptions(), &request_copy, &response,
                    [&](grpc::Status status) {
                      absl::MutexLock lock(&mu);
                      result = status;
                      done = true;
                    });
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(&done));  // the call's own deadline ends it
  if (result.ok() && reply != nullptr) {
    std::vector<grpc::Slice> slices;
    (void)response.Dump(&slices);
    for (const grpc::Slice& slice : slices)
      reply->append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return result;
}

grpc::ByteBuffer BufferOf(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// grpc.health.v1.HealthCheckRequest{service}: field 1, a string.
grpc::ByteBuffer HealthRequest(const std::string& service) {
  return BufferOf(
      absl::StrCat(std::string(1, '\x0a'), std::string(1, char(service.size())), service));
}
constexpr char kHealthCheck[] = "/grpc.health.v1.Health/Check";
const std::string kServing("\x08\x01", 2);  // HealthCheckResponse{status: SERVING}

// The resident memory of process `pid`, in bytes (VmRSS of /proc/<pid>/status).
int64_t ResidentBytes(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  for (std::string line; std::getline(status, line);) {
    if (!absl::StartsWith(line, "VmRSS:")) continue;
    std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t kib = 0;
    if (words.size() >= 2 && absl::SimpleAtoi(words[1], &kib)) return kib * 1024;
  }
  return -1;
}

std::string ScrapeMetrics(int port) {
  httplib::Client client("127.0.0.1", port);
  httplib::Result response = client.Get("/metrics");
  REQUIRE(response);
  REQUIRE(response->status == 200);
  return response->body;
}

int CountLines(const std::string& text, const std::string& containing) {
  int lines = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n'))
    lines += absl::StrContains(line, containing);
  return lines;
}

// The overall health answers SERVING to anyone; no named service and no reflection is served.
void CheckHealthTellsOnlyServing(const std::shared_ptr<grpc::Channel>& outsider,
                                 const std::shared_ptr<grpc::Channel>& member) {
  std::string reply;
  REQUIRE(RawCall(outsider, kHealthCheck, HealthRequest(""), &reply).ok());
  CHECK(reply == kServing);
  for (const char* service : {"paramserver.Scheduler", "paramserver.Admin",
                              "paramserver.ParameterServer", "grpc.health.v1.Health"}) {
    INFO(service);
    const grpc::Status named = RawCall(outsider, kHealthCheck, HealthRequest(service));
    CHECK(named.error_code() == grpc::StatusCode::NOT_FOUND);  // no role revealed
    CHECK(RawCall(member, kHealthCheck, HealthRequest(service)).error_code() ==
          grpc::StatusCode::NOT_FOUND);
  }
  // ServerReflectionRequest{list_services: ""}: reflection is not served at all.
  for (const char* reflection : {"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                 "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"}) {
    INFO(reflection);
    std::string listed;
    const grpc::Status status =
        RawCall(outsider, reflection, BufferOf(std::string("\x3a\x00", 2)), &listed);
    CHECK(status.error_code() == grpc::StatusCode::UNIMPLEMENTED);
    CHECK(listed.find("paramserver") == std::string::npos);
  }
}

// Refused admin calls with a wrong token are all counted in the metrics, but logged rarely.
void CheckRefusedAdminFloodIsCountedNotLogged(const std::shared_ptr<grpc::Channel>& member,
                                              int metrics_port, const ChildProcess& scheduler) {
  auto admin = Admin::NewStub(member);
  constexpr int kRefused = 2000;
  int refused = 0;
  for (int i = 0; i < kRefused; ++i) {
    Call call;
    call.context.AddMetadata(kAuthorizationMetadata, BearerValue("a-wrong-admin-token-0000"));
    RequestCheckpointRequest request;
    RequestCheckpointResponse response;
    refused += admin->RequestCheckpoint(&call.context, request, &response).error_code() ==
               grpc::StatusCode::PERMISSION_DENIED;
  }
  CHECK(refused == kRefused);
  const std::string metrics = ScrapeMetrics(metrics_port);
  INFO(metrics);
  CHECK(absl::StrContains(metrics,
                          "scheduler_refused_requests_total{kind=\"admin_permission\"} 2000"));
  const std::string log = scheduler.ReadLog();
  const int lines = CountLines(log, "wrong admin token");
  INFO(log);
  WARN(lines << " log lines for " << kRefused << " refused admin calls");
  CHECK(lines >= 1);
  CHECK(lines <= 3);  // once per 10 s for this caller
}

// Oversized unauthenticated calls are refused without filling the scheduler's memory.
void CheckOversizedCallsDoNotFillMemory(const std::shared_ptr<grpc::Channel>& outsider,
                                        const std::shared_ptr<grpc::Channel>& member,
                                        const ChildProcess& scheduler) {
  const int64_t before = ResidentBytes(scheduler.pid());
  REQUIRE(before > 0);
  // One 64 MiB slice shared by every call (the client holds it once).
  const grpc::ByteBuffer huge = BufferOf(std::string(64 << 20, '\x01'));
  int64_t most = before;
  std::atomic<int> finished{0};
  std::vector<grpc::StatusCode> codes(10);
  std::vector<std::thread> callers;
  for (int i = 0; i < 10; ++i) {
    callers.emplace_back([&, i] {
      codes[i] =
          RawCall(outsider, "/paramserver.Scheduler/DeclareModel", huge, nullptr, absl::Seconds(30))
              .error_code();
      ++finished;
    });
  }
  while (finished.load() < 10) {
    most = std::max(most, ResidentBytes(scheduler.pid()));
    absl::SleepFor(absl::Milliseconds(2));
  }
  for (std::thread& caller : callers) caller.join();
  most = std::max(most, ResidentBytes(scheduler.pid()));
  WARN("scheduler VmRSS " << before / 1e6 << " MB before, at most " << most / 1e6
                          << " MB during 10 concurrent 64 MiB calls");
  for (grpc::StatusCode code : codes) CHECK(code == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(most < 100'000'000);
  // It still serves.
  Call call;
  ClusterView view;
  CHECK(Scheduler::NewStub(member)
            ->GetClusterView(&call.context, GetClusterViewRequest(), &view)
            .ok());
  CHECK(view.expected_servers() == 1);
  // A long poll for a map change is bounded: past kMaxMapWaitMs, or below 0, is refused
  // by name; and only a node, naming itself, may wait (it holds a thread).
  for (int wait_ms : {-1, 1001, 1 << 30}) {
    Call poll;
    GetClusterViewRequest request;
    request.set_wait_for_epoch_above(1 << 20);
    request.set_wait_ms(wait_ms);
    const grpc::Status refused =
        Scheduler::NewStub(member)->GetClusterView(&poll.context, request, &view);
    CHECK(refused.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    CHECK(refused.error_message() == absl::StrCat("wait_ms ", wait_ms,
                                                  " is out of range: 0 to 1000 ms of waiting "
                                                  "for a map change"));
  }
  Call poll;
  GetClusterViewRequest request;
  request.set_wait_for_epoch_above(1 << 20);
  request.set_wait_ms(30);
  const grpc::Status anonymous =
      Scheduler::NewStub(member)->GetClusterView(&poll.context, request, &view);
  CHECK(anonymous.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(anonymous.error_message() ==
        "a wait for a map change (wait_ms) names the node that waits (node_name)");
}

// A genuine node registers at its first attempt while a member floods Register.
void CheckRegisterFloodKeepsNoGenuineNodeOut(
    const std::string& address, const std::shared_ptr<CallCredentials>& member_credentials,
    const std::shared_ptr<grpc::Channel>& member) {
  auto scheduler_stub = Scheduler::NewStub(member);
  auto register_as = [&](Scheduler::Stub* stub, NodeRole role, const std::string& advertised,
                         const std::string& node_token) {
    Call call;
    RegisterRequest request;
    request.set_role(role);
    request.set_advertised_address(advertised);
    request.set_node_token(node_token);
    RegisterResponse response;
    return stub->Register(&call.context, request, &response);
  };
  constexpr int kFlood = 5000;
  std::atomic<int> sent{0}, limited{0};
  std::vector<std::thread> flooders;
  for (int t = 0; t < 4; ++t) {
    flooders.emplace_back([&, t] {
      for (int i = 0; i < kFlood / 4; ++i) {
        // One caller: the same peer address and advertised address every time.
        const grpc::Status status =
            register_as(scheduler_stub.get(), NODE_ROLE_SERVER, "127.0.0.1:7777",
                        absl::StrCat("flooder-node-token-0123456789abcdef-", t, "-", i));
        // Held by its own bucket (not "the node there is alive", which any later call
        // at the address it took would get anyway).
        limited += status.error_code() == grpc::StatusCode::UNAVAILABLE &&
                   absl::StartsWith(status.error_message(), "this caller:");
        ++sent;
      }
    });
  }
  while (sent.load() < kFlood / 5) absl::SleepFor(absl::Milliseconds(1));
  // The genuine node retries as a registering node does, after a second.
  auto genuine = Scheduler::NewStub(CreateChannel(address, member_credentials));
  int attempts = 0;
  grpc::StatusCode joined = grpc::StatusCode::UNKNOWN;
  const int sent_when_joining = sent.load();
  while (joined != grpc::StatusCode::OK && attempts < 10) {
    if (attempts > 0) absl::SleepFor(absl::Seconds(1));
    ++attempts;
    joined = register_as(genuine.get(), NODE_ROLE_WORKER, "127.0.0.1:9",
                         "genuine-worker-node-token-0123456789abcdef")
                 .error_code();
  }
  const int sent_when_joined = sent.load();
  for (std::thread& flooder : flooders) flooder.join();
  WARN("the genuine node registered at attempt "
       << attempts << " (flood calls " << sent_when_joining << " to " << sent_when_joined << " of "
       << kFlood << "); " << limited.load() << " flood calls were rate-limited");
  CHECK(joined == grpc::StatusCode::OK);
  CHECK(attempts == 1);                // with one shared bucket it was refused (docs/SECURITY.md)
  CHECK(sent_when_joined < kFlood);    // it joined during the flood
  CHECK(limited.load() > kFlood / 2);  // the flooder was held to its own bucket
}

TEST_CASE(
    "a scheduler's limits: health tells an outsider SERVING and nothing more, refused admin "
    "floods are counted not logged, oversized calls do not fill its memory, a flooding member "
    "does not keep a genuine node out") {
  TempDir dir;
  TestJob job;
  job.servers = 1;
  job.workers = 1;
  job.shards = 1;
  job.cluster_token_file = dir.WriteSecretFile("cluster.token", kTestClusterToken);
  job.admin_token_file = dir.WriteSecretFile("admin.token", kTestAdminToken);
  const std::string config = dir.WriteFile("job.yaml", TestJobYaml(job));
  // The scheduler alone: this test plays every other node.
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(config, dir.path(), 0, 0, {}, {"--metrics_port=0"});
  REQUIRE(cluster.ok());
  ChildProcess& scheduler = (*cluster)->scheduler();
  absl::StatusOr<int> metrics_port = WaitForLoggedNumber(
      scheduler, R"(metrics on http://127\.0\.0\.1:(\d+)/metrics)", absl::Seconds(60));
  REQUIRE(metrics_port.ok());
  const std::string address = (*cluster)->scheduler_address();
  const auto outsider = CreateChannel(address);
  const auto member_credentials = std::make_shared<CallCredentials>(kTestClusterToken);
  const auto member = CreateChannel(address, member_credentials);

  SECTION("health and reflection") { CheckHealthTellsOnlyServing(outsider, member); }

  SECTION("2,000 refused admin calls: a few log lines, every one counted") {
    CheckRefusedAdminFloodIsCountedNotLogged(member, *metrics_port, scheduler);
  }

  SECTION("10 concurrent unauthenticated 64 MiB calls: resident memory stays under 100 MB") {
    CheckOversizedCallsDoNotFillMemory(outsider, member, scheduler);
  }

  SECTION("a member's 5,000-call Register flood does not keep a genuine node out") {
    CheckRegisterFloodKeepsNoGenuineNodeOut(address, member_credentials, member);
  }
}

}  // namespace
}  // namespace paramserver