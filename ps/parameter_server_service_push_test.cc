// Pushes through a real gRPC server on 127.0.0.1: embedding rows, repeats, pull_next.
#include <atomic>
#include <limits>
#include <thread>

#include "ps/service_testing.h"

namespace paramserver {
namespace {

using namespace service_testing;  // NOLINT: the shared fixture of these tests
using google::protobuf::internal::WireFormatLite;

std::shared_ptr<ParameterShard> SgdEmbeddingShard() {
  auto embedding = std::make_shared<EmbeddingShardOptions>();
  embedding->shape = {{1, 1}, 0, 2};
  for (int t = 0; t < 2; ++t) {
    EmbeddingTableOptions table;
    table.dim = 1;
    table.optimizer.type = EmbeddingOptimizerType::kSgd;
    table.optimizer.learning_rate = 0.5;
    table.table_index = t;
    embedding->tables.push_back(table);
  }
  ParameterShardOptions options;
  options.shard_id = 4;
  options.mode = TrainingMode::kSync;
  options.num_workers = 2;
  options.embedding = embedding;
  return std::make_shared<ParameterShard>(options, std::vector<float>());
}

// The first ids of table 0 on bucket 0 of 2, and one on bucket 1.
std::vector<int64_t> BucketIds(int bucket, int n) {
  std::vector<int64_t> ids;
  for (int64_t id = 1; static_cast<int>(ids.size()) < n; ++id) {
    if (EmbeddingShardOf(0, id, 2) == bucket) ids.push_back(id);
  }
  return ids;
}

TEST_CASE("embedding pushes with pull_next: the step's mean applied, the rows asked for sent") {
  ServerFixture server;
  std::map<int, ServedShard> shards;
  shards[4].shard = SgdEmbeddingShard();
  shards[4].primary_name = "ps-7";
  server.service_.InstallShards("ps-7", 5, std::move(shards));
  const std::vector<int64_t> ours = BucketIds(0, 2);
  const auto request = [&](int worker, int64_t step, std::vector<int64_t> ids,
                           std::vector<float> gradient, bool pull_next) {
    PushRequest push;
    push.set_shard_id(4);
    push.set_epoch(5);
    push.set_worker_rank(worker);
    push.set_step(step);
    push.set_ids(EncodeIds(ids));
    push.add_id_counts(static_cast<int32_t>(ids.size()));
    push.add_id_counts(0);
    push.set_gradient(Floats(gradient));
    push.set_pull_next(pull_next);
    return push;
  };
  const auto call = [&](const PushRequest& push, PushResponse* response) {
    server.ActAs("worker-" + std::to_string(push.worker_rank()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return PushOneShard(*server.data_stub_, &context, push, response);
  };
  // Ids that are not this shard's are refused before anything is taken.
  PushResponse response;
  CHECK(Says(call(request(0, 0, BucketIds(1, 1), {1}, true), &response),
             grpc::StatusCode::INVALID_ARGUMENT, "embedding shard 4: table C1: id"));
  // Each step, worker 1 pushes rows ours[0] and ours[1] (gradients 4, 6) and worker 0
  // row ours[0] (2): the mean is (2 + 4) / 2 = 3 for ours[0] and 6 / 2 = 3 for ours[1]
  // (worker 0 adds zero), and SGD at 0.5 takes 1.5 from each row.
  const float initial0 = InitialEmbeddingValue(1, 0, ours[0], 0);
  const float initial1 = InitialEmbeddingValue(1, 0, ours[1], 0);
  // Step 0: the last push asks for other rows next (next_ids): it gets those.
  REQUIRE(call(request(1, 0, {ours[0], ours[1]}, {4, 6}, false), &response).ok());
  PushRequest asks_for_next = request(0, 0, {ours[0]}, {2}, true);
  asks_for_next.set_next_ids(EncodeIds({ours[1]}));
  asks_for_next.add_next_id_counts(1);
  asks_for_next.add_next_id_counts(0);
  REQUIRE(call(asks_for_next, &response).ok());
  CHECK(response.pulled());
  CHECK(response.applied_updates() == 1);
  CHECK(response.values() == Floats({initial1 - 1.5f}));
  // Step 1: the last push names no next rows: it gets the rows it pushed.
  REQUIRE(call(request(0, 1, {ours[0]}, {2}, false), &response).ok());
  REQUIRE(call(request(1, 1, {ours[0], ours[1]}, {4, 6}, true), &response).ok());
  CHECK(response.pulled());
  CHECK(response.applied_updates() == 2);
  CHECK(response.values() == Floats({initial0 - 1.5f - 1.5f, initial1 - 1.5f - 1.5f}));
}

TEST_CASE("the push handler called twice applies the update once") {
  ServerFixture server;
  server.Install();
  PushResponse first, second;
  REQUIRE(server.Push(4, 5, 1, 0, Floats({1, 1, 1}), &first).ok());
  REQUIRE(server.Push(4, 5, 1, 0, Floats({1, 1, 1}), &second).ok());
  CHECK_FALSE(first.duplicate());
  CHECK(second.duplicate());
  CHECK(second.applied_updates() == 1);
}

TEST_CASE("a push asked to pull next carries back exactly what a pull of the next step returns") {
  ServerFixture server;
  server.Install();
  PushResponse pushed;
  REQUIRE(
      server.PushAndPullNext(0, 0, Floats({0.5f, -0.5f, 0.0f}), absl::Seconds(5), &pushed).ok());
  CHECK_FALSE(pushed.duplicate());
  REQUIRE(pushed.pulled());
  PullResponse pulled;
  REQUIRE(server.Pull(4, 5, &pulled).ok());
  CHECK(pushed.values() == pulled.values());  // byte for byte
  std::vector<float> values(3);
  REQUIRE(DecodeFloatsExactly(pushed.values(), absl::MakeSpan(values), "values").ok());
  // Adam's first step moves a parameter by about lr = 0.001 against its gradient's sign.
  CHECK(values[0] == Approx(1.0 - 0.001).epsilon(1e-6));
  CHECK(values[1] == Approx(2.0 + 0.001).epsilon(1e-6));
  CHECK(values[2] == 3.0f);
}

TEST_CASE(
    "in sync mode the pull half waits for the other workers, and its timing out does not fail the "
    "push") {
  ServerFixture server;
  server.Install(TrainingMode::kSync);
  PushResponse first;
  REQUIRE(server.PushAndPullNext(0, 0, Floats({1, 1, 1}), absl::Milliseconds(600), &first).ok());
  CHECK_FALSE(first.duplicate());
  CHECK_FALSE(first.pulled());
  CHECK(first.values().empty());
  CHECK(first.pull_error().find("DEADLINE_EXCEEDED") != std::string::npos);

  PushResponse second;
  REQUIRE(server.PushAndPullNext(1, 0, Floats({1, 1, 1}), absl::Seconds(5), &second).ok());
  REQUIRE(second.pulled());
  std::vector<float> values(3);
  REQUIRE(DecodeFloatsExactly(second.values(), absl::MakeSpan(values), "values").ok());
  CHECK(values[0] == Approx(1.0 - 0.001).epsilon(1e-6));  // the step both pushes completed

  // The retried first push (its reply was lost, say) is a duplicate and now pulls.
  PushResponse retried;
  REQUIRE(server.PushAndPullNext(0, 0, Floats({1, 1, 1}), absl::Seconds(5), &retried).ok());
  CHECK(retried.duplicate());
  REQUIRE(retried.pulled());
  CHECK(retried.values() == second.values());
}

TEST_CASE(
    "one call serves every shard of the server, and the first bad part fails it naming that "
    "shard") {
  ServerFixture server;
  ParameterShardOptions options;
  options.mode = TrainingMode::kAsync;
  options.num_workers = 1;
  std::map<int, ServedShard> shards;
  for (int id : {4, 6}) {
    options.shard_id = id;
    options.range = id == 4 ? ParameterRange{0, 2} : ParameterRange{2, 5};
    shards[id].shard =
        std::make_shared<ParameterShard>(options, std::vector<float>(options.range.size(), 1.0f));
  }
  server.service_.InstallShards("ps-7", /*epoch=*/5, std::move(shards));

  auto push = [&](int64_t step, const std::vector<std::pair<int, std::string>>& parts,
                  PushShardsResponse* response) {
    PushShardsRequest request;
    for (const auto& [id, gradient] : parts) {
      PushRequest* part = request.add_shards();
      part->set_shard_id(id);
      part->set_epoch(5);
      part->set_step(step);
      part->set_gradient(gradient);
      part->set_pull_next(true);
    }
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return server.data_stub_->PushShards(&context, request, response);
  };
  PushShardsResponse pushed;
  REQUIRE(push(0, {{4, Floats({1, -1})}, {6, Floats({1, 1, -1})}}, &pushed).ok());
  REQUIRE(pushed.shards_size() == 2);
  std::vector<float> first(2), second(3);
  REQUIRE(pushed.shards(0).pulled());
  REQUIRE(pushed.shards(1).pulled());
  REQUIRE(DecodeFloatsExactly(pushed.shards(0).values(), absl::MakeSpan(first), "shard 4").ok());
  REQUIRE(DecodeFloatsExactly(pushed.shards(1).values(), absl::MakeSpan(second), "shard 6").ok());
  CHECK(first[0] < 1.0f);
  CHECK(first[1] > 1.0f);
  CHECK(second[2] > 1.0f);

  PullShardsRequest pull;
  for (int id : {4, 6}) {
    PullRequest* part = pull.add_shards();
    part->set_shard_id(id);
    part->set_epoch(5);
    part->set_step(1);
  }
  PullShardsResponse pulled;
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    REQUIRE(server.data_stub_->PullShards(&context, pull, &pulled).ok());
  }
  REQUIRE(pulled.shards_size() == 2);
  CHECK(pulled.shards(0).shard_id() == 4);
  CHECK(pulled.shards(0).values() == pushed.shards(0).values());
  CHECK(pulled.shards(1).values() == pushed.shards(1).values());

  // Step 1: shard 4's part is good, shard 6's has the wrong size. The call fails naming
  // shard 6; shard 4's part stands, and is a duplicate when the corrected call comes.
  PushShardsResponse refused;
  CHECK(Says(push(1, {{4, Floats({1, 1})}, {6, Floats({1})}}, &refused),
             grpc::StatusCode::INVALID_ARGUMENT, "gradient for shard 6"));
  PushShardsResponse retried;
  REQUIRE(push(1, {{4, Floats({1, 1})}, {6, Floats({1, 1, 1})}}, &retried).ok());
  CHECK(retried.shards(0).duplicate());
  CHECK_FALSE(retried.shards(1).duplicate());
  CHECK(retried.shards(0).applied_updates() == 2);
  CHECK(retried.shards(1).applied_updates() == 2);
}

TEST_CASE(
    "PushShards and PullShards read any protobuf encoding of their messages and refuse what is not "
    "one") {
  ServerFixture server;
  server.Install();
  CHECK(Says(server.RawCall(kPushShardsMethod, kGarbage), grpc::StatusCode::INVALID_ARGUMENT,
             "malformed PushShards request"));
  CHECK(Says(server.RawCall(kPullShardsMethod, kGarbage), grpc::StatusCode::INVALID_ARGUMENT,
             "malformed PullShards request"));
  // A part ending inside its gradient.
  std::string truncated;
  {
    google::protobuf::io::StringOutputStream stream(&truncated);
    google::protobuf::io::CodedOutputStream out(&stream);
    out.WriteTag(WireFormatLite::MakeTag(1, WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
    out.WriteVarint32(4);
    out.WriteTag(WireFormatLite::MakeTag(5, WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
    out.WriteVarint32(12);
    out.WriteRaw("ab", 2);
  }
  CHECK(Says(server.RawCall(kPushShardsMethod, truncated), grpc::StatusCode::INVALID_ARGUMENT,
             "malformed PushShards request"));

  // One part with its fields in reverse order, the gradient in the middle, and a field
  // this server does not know: protobuf reads that, so must the server.
  const std::string gradient = Floats({0.5f, -0.5f, 0.25f});
  std::string request;
  {
    std::string part;
    google::protobuf::io::StringOutputStream part_stream(&part);
    google::protobuf::io::CodedOutputStream out(&part_stream);
    WireFormatLite::WriteInt64(99, 12345, &out);  // unknown
    WireFormatLite::WriteEnum(7, WIRE_FLOAT32, &out);
    WireFormatLite::WriteBool(6, true, &out);  // pull_next
    WireFormatLite::WriteBytes(5, gradient, &out);
    WireFormatLite::WriteInt64(4, 0, &out);  // step
    WireFormatLite::WriteInt32(3, 1, &out);  // worker_rank
    WireFormatLite::WriteInt64(2, 5, &out);  // epoch
    WireFormatLite::WriteInt32(1, 4, &out);  // shard_id
    out.Trim();
    google::protobuf::io::StringOutputStream stream(&request);
    google::protobuf::io::CodedOutputStream request_out(&stream);
    WireFormatLite::WriteBytes(1, part, &request_out);
  }
  std::string reply_bytes;
  server.ActAs("worker-1");
  REQUIRE(server.RawCall(kPushShardsMethod, request, &reply_bytes).ok());
  PushShardsResponse reply;
  REQUIRE(reply.ParseFromString(reply_bytes));
  REQUIRE(reply.shards_size() == 1);
  CHECK_FALSE(reply.shards(0).duplicate());
  CHECK(reply.shards(0).applied_updates() == 1);
  REQUIRE(reply.shards(0).pulled());
  PullResponse pulled;
  REQUIRE(server.Pull(4, 5, &pulled).ok());
  CHECK(pulled.applied_updates() == 1);
  CHECK(reply.shards(0).values() == pulled.values());  // the values after worker 1's push
  std::vector<float> values(3);
  REQUIRE(DecodeFloatsExactly(pulled.values(), absl::MakeSpan(values), "values").ok());
  CHECK(values[0] < 1.0f);  // moved against a positive gradient
  CHECK(values[1] > 2.0f);
}

}  // namespace
}  // namespace paramserver
