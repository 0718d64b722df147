// The hand-made wire forms against protobuf's own: what EncodePushShards writes parses
// as the message protobuf would build, and DecodeShardsReply reads what protobuf writes.
#include "worker/shard_call_codec.h"

#include "catch2/catch.hpp"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/support/slice.h"

namespace paramserver {
namespace {

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  REQUIRE(buffer.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& slice : slices)
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  return bytes;
}

grpc::ByteBuffer BufferOf(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

PushRequest Header(int shard, WireDtype encoding) {
  PushRequest header;
  header.set_shard_id(shard);
  header.set_epoch(7);
  header.set_worker_rank(1);
  header.set_step(123456789012LL);
  header.set_pull_next(true);
  header.set_encoding(static_cast<WireEncoding>(encoding));
  return header;
}

TEST_CASE("a hand-encoded PushShards request is the message protobuf would build") {
  const std::vector<float> gradient = {0.5f, -1.25f, 3.0e-8f, 65504.0f, -0.0f, 1.0f / 3.0f};
  for (WireDtype encoding : {WireDtype::kFloat32, WireDtype::kBfloat16, WireDtype::kFloat16}) {
    std::vector<PushPart> parts = {
        {Header(3, encoding), absl::MakeConstSpan(gradient).subspan(0, 2)},
        {Header(9, encoding), absl::MakeConstSpan(gradient).subspan(2)}};
    PushShardsRequest parsed;
    REQUIRE(parsed.ParseFromString(Flatten(EncodePushShards(parts, encoding))));

    PushShardsRequest expected;
    for (const PushPart& part : parts) {
      PushRequest* shard = expected.add_shards();
      *shard = part.header;
      AppendEncoded(encoding, part.gradient, shard->mutable_gradient());
    }
    INFO("encoding " << WireDtypeName(encoding));
    CHECK(google::protobuf::util::MessageDifferencer::Equals(parsed, expected));
  }
}

TEST_CASE("replies written by protobuf are read field by field, values straight into place") {
  PullShardsResponse pull;
  std::vector<float> first = {1, 2, 3}, second = {-4, 5e-3f};
  for (const auto& [values, start] : {std::pair{first, 11}, std::pair{second, 12}}) {
    PullResponse* part = pull.add_shards();
    part->set_shard_id(start);
    part->set_applied_updates(100 + start);
    part->set_start_step(start);
    AppendEncoded(WireDtype::kFloat32, values, part->mutable_values());
  }
  std::vector<float> a(3), b(2);
  grpc::ByteBuffer pull_bytes = BufferOf(pull.SerializeAsString());
  absl::StatusOr<std::vector<ReplyPart>> pulled =
      DecodeShardsReply(ReplyKind::kPull, &pull_bytes, WireDtype::kFloat32,
                        {absl::MakeSpan(a), absl::MakeSpan(b)}, "ps-0");
  REQUIRE(pulled.ok());
  CHECK(a == first);
  CHECK(b == second);
  CHECK((*pulled)[1].start_step == 12);
  CHECK((*pulled)[0].applied_updates == 111);

  PushShardsResponse push;
  PushResponse* done = push.add_shards();
  done->set_duplicate(true);
  done->set_applied_updates(5);
  done->set_pulled(true);
  AppendEncoded(WireDtype::kBfloat16, first, done->mutable_values());
  PushResponse* waiting = push.add_shards();
  waiting->set_applied_updates(6);
  waiting->set_pull_error("DEADLINE_EXCEEDED: shard 2 waits for worker 1");
  // A field this version does not know (a newer server) is skipped.
  std::string bytes =
      push.SerializeAsString() + std::string("\x98\x06\x01", 3);  // field 99, varint 1
  std::vector<float> c(3, -1.0f), d(2, -1.0f);
  grpc::ByteBuffer push_bytes = BufferOf(bytes);
  absl::StatusOr<std::vector<ReplyPart>> pushed =
      DecodeShardsReply(ReplyKind::kPush, &push_bytes, WireDtype::kBfloat16,
                        {absl::MakeSpan(c), absl::MakeSpan(d)}, "ps-1");
  REQUIRE(pushed.ok());
  CHECK((*pushed)[0].duplicate);
  CHECK((*pushed)[0].pulled);
  CHECK((*pushed)[0].has_values);
  CHECK(c == first);  // 1, 2, 3 are bfloat16 values: exact
  CHECK_FALSE((*pushed)[1].pulled);
  CHECK_FALSE((*pushed)[1].has_values);
  CHECK((*pushed)[1].pull_error == "DEADLINE_EXCEEDED: shard 2 waits for worker 1");
  CHECK(d == std::vector<float>{-1.0f, -1.0f});  // untouched
}

TEST_CASE("a malformed reply is an error naming the server, not a crash") {
  PullShardsResponse pull;
  AppendEncoded(WireDtype::kFloat32, std::vector<float>{1, 2}, pull.add_shards()->mutable_values());
  std::vector<float> three(3), two(2);

  grpc::ByteBuffer wrong_size = BufferOf(pull.SerializeAsString());
  absl::Status status = DecodeShardsReply(ReplyKind::kPull, &wrong_size, WireDtype::kFloat32,
                                          {absl::MakeSpan(three)}, "ps-3")
                            .status();
  CHECK(status.code() == absl::StatusCode::kInternal);
  CHECK(status.message() ==
        "malformed PullShards reply from ps-3: part 0 has 8 bytes of values; 12 expected");

  grpc::ByteBuffer too_few = BufferOf(pull.SerializeAsString());
  status = DecodeShardsReply(ReplyKind::kPull, &too_few, WireDtype::kFloat32,
                             {absl::MakeSpan(two), absl::MakeSpan(three)}, "ps-3")
               .status();
  CHECK(status.message() == "malformed PullShards reply from ps-3: 1 parts for the 2 asked");

  std::string truncated = pull.SerializeAsString();
  truncated.resize(truncated.size() - 3);
  grpc::ByteBuffer cut = BufferOf(truncated);
  CHECK(
      DecodeShardsReply(ReplyKind::kPull, &cut, WireDtype::kFloat32, {absl::MakeSpan(two)}, "ps-3")
          .status()
          .code() == absl::StatusCode::kInternal);

  grpc::ByteBuffer garbage =
      BufferOf(std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 11));
  CHECK(DecodeShardsReply(ReplyKind::kPush, &garbage, WireDtype::kFloat32, {absl::MakeSpan(two)},
                          "ps-3")
            .status()
            .code() == absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace paramserver
