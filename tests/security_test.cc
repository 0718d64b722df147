// The attacks of docs/SECURITY.md, replayed against a real job (a scheduler and two
// servers as processes on 127.0.0.1, with a cluster token): an outsider without the
// token, a member acting as another member, and junk or excess registrations. Each is
// refused with its status, and the job finishes with its own result.
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "common/rpc/heartbeat_sender.h"
#include "common/rpc/rpc_endpoints.h"
#include "common/rpc/scheduler_client.h"
#include "common/security/admin_token.h"
#include "common/testing/local_cluster.h"
#include "common/testing/one_shard_calls.h"
#include "common/testing/temp_dir.h"
#include "common/wire/shard_call_codec.h"
#include "common/wire/tensor_codec.h"
#include "proto/admin.grpc.pb.h"
#include "proto/parameter_server.grpc.pb.h"
#include "tests/cluster_config.h"
#include "tests/joined_member.h"

namespace paramserver {
namespace {

grpc::StatusCode Code(const grpc::Status& status) { return status.error_code(); }

// A context with a deadline: every attack call ends.
struct Call {
  Call() { context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10))); }
  grpc::ClientContext context;
};

// An outsider: no cluster token. Nothing it sends is read.
void CheckSchedulerRefusesOutsider(const std::string& scheduler_address) {
  auto outsider_scheduler = Scheduler::NewStub(CreateChannel(scheduler_address));
  {
    Call call;
    RegisterRequest request;
    request.set_role(NODE_ROLE_SERVER);
    request.set_advertised_address("127.0.0.1:9");
    request.set_node_token("outsider-node-token-0123456789abcdef");
    RegisterResponse response;
    CHECK(Code(outsider_scheduler->Register(&call.context, request, &response)) ==
          grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    Call call;
    GetClusterViewRequest request;
    ClusterView view;
    CHECK(Code(outsider_scheduler->GetClusterView(&call.context, request, &view)) ==
          grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    // A wrong cluster token is no better.
    auto guessing = Scheduler::NewStub(CreateChannel(
        scheduler_address, std::make_shared<CallCredentials>("guessed-cluster-token-000")));
    Call call;
    ReportResultRequest fake;
    fake.set_node_name("worker-0");
    fake.set_test_accuracy(0.999);
    ReportResultResponse ignored;
    const grpc::Status refused = guessing->ReportResult(&call.context, fake, &ignored);
    CHECK(Code(refused) == grpc::StatusCode::UNAUTHENTICATED);
    CHECK(absl::StrContains(refused.error_message(), "wrong cluster token"));
  }
  {
    auto admin = Admin::NewStub(CreateChannel(scheduler_address));
    Call call;
    call.context.AddMetadata(kAuthorizationMetadata,
                             BearerValue(kTestAdminToken));  // even with the admin token
    DrainServerRequest request;
    request.set_node_name("ps-0");
    DrainServerResponse response;
    CHECK(Code(admin->DrainServer(&call.context, request, &response)) ==
          grpc::StatusCode::UNAUTHENTICATED);
  }
}

// Figures out of range (a NaN loss, an accuracy of 42, an infinite rate): answered
// (the node stays in the job), but nothing of them is kept or shown.
void CheckWildFiguresAreNotKept(const std::string& scheduler_address, const JoinedMember& joined) {
  HeartbeatRequest wild;
  wild.set_node_name(joined.registration.node_name());
  wild.mutable_progress()->set_step(3);
  wild.mutable_progress()->set_loss(std::numeric_limits<double>::quiet_NaN());
  wild.mutable_progress()->set_test_accuracy(42);
  wild.mutable_progress()->set_samples_per_sec(std::numeric_limits<double>::infinity());
  absl::StatusOr<HeartbeatResponse> answered = joined.scheduler->Heartbeat(wild);
  CHECK(answered.ok());
  auto admin = Admin::NewStub(CreateChannel(scheduler_address, joined.credentials));
  Call call;
  ClusterStatus status;
  REQUIRE(admin->GetStatus(&call.context, GetStatusRequest(), &status).ok());
  bool shown = false;
  for (const NodeStatus& node : status.nodes()) {
    if (node.name() != joined.registration.node_name()) continue;
    shown = true;
    CHECK(std::isfinite(node.progress().loss()));
    CHECK(node.progress().test_accuracy() <= 1.0);
    CHECK(std::isfinite(node.progress().samples_per_sec()));
    CHECK(node.progress().step() != 3);
  }
  CHECK(shown);
}

// At the servers, an outsider can neither install a map, read state, replicate, nor push.
void CheckServerRefusesOutsider(const ShardMap& map, const ShardAssignment& shard,
                                const PushRequest& push) {
  auto outsider_server = ParameterServer::NewStub(CreateChannel(shard.server_address()));
  {
    Call call;
    InstallShardMapRequest request;
    *request.mutable_shard_map() = map;
    request.mutable_shard_map()->set_epoch(1000000);
    request.mutable_shard_map()->clear_shards();
    InstallShardMapResponse response;
    CHECK(Code(outsider_server->InstallShardMap(&call.context, request, &response)) ==
          grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    Call call;
    FetchShardStateRequest request;
    request.set_shard_id(shard.shard_id());
    request.set_epoch(map.epoch());
    CHECK(Code(FetchShardStatePieces(*outsider_server, &call.context, request, nullptr)) ==
          grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    auto data = ParameterServerData::NewStub(CreateChannel(shard.server_address()));
    Call call;
    PushShardsRequest request;
    *request.add_shards() = push;
    PushShardsResponse response;
    CHECK(Code(data->PushShards(&call.context, request, &response)) ==
          grpc::StatusCode::UNAUTHENTICATED);
  }
}

// A member acting as another member.
void CheckServerRefusesImpersonation(const ShardMap& map, const ShardAssignment& shard,
                                     const std::shared_ptr<CallCredentials>& member,
                                     ParameterServerData::Stub* as_member_data,
                                     const PushRequest& push, const RegisterResponse* me,
                                     int other_rank) {
  auto as_member = ParameterServer::NewStub(CreateChannel(shard.server_address(), member));
  {
    Call call;
    PushResponse response;
    const grpc::Status refused =
        PushOneShard(*as_member_data, &call.context, push, &response);  // as the other worker
    CHECK(Code(refused) == grpc::StatusCode::PERMISSION_DENIED);
    CHECK(refused.error_message() ==
          me->node_name() + " may not push as worker " + std::to_string(other_rank));
  }
  {
    auto data = ParameterServerData::NewStub(CreateChannel(shard.server_address(), member));
    Call call;
    PullShardsRequest request;
    PullRequest* pull = request.add_shards();
    pull->set_shard_id(shard.shard_id());
    pull->set_epoch(map.epoch());
    pull->set_worker_rank(other_rank);
    PullShardsResponse response;
    CHECK(Code(data->PullShards(&call.context, request, &response)) ==
          grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    Call call;
    InstallShardMapRequest request;
    *request.mutable_shard_map() = map;
    request.mutable_shard_map()->set_epoch(1000000);
    request.mutable_shard_map()->clear_shards();
    InstallShardMapResponse response;
    const grpc::Status refused = as_member->InstallShardMap(&call.context, request, &response);
    CHECK(Code(refused) == grpc::StatusCode::PERMISSION_DENIED);
    CHECK(refused.error_message() ==
          "InstallShardMap is for the scheduler; " + me->node_name() + " is a worker");
  }
  {
    Call call;
    CheckpointAtRequest request;
    request.set_step(1);
    CheckpointAtResponse response;
    CHECK(Code(as_member->CheckpointAt(&call.context, request, &response)) ==
          grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    Call call;
    FetchShardStateRequest request;
    request.set_shard_id(shard.shard_id());
    request.set_epoch(map.epoch());
    CHECK(Code(FetchShardStatePieces(*as_member, &call.context, request, nullptr)) ==
          grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    Call call;
    ReplicateRequest request;
    ShardLogBatch* batch = request.add_shards();
    batch->set_shard_id(shard.shard_id());
    batch->set_primary_name(shard.server_name());
    batch->set_epoch(map.epoch());
    ReplicateResponse response;
    CHECK(Code(as_member->Replicate(&call.context, request, &response)) ==
          grpc::StatusCode::PERMISSION_DENIED);
  }
}

// At the scheduler: heartbeats, leaving, finishing and results only for oneself.
void CheckSchedulerLimitsMember(Scheduler::Stub* member_scheduler, const RegisterResponse* me,
                                const std::string& other) {
  {
    Call call;
    HeartbeatRequest beat;
    beat.set_node_name("ps-0");
    HeartbeatResponse response;
    CHECK(Code(member_scheduler->Heartbeat(&call.context, beat, &response)) ==
          grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    Call call;
    LeaveRequest leave;
    leave.set_node_name("ps-1");
    LeaveResponse response;
    const grpc::Status refused = member_scheduler->Leave(&call.context, leave, &response);
    CHECK(Code(refused) == grpc::StatusCode::PERMISSION_DENIED);
    CHECK(refused.error_message() == me->node_name() + " may not send Leave for ps-1");
  }
  {
    Call call;
    ReportFinishedRequest finished;
    finished.set_node_name(other);
    ReportFinishedResponse response;
    CHECK(Code(member_scheduler->ReportFinished(&call.context, finished, &response)) ==
          grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    Call call;
    ReportResultRequest fake;
    fake.set_node_name(other);
    fake.set_test_accuracy(0.999);
    ReportResultResponse response;
    CHECK(Code(member_scheduler->ReportResult(&call.context, fake, &response)) ==
          grpc::StatusCode::PERMISSION_DENIED);
  }
  // Junk and excess registrations, from a member.
  auto register_as = [&](NodeRole role, const std::string& address) {
    Call call;
    RegisterRequest request;
    request.set_role(role);
    request.set_advertised_address(address);
    request.set_node_token("attacker-node-token-0123456789abcdef-" +
                           std::to_string(address.size()));
    RegisterResponse response;
    return member_scheduler->Register(&call.context, request, &response);
  };
  CHECK(Code(register_as(NODE_ROLE_SERVER, "evil:0")) == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(Code(register_as(NODE_ROLE_SERVER, std::string(1 << 20, 'a') + ":7000")) ==
        grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(Code(register_as(NODE_ROLE_SERVER, std::string("\0:", 2))) ==
        grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(Code(register_as(NODE_ROLE_SERVER, "127.0.0.1:7777")) ==
        grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK(Code(register_as(NODE_ROLE_WORKER, "127.0.0.1:7778")) ==
        grpc::StatusCode::RESOURCE_EXHAUSTED);
  // Rotating addresses: each is refused for want of a slot (no state changes), not
  // rate-limited as one caller.
  for (int i = 0; i < 20; ++i) {
    CHECK(Code(register_as(NODE_ROLE_SERVER, "127.0.0.1:" + std::to_string(8000 + i))) ==
          grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  int limited = 0;
  for (int i = 0; i < 100 && limited == 0; ++i) {
    limited +=
        Code(register_as(NODE_ROLE_SERVER, "127.0.0.1:7777")) == grpc::StatusCode::UNAVAILABLE;
  }
  CHECK(limited == 1);  // this caller's burst ran out: registrations are rate-limited per caller
}

TEST_CASE(
    "outsiders and members acting as others are refused; the job finishes with its own result") {
  TempDir dir;
  TestJob job;
  job.mode = "async";
  job.servers = 2;
  job.workers = 2;
  job.shards = 4;
  job.max_steps = 400;
  job.cluster_token_file = dir.WriteSecretFile("cluster.token", kTestClusterToken);
  job.admin_token_file = dir.WriteSecretFile("admin.token", kTestAdminToken);
  job.weights = dir.File("final.safetensors");
  const std::string config = dir.WriteFile("job.yaml", TestJobYaml(job));
  // Two servers and one real worker; this test is the other worker, a member that
  // misbehaves.
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(config, dir.path(), 2, 1);
  REQUIRE(cluster.ok());
  const std::string scheduler_address = (*cluster)->scheduler_address();

  CheckSchedulerRefusesOutsider(scheduler_address);

  // This test joins as a member, after the real worker (which is worker-0, the one that
  // evaluates and reports the result); the cluster forms with us.
  const std::unique_ptr<JoinedMember> joined =
      JoinAsLastWorker(scheduler_address, kTestClusterToken, /*workers_before=*/1,
                       absl::Milliseconds(job.heartbeat_interval_ms));
  const std::shared_ptr<CallCredentials>& member = joined->credentials;
  const RegisterResponse* me = &joined->registration;
  CheckWildFiguresAreNotKept(scheduler_address, *joined);
  const int other_rank = 1 - me->rank();
  const std::string other = "worker-" + std::to_string(other_rank);
  const ShardMap& map = joined->view.shard_map();
  const ShardAssignment& shard = map.shards(0);
  auto as_member_data = ParameterServerData::NewStub(CreateChannel(shard.server_address(), member));
  // Once this member's own pull is served, the server serves the map (and knows us).
  for (const absl::Time give_up = absl::Now() + absl::Seconds(30);;) {
    Call call;
    PullRequest own;
    own.set_shard_id(shard.shard_id());
    own.set_epoch(map.epoch());
    own.set_worker_rank(me->rank());
    PullResponse values;
    const grpc::Status pulled = PullOneShard(*as_member_data, &call.context, own, &values);
    if (pulled.ok()) break;
    INFO(pulled.error_message());
    REQUIRE(absl::Now() < give_up);
    absl::SleepFor(absl::Milliseconds(50));
  }
  PushRequest push;
  push.set_shard_id(shard.shard_id());
  push.set_epoch(map.epoch());
  push.set_worker_rank(other_rank);
  push.set_step(1000000000000000);
  std::vector<float> poison(shard.end() - shard.begin(), 1e30f);
  AppendFloatsLittleEndian(poison, push.mutable_gradient());
  CheckServerRefusesOutsider(map, shard, push);
  CheckServerRefusesImpersonation(map, shard, member, as_member_data.get(), push, me, other_rank);
  auto member_scheduler = Scheduler::NewStub(CreateChannel(scheduler_address, member));
  CheckSchedulerLimitsMember(member_scheduler.get(), me, other);

  // This worker leaves the training to the real one, as a member may: it finishes.
  {
    Call call;
    ReportFinishedRequest finished;
    finished.set_node_name(me->node_name());
    ReportFinishedResponse response;
    REQUIRE(member_scheduler->ReportFinished(&call.context, finished, &response).ok());
  }
  const absl::Status done = (*cluster)->WaitForAll(absl::Seconds(120));
  INFO(done.ToString());
  REQUIRE(done.ok());
  const double accuracy = (*cluster)->FinalValue("test_accuracy");
  CHECK(accuracy > 0.5);
  CHECK(accuracy < 0.99);  // the job's own result, not the fake one
  const std::string log = (*cluster)->scheduler().ReadLog();
  CHECK(absl::StrContains(log, "refused a request from"));
  CHECK(log.find("declared dead") == std::string::npos);  // nobody was silenced or stalled
}

// A sync 2x2 job with a cluster token; `attack` (if set) runs once training has begun.
struct SyncRun {
  std::string weights;
  double accuracy = -1;
};
SyncRun RunSyncJob(const TempDir& dir,
                   const std::function<void(const std::string& scheduler)>& attack) {
  TestJob job;
  job.mode = "sync";
  job.shards = 4;
  job.max_steps = 600;
  job.cluster_token_file = dir.WriteSecretFile("cluster.token", kTestClusterToken);
  job.weights = dir.File("final.safetensors");
  const std::string config = dir.WriteFile("job.yaml", TestJobYaml(job));
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(config, dir.path(), 2, 2);
  REQUIRE(cluster.ok());
  if (attack) attack((*cluster)->scheduler_address());
  const absl::Status done = (*cluster)->WaitForAll(absl::Seconds(120));
  INFO(done.ToString());
  REQUIRE(done.ok());
  return SyncRun{ReadFileOrEmpty(job.weights), (*cluster)->FinalValue("test_accuracy")};
}

// Attacks the server of `shard` with `credentials`; `expect_refused` checks each reply.
void AttackShardServer(const ShardAssignment& shard, const ShardMap& map,
                       const std::shared_ptr<CallCredentials>& credentials,
                       const std::function<void(const grpc::Status&)>& expect_refused) {
  auto server = ParameterServer::NewStub(CreateChannel(shard.server_address(), credentials));
  auto data = ParameterServerData::NewStub(CreateChannel(shard.server_address(), credentials));
  {
    Call call;
    InstallShardMapRequest request;
    request.mutable_shard_map()->set_epoch(1000000);
    InstallShardMapResponse response;
    expect_refused(server->InstallShardMap(&call.context, request, &response));
  }
  {
    Call call;
    ReplicateRequest request;
    ShardLogBatch* batch = request.add_shards();
    batch->set_shard_id(shard.shard_id());
    batch->set_primary_name(shard.server_name());
    batch->set_epoch(map.epoch());
    ShardLogEntry* entry = batch->add_entries();
    entry->set_index(1);
    std::vector<float> nan(shard.end() - shard.begin(), std::numeric_limits<float>::quiet_NaN());
    AppendFloatsLittleEndian(nan, entry->mutable_sync_step()->mutable_mean_gradient());
    ReplicateResponse response;
    expect_refused(server->Replicate(&call.context, request, &response));
  }
  {
    Call call;
    PushRequest push;
    push.set_shard_id(shard.shard_id());
    push.set_epoch(map.epoch());
    push.set_worker_rank(0);
    push.set_step(0);
    AppendFloatsLittleEndian(std::vector<float>(shard.end() - shard.begin(), 1e30f),
                             push.mutable_gradient());
    PushResponse response;
    expect_refused(PushOneShard(*data, &call.context, push, &response));
  }
}

TEST_CASE(
    "attacks during a sync job, without the token or without a node credential: bit-identical "
    "weights") {
  TempDir reference_dir;
  const SyncRun reference = RunSyncJob(reference_dir, nullptr);
  REQUIRE_FALSE(reference.weights.empty());
  TempDir dir;
  int refused = 0, attempted = 0;
  const SyncRun attacked = RunSyncJob(dir, [&](const std::string& scheduler_address) {
    // A holder of the token reads the view (membership is all it needs) to aim at the
    // servers, once training has begun.
    auto reader = Scheduler::NewStub(
        CreateChannel(scheduler_address, std::make_shared<CallCredentials>(kTestClusterToken)));
    ClusterView view;
    for (const absl::Time give_up = absl::Now() + absl::Seconds(60);;) {
      Call call;
      view.Clear();
      if (reader->GetClusterView(&call.context, GetClusterViewRequest(), &view).ok() &&
          view.ready())
        break;
      REQUIRE(absl::Now() < give_up);
      absl::SleepFor(absl::Milliseconds(50));
    }
    absl::SleepFor(absl::Milliseconds(500));
    const ShardMap& map = view.shard_map();
    // Two attackers: an outsider with no token, and a token holder with no node credential.
    for (auto credentials : {std::shared_ptr<CallCredentials>(),
                             std::make_shared<CallCredentials>(kTestClusterToken)}) {
      auto expect_refused = [&](const grpc::Status& status) {
        ++attempted;
        const bool refusal = status.error_code() == grpc::StatusCode::UNAUTHENTICATED;
        refused += refusal;
        INFO(status.error_code() << ": " << status.error_message());
        CHECK(refusal);
      };
      for (const ShardAssignment& shard : map.shards()) {
        AttackShardServer(shard, map, credentials, expect_refused);
      }
      auto scheduler = Scheduler::NewStub(CreateChannel(scheduler_address, credentials));
      {
        Call call;
        ReportResultRequest fake;
        fake.set_node_name("worker-0");
        fake.set_test_accuracy(0.999);
        ReportResultResponse response;
        expect_refused(scheduler->ReportResult(&call.context, fake, &response));
      }
      {
        Call call;
        LeaveRequest leave;
        leave.set_node_name("ps-0");
        LeaveResponse response;
        expect_refused(scheduler->Leave(&call.context, leave, &response));
      }
      {
        Call call;
        HeartbeatRequest beat;
        beat.set_node_name("ps-1");
        HeartbeatResponse response;
        expect_refused(scheduler->Heartbeat(&call.context, beat, &response));
      }
    }
  });
  CHECK(attempted > 0);
  CHECK(refused == attempted);
  CHECK(attacked.weights == reference.weights);  // the job is unharmed, to the last bit
  CHECK(attacked.accuracy == reference.accuracy);
}

}  // namespace
}  // namespace paramserver