// The data calls' wire through a real gRPC server on 127.0.0.1: encodings, raw parts.
#include <atomic>
#include <limits>
#include <thread>

#include "ps/service_testing.h"

namespace paramserver {
namespace {

using namespace service_testing;  // NOLINT: the shared fixture of these tests

using google::protobuf::internal::WireFormatLite;

TEST_CASE("tensors travel in the request's encoding; the server keeps float32") {
  ServerFixture server;
  server.Install();
  PushRequest push;
  push.set_shard_id(4);
  push.set_epoch(5);
  push.set_encoding(WIRE_BFLOAT16);
  push.set_pull_next(true);
  AppendEncoded(WireDtype::kBfloat16, {0.5f, -0.25f, 0.0f}, push.mutable_gradient());
  PushResponse pushed;
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    REQUIRE(PushOneShard(*server.data_stub_, &context, push, &pushed).ok());
  }
  REQUIRE(pushed.pulled());
  CHECK(pushed.values().size() == 3 * 2);  // bfloat16: two bytes a value

  PullResponse exact;
  REQUIRE(server.Pull(4, 5, &exact).ok());  // float32
  std::vector<float> full(3), half(3);
  REQUIRE(DecodeFloatsExactly(exact.values(), absl::MakeSpan(full), "float32").ok());
  REQUIRE(
      DecodeExactly(WireDtype::kBfloat16, pushed.values(), absl::MakeSpan(half), "bfloat16").ok());
  for (int i = 0; i < 3; ++i) {
    CHECK(half[i] == Bfloat16ToFloat(FloatToBfloat16(full[i])));
  }
  CHECK(full[0] != half[0]);  // 1 - 0.001 is not a bfloat16: the server kept more bits

  push.set_step(1);
  push.set_encoding(static_cast<WireEncoding>(7));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  CHECK(Says(PushOneShard(*server.data_stub_, &context, push, &pushed),
             grpc::StatusCode::INVALID_ARGUMENT, "unknown tensor encoding 7"));
  push.set_encoding(WIRE_FLOAT16);
  push.set_gradient(std::string(5, '\0'));
  grpc::ClientContext again;
  again.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  CHECK(Says(PushOneShard(*server.data_stub_, &again, push, &pushed),
             grpc::StatusCode::INVALID_ARGUMENT,
             "expected 3 float16 values (6 bytes), got 5 bytes"));
}

// A PushShards request of one part whose bytes are `part`.
std::string OnePart(const std::string& part) {
  std::string request;
  google::protobuf::io::StringOutputStream stream(&request);
  google::protobuf::io::CodedOutputStream out(&stream);
  WireFormatLite::WriteBytes(1, part, &out);
  out.Trim();
  return request;
}

// PushRequest fields in wire form: shard 4, epoch 5, worker 0, step 0.
std::string PushHeader() {
  std::string part;
  google::protobuf::io::StringOutputStream stream(&part);
  google::protobuf::io::CodedOutputStream out(&stream);
  WireFormatLite::WriteInt32(1, 4, &out);
  WireFormatLite::WriteInt64(2, 5, &out);
  WireFormatLite::WriteInt32(3, 0, &out);
  WireFormatLite::WriteInt64(4, 0, &out);
  out.Trim();
  return part;
}

std::string Varint(uint64_t value) {
  std::string bytes;
  google::protobuf::io::StringOutputStream stream(&bytes);
  google::protobuf::io::CodedOutputStream out(&stream);
  out.WriteVarint64(value);
  out.Trim();
  return bytes;
}

TEST_CASE(
    "strict with peers: lengths past the end, varints wider than their field, more parts than "
    "shards") {
  ServerFixture server;
  server.Install();
  server.ActAs("worker-0");
  const std::string gradient = Floats({0.5f, -0.5f, 0.25f});
  std::string good_part = PushHeader();
  {
    google::protobuf::io::StringOutputStream stream(&good_part);
    google::protobuf::io::CodedOutputStream out(&stream);
    WireFormatLite::WriteBytes(5, gradient, &out);
  }
  // A part that declares more bytes than the message has: refused, nothing applied.
  const std::string whole = OnePart(good_part);
  std::string long_part = std::string("\x0a") + Varint(good_part.size() + 1000) + good_part;
  CHECK(Says(server.RawCall(kPushShardsMethod, long_part), grpc::StatusCode::INVALID_ARGUMENT,
             "part 0 declares " + std::to_string(good_part.size() + 1000) +
                 " bytes but the message ends after " + std::to_string(good_part.size())));
  // A part length wider than 31 bits.
  CHECK(Says(server.RawCall(kPushShardsMethod,
                            std::string("\x0a") + Varint(uint64_t{1} << 40) + good_part),
             grpc::StatusCode::INVALID_ARGUMENT, "part 0 declares 1099511627776 bytes"));
  // A gradient length of 2^40: named as it is, not truncated to 32 bits.
  CHECK(Says(server.RawCall(kPushShardsMethod,
                            OnePart(PushHeader() + "\x2a" + Varint(uint64_t{1} << 40) + gradient)),
             grpc::StatusCode::INVALID_ARGUMENT,
             "malformed PushShards request: a gradient of 1099511627776 bytes"));
  // worker_rank (int32) holding 2^33.
  CHECK(Says(
      server.RawCall(kPushShardsMethod, OnePart(PushHeader() + "\x18" + Varint(uint64_t{1} << 33))),
      grpc::StatusCode::INVALID_ARGUMENT, "field 3 holds 8589934592, wider than its 32 bits"));
  // One part per shard, and no more parts than the server holds.
  CHECK(Says(server.RawCall(kPushShardsMethod, whole + whole), grpc::StatusCode::INVALID_ARGUMENT,
             "a push of 2 parts: ps-7 holds 1 shards"));
  PullShardsRequest many;
  for (int i = 0; i < 20000; ++i) {
    PullRequest* part = many.add_shards();
    part->set_shard_id(4);
    part->set_epoch(5);
  }
  CHECK(Says(server.RawCall(kPullShardsMethod, many.SerializeAsString()),
             grpc::StatusCode::INVALID_ARGUMENT, "a pull of 20000 parts: ps-7 holds 1 shards"));
  // Routed with a newer map, which may give this server more shards: refused as a newer
  // epoch is (the worker retries once the server has the map), not as malformed.
  PullShardsRequest newer;
  for (int shard : {4, 5}) {
    PullRequest* part = newer.add_shards();
    part->set_shard_id(shard);
    part->set_epoch(6);
  }
  CHECK(Says(server.RawCall(kPullShardsMethod, newer.SerializeAsString()),
             grpc::StatusCode::FAILED_PRECONDITION, "future epoch 6"));
  CHECK(server.service_.shards().at(4).shard->counters().applied_updates == 0);
  REQUIRE(server.RawCall(kPushShardsMethod, whole).ok());  // and it still serves
  CHECK(server.service_.shards().at(4).shard->counters().applied_updates == 1);
}

}  // namespace
}  // namespace paramserver
