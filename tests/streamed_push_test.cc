// The worker's streamed push (training.push_bucket_kb) against real parameter
// servers over gRPC on 127.0.0.1: each bucket of finished shards is applied before the
// rest of the gradient is handed over, and the whole push ends as a push that pulls the next step.
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/rpc/rpc_endpoints.h"
#include "common/testing/test_credentials.h"
#include "ps/in_process_server.h"
#include "ps/parameter_server_service.h"
#include "ps/parameter_shard.h"
#include "worker/grpc_ps_client.h"

namespace paramserver {
namespace {

constexpr int64_t kParameters = 40;
constexpr int kShards = 4;  // [0, 10), [10, 20), [20, 30), [30, 40); shard i on server i % 2
constexpr int kServers = 2;

// Two servers holding the four shards of a one-worker sync job, and a client to them.
class StreamedPushCluster {
 public:
  explicit StreamedPushCluster(int64_t push_bucket_values) {
    std::vector<InProcessServer*> servers;
    for (int s = 0; s < kServers; ++s) {
      InProcessServerOptions server_options;
      server_options.name = absl::StrCat("ps-", s);
      server_options.callers = credentials_.verifier();
      absl::StatusOr<std::unique_ptr<InProcessServer>> server =
          InProcessServer::Start(server_options);
      REQUIRE(server.ok());
      servers_.push_back(*std::move(server));
      servers.push_back(servers_.back().get());
    }
    const ShardMap map = ServeEvenShards(servers, kParameters, kShards, TrainingMode::kSync,
                                         /*num_workers=*/1, /*initial_value=*/1.0f, &shards_);
    GrpcPsClientOptions options;
    options.total_parameters = kParameters;
    options.push_bucket_values = push_bucket_values;
    options.credentials = TestCredentials::As("worker-0");
    absl::StatusOr<std::unique_ptr<GrpcPsClient>> client =
        GrpcPsClient::Create(options, map, [map]() -> absl::StatusOr<ShardMap> { return map; });
    REQUIRE(client.ok());
    client_ = std::move(*client);
  }

  GrpcPsClient& client() { return *client_; }
  int64_t Applied(int shard) const { return shards_[shard]->counters().applied_updates; }
  std::vector<float> Values(int shard) const { return shards_[shard]->Snapshot().values; }

  // True once shard `shard` has applied `updates` updates (polls for up to 10 s).
  bool AwaitApplied(int shard, int64_t updates) const {
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (Applied(shard) < updates) {
      if (absl::Now() > give_up) return false;
      absl::SleepFor(absl::Milliseconds(2));
    }
    return true;
  }

 private:
  TestCredentials credentials_;
  std::vector<std::unique_ptr<InProcessServer>> servers_;
  std::vector<std::shared_ptr<ParameterShard>> shards_;
  std::unique_ptr<GrpcPsClient> client_;  // destroyed first: its calls end before the servers
};

TEST_CASE(
    "a streamed push sends each finished bucket at once, last shards first, and ends as "
    "a push that pulls the next step") {
  StreamedPushCluster cluster(/*push_bucket_values=*/10);
  const std::vector<float> gradient(kParameters, 0.5f);
  std::vector<float> next_params(kParameters, -1.0f);
  std::unique_ptr<StreamedPush> push = cluster.client().StartStreamedPush(
      {0, gradient, {}, {}, StepValues{absl::MakeSpan(next_params)}});

  push->Ready(30);  // shard 3 is finished
  CHECK(cluster.AwaitApplied(3, 1));
  for (int shard : {0, 1, 2}) CHECK(cluster.Applied(shard) == 0);

  push->Ready(25);  // shard 2 is not finished yet: nothing leaves
  absl::SleepFor(absl::Milliseconds(200));
  CHECK(cluster.Applied(2) == 0);

  push->Ready(10);  // shards 1 and 2: one bucket
  CHECK(cluster.AwaitApplied(1, 1));
  CHECK(cluster.AwaitApplied(2, 1));
  CHECK(cluster.Applied(0) == 0);
  CHECK(push->early_buckets() == 2);

  absl::StatusOr<bool> pulled_next = push->Finish();
  REQUIRE(pulled_next.ok());
  CHECK(*pulled_next);  // every shard sent step 1's values back
  for (int shard = 0; shard < kShards; ++shard) {
    INFO("shard " << shard);
    CHECK(cluster.Applied(shard) == 1);
    const std::vector<float> values = cluster.Values(shard);
    CHECK(std::equal(values.begin(), values.end(), next_params.begin() + shard * 10));
    // Adam's first step moves every parameter by the learning rate: 1 - 0.001.
    CHECK(values[0] == Approx(0.999f).epsilon(1e-6));
  }
}

TEST_CASE("a streamed push holds finished shards back until they fill a bucket") {
  StreamedPushCluster cluster(/*push_bucket_values=*/25);
  const std::vector<float> gradient(kParameters, 0.5f);
  std::unique_ptr<StreamedPush> push = cluster.client().StartStreamedPush({0, gradient});
  push->Ready(30);  // 10 values finished: less than a bucket
  absl::SleepFor(absl::Milliseconds(200));
  CHECK(cluster.Applied(3) == 0);
  push->Ready(10);  // 30 values: shards 1..3 leave together
  for (int shard : {1, 2, 3}) CHECK(cluster.AwaitApplied(shard, 1));
  CHECK(cluster.Applied(0) == 0);
  CHECK(push->early_buckets() == 1);
  absl::StatusOr<bool> pulled_next = push->Finish();
  REQUIRE(pulled_next.ok());
  CHECK_FALSE(*pulled_next);  // none asked for
  CHECK(cluster.Applied(0) == 1);
}

TEST_CASE("a streamed push dropped before Finish sends nothing more") {
  StreamedPushCluster cluster(/*push_bucket_values=*/10);
  const std::vector<float> gradient(kParameters, 0.5f);
  std::vector<float> next_params(kParameters);
  {
    std::unique_ptr<StreamedPush> push = cluster.client().StartStreamedPush(
        {0, gradient, {}, {}, StepValues{absl::MakeSpan(next_params)}});
    push->Ready(30);
  }  // waits for shard 3's call
  CHECK(cluster.Applied(3) == 1);
  absl::SleepFor(absl::Milliseconds(200));
  for (int shard : {0, 1, 2}) CHECK(cluster.Applied(shard) == 0);
}

TEST_CASE("a worker of a model without tables refuses embedding shards, naming them") {
  ShardMap map;
  map.set_epoch(3);
  ShardAssignment* dense = map.add_shards();
  dense->set_shard_id(0);
  dense->set_end(kParameters);
  dense->set_server_address("127.0.0.1:1");
  ShardAssignment* rows = map.add_shards();
  rows->set_shard_id(1);
  rows->set_kind(SHARD_KIND_EMBEDDING_ROWS);
  rows->set_embedding_buckets(1);
  GrpcPsClientOptions options;
  options.total_parameters = kParameters;
  options.credentials = TestCredentials::As("worker-0");
  const absl::Status refused =
      GrpcPsClient::Create(options, map, [map]() -> absl::StatusOr<ShardMap> {
        return map;
      }).status();
  CHECK(refused.code() == absl::StatusCode::kInvalidArgument);
  CHECK(refused.message() ==
        "the shard map (epoch 3) gives shard 1 embedding rows, but this worker's model has no "
        "embedding tables");
}

}  // namespace
}  // namespace paramserver
