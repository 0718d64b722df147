// A member that pushes, as itself, gradients whose squares overflow float32 (1e20 and
// 3.5e19, both finite) into a real job (a scheduler and two servers as processes on
// 127.0.0.1 with a cluster token, one real worker; this test is the other worker). Each
// push is refused naming the element, and the job's final weights are those of the same
// job where the member pushed nothing, to the last bit.
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "common/rpc/heartbeat_sender.h"
#include "common/rpc/rpc_endpoints.h"
#include "common/rpc/scheduler_client.h"
#include "common/testing/local_cluster.h"
#include "common/testing/one_shard_calls.h"
#include "common/testing/temp_dir.h"
#include "common/wire/tensor_codec.h"
#include "proto/parameter_server.grpc.pb.h"
#include "tests/cluster_config.h"
#include "tests/joined_member.h"

namespace paramserver {
namespace {

struct Run {
  std::string weights;
  std::string server_logs;
};

// An async job of two workers on two servers whose rank 1 is this test: it joins as a
// member, runs `as_member` (with its rank, the map and its credentials), and reports
// that it has finished, leaving the training to the real rank 0 (alone, so the job is
// deterministic: one worker's pushes and pulls, in order).
Run RunJob(const TempDir& dir,
           const std::function<void(int rank, const ShardMap& map,
                                    std::shared_ptr<CallCredentials> member)>& as_member) {
  TestJob job;
  job.mode = "async";
  job.servers = 2;
  job.workers = 2;
  job.shards = 4;
  job.max_steps = 200;
  job.cluster_token_file = dir.WriteSecretFile("cluster.token", kTestClusterToken);
  job.weights = dir.File("final.safetensors");
  const std::string config = dir.WriteFile("job.yaml", TestJobYaml(job));
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(config, dir.path(), 2, 1);
  REQUIRE(cluster.ok());
  const std::unique_ptr<JoinedMember> joined =
      JoinAsLastWorker((*cluster)->scheduler_address(), kTestClusterToken, /*workers_before=*/1,
                       absl::Milliseconds(job.heartbeat_interval_ms));
  const std::shared_ptr<CallCredentials>& member = joined->credentials;
  const RegisterResponse* me = &joined->registration;
  const ClusterView* view = &joined->view;
  as_member(me->rank(), view->shard_map(), member);
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    ReportFinishedRequest finished;
    finished.set_node_name(me->node_name());
    ReportFinishedResponse response;
    auto stub = Scheduler::NewStub(CreateChannel((*cluster)->scheduler_address(), member));
    REQUIRE(stub->ReportFinished(&context, finished, &response).ok());
  }
  const absl::Status done = (*cluster)->WaitForAll(absl::Seconds(120));
  INFO(done.ToString());
  REQUIRE(done.ok());
  Run run{ReadFileOrEmpty(job.weights), ""};
  for (const ChildProcess& process : (*cluster)->processes()) run.server_logs += process.ReadLog();
  return run;
}

// This member's push of `value` at element 1 of `shard`, for its step 0, as itself.
grpc::Status PushAsMember(const ShardAssignment& shard, int64_t epoch, int rank, float value,
                          const std::shared_ptr<CallCredentials>& member) {
  auto server = ParameterServerData::NewStub(CreateChannel(shard.server_address(), member));
  PushRequest push;
  push.set_shard_id(shard.shard_id());
  push.set_epoch(epoch);
  push.set_worker_rank(rank);
  push.set_step(0);
  std::vector<float> gradient(shard.end() - shard.begin(), 0.01f);
  gradient[1] = value;
  AppendFloatsLittleEndian(gradient, push.mutable_gradient());
  for (const absl::Time give_up = absl::Now() + absl::Seconds(30);;) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    PushResponse response;
    const grpc::Status status = PushOneShard(*server, &context, push, &response);
    // Until the server serves the map it answers FAILED_PRECONDITION or UNAVAILABLE.
    if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT || status.ok() ||
        absl::Now() > give_up)
      return status;
    absl::SleepFor(absl::Milliseconds(50));
  }
}

TEST_CASE("a member's overflowing gradients are refused naming the element; weights unchanged") {
  TempDir reference_dir;
  const Run reference =
      RunJob(reference_dir, [](int, const ShardMap&, std::shared_ptr<CallCredentials>) {});
  REQUIRE_FALSE(reference.weights.empty());
  TempDir dir;
  int refused = 0;
  const Run attacked = RunJob(dir, [&](int rank, const ShardMap& map,
                                       std::shared_ptr<CallCredentials> member) {
    for (const ShardAssignment& shard : map.shards()) {
      for (float value : {1e20f, 3.5e19f}) {
        const grpc::Status status = PushAsMember(shard, map.epoch(), rank, value, member);
        INFO(status.error_code() << ": " << status.error_message());
        CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
        const std::string value_text = value == 1e20f ? "is 1e+20" : "is 3.5e+19";
        CHECK(absl::StrContains(status.error_message(),
                                absl::StrCat("shard ", shard.shard_id(), ": gradient[1] of worker ",
                                             rank, " for step 0 ", value_text)));
        refused += status.error_code() == grpc::StatusCode::INVALID_ARGUMENT;
      }
    }
  });
  CHECK(refused == 8);  // 4 shards, 2 pushes each
  CHECK(absl::StrContains(attacked.server_logs, "refused a push: shard"));
  REQUIRE_FALSE(attacked.weights.empty());
  CHECK(attacked.weights == reference.weights);  // the job is unharmed, to the last bit
}

}  // namespace
}  // namespace paramserver
