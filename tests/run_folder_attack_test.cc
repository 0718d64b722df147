// A process that reads the whole run folder of a live job (the scheduler's state file,
// the cluster token, every log and config) attacks it with everything it found: each
// recovered value is replayed as every node's credential against every RPC, and
// shard maps are forged from the state file's. It may join as a new member at most
// (and the cluster has no free slot); it never acts as an existing node or as the
// scheduler, and the job's final weights are bit-identical to an undisturbed run's.
//
// One of the job's two servers runs in this process (a real ParameterServerDaemon,
// registered with the real scheduler like the other): the forged maps are handed to
// its ApplyShardMap, which InstallShardMap calls once the caller is the scheduler. No
// file holds the scheduler's credential, so that is the only way to test the second
// wall, the map's signature, on a real server.
#include <algorithm>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "catch2/catch.hpp"
#include "common/config/cluster_spec.h"
#include "common/files/file_system.h"
#include "common/rpc/rpc_endpoints.h"
#include "common/security/peer_credentials.h"
#include "common/security/secrets.h"
#include "common/security/shard_map_signature.h"
#include "common/testing/local_cluster.h"
#include "common/testing/one_shard_calls.h"
#include "common/testing/temp_dir.h"
#include "proto/parameter_server.grpc.pb.h"
#include "proto/scheduler.grpc.pb.h"
#include "ps/parameter_server_daemon.h"
#include "tests/cluster_config.h"

namespace paramserver {
namespace {

TestJob AttackedJob(const TempDir& dir) {
  TestJob job;
  job.mode = "sync";
  job.servers = 2;
  job.workers = 2;
  job.shards = 4;
  job.max_steps = 400;
  job.cluster_token_file = dir.WriteSecretFile("cluster.token", kTestClusterToken);
  job.weights = dir.File("final.safetensors");
  return job;
}

std::string ReadOrEmpty(const std::string& path) {
  absl::StatusOr<std::string> bytes = LocalFileSystem().ReadFile(path);
  return bytes.ok() ? *bytes : std::string();
}

// Everything in `dir` that could be a secret: each small file whole (trimmed), every
// run of 32 or more hex digits or token characters in any file, and what the state
// file says of each node (its digest raw and in hex, its address).
std::vector<std::string> RecoverCandidates(const std::string& dir, const SchedulerState& state) {
  std::set<std::string> found;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    const std::string bytes = ReadOrEmpty(entry.path().string());
    if (bytes.size() <= 256) found.insert(std::string(absl::StripAsciiWhitespace(bytes)));
    std::string run;
    for (const char c : bytes + '\n') {
      if (absl::ascii_isalnum(c) || c == '-' || c == '_') {
        run.push_back(c);
        continue;
      }
      if (run.size() >= 32) found.insert(run);
      run.clear();
    }
  }
  for (const SchedulerNodeState& node : state.nodes()) {
    found.insert(node.token_sha256());
    found.insert(absl::BytesToHexString(node.token_sha256()));
    found.insert(node.address());
  }
  found.erase("");
  return {found.begin(), found.end()};
}

struct Deadline {
  Deadline() { context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5))); }
  grpc::ClientContext context;
};

// Counts the calls that were not refused for who the caller is (not for a stale field,
// nor because the job ended): anything else counts as accepted.
struct AcceptedCounter {
  void operator()(const grpc::Status& status, const char* what) {
    if (status.error_code() != grpc::StatusCode::PERMISSION_DENIED &&
        status.error_code() != grpc::StatusCode::UNAUTHENTICATED) {
      ++accepted;
      UNSCOPED_INFO(what << " as " << name << " with a recovered value: " << status.error_code()
                         << " " << status.error_message());
    }
  }
  std::string name;
  int accepted = 0;
};

// Every RPC of the scheduler's, through `credentials`, counted by `count`.
void CallScheduler(const std::string& scheduler_address,
                   const std::shared_ptr<CallCredentials>& credentials, AcceptedCounter& count) {
  const std::string& name = count.name;
  auto scheduler = Scheduler::NewStub(CreateChannel(scheduler_address, credentials));
  {
    Deadline call;
    GetClusterViewRequest request;
    request.set_node_name(name);
    ClusterView view;
    count(scheduler->GetClusterView(&call.context, request, &view), "GetClusterView");
  }
  {
    Deadline call;
    HeartbeatRequest request;
    request.set_node_name(name);
    HeartbeatResponse response;
    count(scheduler->Heartbeat(&call.context, request, &response), "Heartbeat");
  }
  {
    Deadline call;
    HeartbeatRequest request;
    request.set_node_name(name);
    std::unique_ptr<grpc::ClientReaderWriter<HeartbeatRequest, HeartbeatResponse>> stream =
        scheduler->HeartbeatStream(&call.context);
    HeartbeatResponse response;
    // Refused at the open or at the first beat; the status is the call's either way.
    if (stream->Write(request)) stream->Read(&response);
    stream->WritesDone();
    count(stream->Finish(), "HeartbeatStream");
  }
  {
    Deadline call;
    LeaveRequest request;
    request.set_node_name(name);
    request.set_reason("an attacker");
    LeaveResponse response;
    count(scheduler->Leave(&call.context, request, &response), "Leave");
  }
  {
    Deadline call;
    ReportResultRequest request;
    request.set_node_name(name);
    request.set_test_accuracy(0.01);
    ReportResultResponse response;
    count(scheduler->ReportResult(&call.context, request, &response), "ReportResult");
  }
  {
    Deadline call;
    ReportFinishedRequest request;
    request.set_node_name(name);
    ReportFinishedResponse response;
    count(scheduler->ReportFinished(&call.context, request, &response), "ReportFinished");
  }
}

// Every RPC of a server's at `address`, through `credentials`, counted by `count`.
void CallServer(const std::string& address, const std::shared_ptr<CallCredentials>& credentials,
                const ShardMap& map, AcceptedCounter& count) {
  auto server = ParameterServer::NewStub(CreateChannel(address, credentials));
  auto data = ParameterServerData::NewStub(CreateChannel(address, credentials));
  {
    Deadline call;
    InstallShardMapRequest request;
    *request.mutable_shard_map() = map;
    request.mutable_shard_map()->set_epoch(map.epoch() + 1);
    InstallShardMapResponse response;
    count(server->InstallShardMap(&call.context, request, &response), "InstallShardMap");
  }
  {
    Deadline call;
    CheckpointAtRequest request;
    request.set_step(1);
    CheckpointAtResponse response;
    count(server->CheckpointAt(&call.context, request, &response), "CheckpointAt");
  }
  {
    Deadline call;
    FetchShardStateRequest request;
    request.set_shard_id(0);
    request.set_epoch(map.epoch());
    count(FetchShardStatePieces(*server, &call.context, request, nullptr), "FetchShardState");
  }
  {
    Deadline call;
    ReplicateRequest request;
    ReplicateResponse response;
    count(server->Replicate(&call.context, request, &response), "Replicate");
  }
  for (int rank = 0; rank < 2; ++rank) {
    Deadline call;
    PushRequest request;
    request.set_shard_id(0);
    request.set_epoch(map.epoch());
    request.set_worker_rank(rank);
    request.set_step(1 << 19);
    PushResponse response;
    count(PushOneShard(*data, &call.context, request, &response), "PushShards");
  }
}

// Every RPC of every service, as `name` with `token`: the number of calls that were
// not refused for who they are (0 expected).
int AcceptedCalls(const std::string& scheduler_address, const std::vector<std::string>& servers,
                  const std::string& name, const std::string& token, const ShardMap& map) {
  auto credentials = std::make_shared<CallCredentials>(kTestClusterToken);
  credentials->SetIdentity(name, token);
  AcceptedCounter count{name};
  CallScheduler(scheduler_address, credentials, count);
  for (const std::string& address : servers) CallServer(address, credentials, map, count);
  return count.accepted;
}

SchedulerState ReadState(const std::string& path) {
  SchedulerState state;
  state.ParseFromString(ReadOrEmpty(path));
  return state;
}

std::string RunUndisturbed() {
  TempDir dir;
  const TestJob job = AttackedJob(dir);
  const std::string config = dir.WriteFile("job.yaml", TestJobYaml(job));
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(config, dir.path(), 2, 2);
  REQUIRE(cluster.ok());
  const absl::Status finished = (*cluster)->WaitForAll(absl::Seconds(180));
  INFO(finished.ToString());
  REQUIRE(finished.ok());
  return ReadOrEmpty(job.weights);
}

// Maps forged from the state file's, offered to a real server as if by the scheduler:
// one epoch ahead with worker-0's digest replaced (the review's attack), the same
// with the signature dropped, one far ahead, and one of the served epoch with other
// content. Each is refused; the map served again is a no-op.
void CheckForgedMapsAreRefused(ParameterServerDaemon& in_process, const ShardMap& map) {
  ShardMap stolen_digest = map;
  stolen_digest.set_epoch(map.epoch() + 1);
  for (NodeCredential& credential : *stolen_digest.mutable_credentials()) {
    if (credential.node_name() == "worker-0") credential.set_token_sha256(Sha256("attacker"));
  }
  ShardMap unsigned_map = stolen_digest;
  unsigned_map.clear_signature();
  ShardMap far_ahead = map;
  far_ahead.set_epoch(map.epoch() + 1000);
  ShardMap same_epoch = map;
  same_epoch.set_rewind_step(map.rewind_step() + 1);
  for (const ShardMap* forged : {&stolen_digest, &unsigned_map, &far_ahead, &same_epoch}) {
    const absl::StatusOr<int64_t> installed = in_process.ApplyShardMap(*forged);
    INFO("epoch " << forged->epoch() << ": " << installed.status().ToString());
    CHECK(installed.status().code() == absl::StatusCode::kPermissionDenied);
  }
  const absl::StatusOr<int64_t> replayed = in_process.ApplyShardMap(map);
  REQUIRE(replayed.ok());
  CHECK(*replayed == map.epoch());
}

// Every recovered value, replayed as every node's credential (and the scheduler's)
// against every RPC, is refused.
void CheckRecoveredValuesActAsNoNode(const std::string& scheduler_address,
                                     const SchedulerState& state,
                                     const std::vector<std::string>& candidates,
                                     const ShardMap& map) {
  std::vector<std::string> server_addresses;
  for (const SchedulerNodeState& node : state.nodes()) {
    if (node.role() == NODE_ROLE_SERVER) server_addresses.push_back(node.address());
  }
  REQUIRE(server_addresses.size() == 2);
  std::vector<std::string> names = {kSchedulerNodeName};
  for (const SchedulerNodeState& node : state.nodes()) names.push_back(node.name());
  int accepted = 0;
  for (const std::string& name : names) {
    for (const std::string& value : candidates) {
      // gRPC sends only printable metadata (a raw digest travels in hex, also tried).
      const bool printable =
          std::all_of(value.begin(), value.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
      if (!printable) continue;
      accepted += AcceptedCalls(scheduler_address, server_addresses, name, value, map);
    }
  }
  CHECK(accepted == 0);
}

// Registering with a live node's address and any recovered value is another
// process's registration (UNAVAILABLE until that node is declared dead), never that
// node's; a new member finds no free slot.
void CheckRegistrationsTakeNoNodesPlace(const std::string& scheduler_address,
                                        const SchedulerState& state,
                                        const std::vector<std::string>& candidates) {
  auto member = Scheduler::NewStub(
      CreateChannel(scheduler_address, std::make_shared<CallCredentials>(kTestClusterToken)));
  int registered_as_someone = 0;
  for (const SchedulerNodeState& node : state.nodes()) {
    for (const std::string& value : candidates) {
      if (value.size() < 32 || value.size() > 128) continue;
      Deadline call;
      RegisterRequest request;
      request.set_role(node.role());
      request.set_advertised_address(node.address());
      request.set_node_token(value);
      RegisterResponse response;
      const grpc::Status status = member->Register(&call.context, request, &response);
      if (status.ok()) ++registered_as_someone;
      CHECK(status.error_code() != grpc::StatusCode::OK);
    }
  }
  CHECK(registered_as_someone == 0);
  {
    // The scheduler was alive through it all: a new member is told there is no room.
    Deadline call;
    RegisterRequest request;
    request.set_role(NODE_ROLE_WORKER);
    request.set_advertised_address("127.0.0.1:9");
    request.set_node_token(NewSecretToken());
    RegisterResponse response;
    CHECK(member->Register(&call.context, request, &response).error_code() ==
          grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
}

TEST_CASE(
    "the run folder in hand, an attacker acts as no node and forges no map; the weights are "
    "the undisturbed run's") {
  const std::string reference = RunUndisturbed();
  REQUIRE_FALSE(reference.empty());

  TempDir dir;
  const TestJob job = AttackedJob(dir);
  const std::string config = dir.WriteFile("job.yaml", TestJobYaml(job));
  const std::string state_path = dir.File("scheduler.state");
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(config, dir.path(), 1, 2, {}, {"--state_file", state_path});
  REQUIRE(cluster.ok());
  absl::StatusOr<ClusterSpec> spec = LoadClusterSpec(config);
  REQUIRE(spec.ok());
  ParameterServerDaemonOptions options;
  options.spec = *spec;
  options.scheduler_address = (*cluster)->scheduler_address();
  options.startup_timeout = absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<ParameterServerDaemon>> server =
      ParameterServerDaemon::Create(options);
  REQUIRE(server.ok());
  ParameterServerDaemon& in_process = **server;
  absl::Status served;  // Catch2's assertions stay on this thread
  std::thread serving([&] { served = in_process.Run(); });

  // The attacker reads the folder once the job has formed.
  SchedulerState state;
  for (absl::Time until = absl::Now() + absl::Seconds(30);
       absl::Now() < until && !state.has_shard_map(); absl::SleepFor(absl::Milliseconds(50))) {
    state = ReadState(state_path);
  }
  REQUIRE(state.has_shard_map());
  REQUIRE(state.nodes_size() == 4);
  const ShardMap& map = state.shard_map();
  const std::vector<std::string> candidates = RecoverCandidates(dir.path(), state);
  INFO(candidates.size() << " values recovered from the run folder");
  CHECK(candidates.size() >= 9);  // the token, 4 digests in 2 forms, addresses, ...

  CheckForgedMapsAreRefused(in_process, map);
  CheckRecoveredValuesActAsNoNode((*cluster)->scheduler_address(), state, candidates, map);
  CheckRegistrationsTakeNoNodesPlace((*cluster)->scheduler_address(), state, candidates);

  const absl::Status finished = (*cluster)->WaitForAll(absl::Seconds(180));
  INFO(finished.ToString());
  CHECK(finished.ok());
  serving.join();
  CHECK(served.ok());
  const std::string weights = ReadOrEmpty(job.weights);
  REQUIRE_FALSE(weights.empty());
  CHECK(weights == reference);
  CHECK((*cluster)->FinalValue("test_accuracy") > 0.5);
}

}  // namespace
}  // namespace paramserver