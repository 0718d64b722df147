// The data calls' wire format: each message's encode and decode round-trip, the
// hand-made forms against protobuf's own (what the encoders write parses as the message
// protobuf would build, and the decoders read what protobuf writes), and malformed
// input of each kind refused with a clear error.
#include "common/wire/shard_call_codec.h"

#include "catch2/catch.hpp"
#include "common/testing/byte_buffers.h"
#include "common/wire/sparse_rows.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/support/slice.h"

namespace paramserver {
namespace {

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
    REQUIRE(parsed.ParseFromString(BytesOf(EncodePushShards(parts, encoding))));

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
  grpc::ByteBuffer pull_bytes = ByteBufferOf(pull.SerializeAsString());
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
  waiting->set_late(true);
  waiting->set_pull_error("DEADLINE_EXCEEDED: shard 2 waits for worker 1");
  waiting->set_step_sum_squares(0.1 + 1e-17);  // a clipped step's: every bit matters
  // A field this version does not know (a newer server) is skipped.
  std::string bytes =
      push.SerializeAsString() + std::string("\x98\x06\x01", 3);  // field 99, varint 1
  std::vector<float> c(3, -1.0f), d(2, -1.0f);
  grpc::ByteBuffer push_bytes = ByteBufferOf(bytes);
  absl::StatusOr<std::vector<ReplyPart>> pushed =
      DecodeShardsReply(ReplyKind::kPush, &push_bytes, WireDtype::kBfloat16,
                        {absl::MakeSpan(c), absl::MakeSpan(d)}, "ps-1");
  REQUIRE(pushed.ok());
  CHECK((*pushed)[0].duplicate);
  CHECK_FALSE((*pushed)[0].late);
  CHECK((*pushed)[1].late);
  CHECK((*pushed)[1].applied_updates == 6);
  CHECK((*pushed)[0].pulled);
  CHECK((*pushed)[0].has_values);
  CHECK(c == first);  // 1, 2, 3 are bfloat16 values: exact
  CHECK_FALSE((*pushed)[1].pulled);
  CHECK_FALSE((*pushed)[1].has_values);
  CHECK((*pushed)[1].pull_error == "DEADLINE_EXCEEDED: shard 2 waits for worker 1");
  CHECK(d == std::vector<float>{-1.0f, -1.0f});  // untouched
  CHECK((*pushed)[1].step_sum_squares == 0.1 + 1e-17);
  CHECK((*pushed)[0].step_sum_squares == 0);
}

TEST_CASE("a malformed reply is an error naming the server, not a crash") {
  PullShardsResponse pull;
  AppendEncoded(WireDtype::kFloat32, std::vector<float>{1, 2}, pull.add_shards()->mutable_values());
  std::vector<float> three(3), two(2);

  grpc::ByteBuffer wrong_size = ByteBufferOf(pull.SerializeAsString());
  absl::Status status = DecodeShardsReply(ReplyKind::kPull, &wrong_size, WireDtype::kFloat32,
                                          {absl::MakeSpan(three)}, "ps-3")
                            .status();
  CHECK(status.code() == absl::StatusCode::kInternal);
  CHECK(status.message() ==
        "malformed PullShards reply from ps-3: part 0 has 8 bytes of values; 12 expected");

  grpc::ByteBuffer too_few = ByteBufferOf(pull.SerializeAsString());
  status = DecodeShardsReply(ReplyKind::kPull, &too_few, WireDtype::kFloat32,
                             {absl::MakeSpan(two), absl::MakeSpan(three)}, "ps-3")
               .status();
  CHECK(status.message() == "malformed PullShards reply from ps-3: 1 parts for the 2 asked");

  std::string truncated = pull.SerializeAsString();
  truncated.resize(truncated.size() - 3);
  grpc::ByteBuffer cut = ByteBufferOf(truncated);
  CHECK(
      DecodeShardsReply(ReplyKind::kPull, &cut, WireDtype::kFloat32, {absl::MakeSpan(two)}, "ps-3")
          .status()
          .code() == absl::StatusCode::kInternal);

  grpc::ByteBuffer garbage =
      ByteBufferOf(std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 11));
  CHECK(DecodeShardsReply(ReplyKind::kPush, &garbage, WireDtype::kFloat32, {absl::MakeSpan(two)},
                          "ps-3")
            .status()
            .code() == absl::StatusCode::kInternal);
}

TEST_CASE(
    "a slice keeps its owner alive until gRPC releases it, and sends the owner's memory as it is") {
  auto values = std::make_shared<std::vector<float>>(std::vector<float>{1.5f, -2.0f});
  std::weak_ptr<std::vector<float>> watch = values;
  {
    const float* data = values->data();
    grpc::Slice slice = SliceKeepingAlive(std::move(values), data, 2 * sizeof(float));
    CHECK(reinterpret_cast<const float*>(slice.begin()) == data);
    CHECK_FALSE(watch.expired());
  }
  CHECK(watch.expired());
}

TEST_CASE(
    "a reply part is the message protobuf would write, with the values referred to, not copied") {
  PushResponse header;
  header.set_applied_updates(7);
  header.set_pulled(true);
  const std::string values = "0123456789abcdef";
  ShardsReplyWriter writer(ReplyKind::kPush);
  writer.AddPart(header, grpc::Slice(values.data(), values.size(), grpc::Slice::STATIC_SLICE));
  writer.AddPart(header, grpc::Slice());  // no tensor: no field
  const grpc::ByteBuffer reply = writer.Finish();
  std::vector<grpc::Slice> slices;
  REQUIRE(reply.Dump(&slices).ok());
  REQUIRE(slices.size() == 3);
  CHECK(reinterpret_cast<const char*>(slices[1].begin()) == values.data());
  const std::string bytes = BytesOf(reply);
  PushShardsResponse expected;
  *expected.add_shards() = header;
  expected.mutable_shards(0)->set_values(values);
  *expected.add_shards() = header;
  CHECK(bytes == expected.SerializeAsString());
}

TEST_CASE("PushShards round-trips: the decoder finds every header and gradient") {
  // Exact in every encoding, so the round trip is exact.
  const std::vector<float> gradient = {0.5f, -1.25f, 3.0f, 1024.0f, -0.0f, 2.0f};
  for (WireDtype encoding : {WireDtype::kFloat32, WireDtype::kBfloat16, WireDtype::kFloat16}) {
    INFO("encoding " << WireDtypeName(encoding));
    const std::vector<PushPart> parts = {
        {Header(3, encoding), absl::MakeConstSpan(gradient).subspan(0, 2)},
        {Header(9, encoding), absl::MakeConstSpan(gradient).subspan(2)},
        {Header(4, encoding), absl::Span<const float>()}};  // no gradient
    std::vector<PushPart> skipping = parts;
    skipping[2].header.set_skip_step(true);       // a loss scaler's skipped step: no gradient
    skipping[0].header.set_clip_grad_norm(0.75);  // a clipped sync step
    const grpc::ByteBuffer request = EncodePushShards(skipping, encoding);
    absl::StatusOr<std::vector<PushPartView>> decoded = DecodePushShards(request);
    REQUIRE(decoded.ok());
    REQUIRE(decoded->size() == 3);
    for (size_t k = 0; k < parts.size(); ++k) {
      CHECK(google::protobuf::util::MessageDifferencer::Equals((*decoded)[k].header,
                                                               skipping[k].header));
      std::vector<float> out(parts[k].gradient.size(), 7.0f);
      REQUIRE(ReadGradient(request, (*decoded)[k], encoding, absl::MakeSpan(out), "gradient").ok());
      CHECK(out == std::vector<float>(parts[k].gradient.begin(), parts[k].gradient.end()));
    }
    CHECK((*decoded)[2].gradient_bytes == 0);
    CHECK((*decoded)[2].header.skip_step());
  }
}

TEST_CASE("an embedding part's ids and counts go through the hand-written decoder") {
  PushRequest header = Header(12, WireDtype::kFloat32);
  header.set_ids(EncodeIds({3, 7, 1LL << 35}));
  header.add_id_counts(2);
  header.add_id_counts(1);
  header.set_next_ids(EncodeIds({9}));  // the next batch's rows, for pull_next
  header.add_next_id_counts(0);
  header.add_next_id_counts(1);
  const std::vector<float> gradient(6, 0.5f);
  const grpc::ByteBuffer request = EncodePushShards(
      {{header, gradient}, {Header(2, WireDtype::kFloat32), gradient}}, WireDtype::kFloat32);
  absl::StatusOr<std::vector<PushPartView>> decoded = DecodePushShards(request);
  REQUIRE(decoded.ok());
  CHECK(google::protobuf::util::MessageDifferencer::Equals((*decoded)[0].header, header));
  CHECK((*decoded)[1].header.ids().empty());
  // Counts written unpacked (as an older protobuf writer may) read the same.
  PushShardsRequest unpacked;
  PushRequest* part = unpacked.add_shards();
  *part = header;
  part->clear_id_counts();
  std::string bytes = unpacked.SerializeAsString();
  // Append field 9 as two plain varints (tag 9 << 3 | 0 = 0x48) inside the part.
  bytes[1] = static_cast<char>(bytes[1] + 4);
  bytes += std::string("\x48\x02\x48\x01", 4);
  absl::StatusOr<std::vector<PushPartView>> read = DecodePushShards(ByteBufferOf(bytes));
  REQUIRE(read.ok());
  CHECK((*read)[0].header.id_counts_size() == 2);
  CHECK((*read)[0].header.id_counts(0) == 2);
}

TEST_CASE("PullShards round-trips") {
  PullShardsRequest request;
  for (int shard : {2, 5}) {
    PullRequest* part = request.add_shards();
    part->set_shard_id(shard);
    part->set_epoch(3);
    part->set_worker_rank(1);
    part->set_step(99);
    part->set_encoding(WIRE_BFLOAT16);
  }
  absl::StatusOr<PullShardsRequest> decoded = DecodePullShards(EncodePullShards(request));
  REQUIRE(decoded.ok());
  CHECK(google::protobuf::util::MessageDifferencer::Equals(*decoded, request));
}

TEST_CASE("replies round-trip: what the server writes the worker reads, values into place") {
  const std::vector<float> first = {1, 2, 3}, second = {-4, 0.5f};
  ShardsReplyWriter pull_writer(ReplyKind::kPull);
  for (const auto& [values, start] : {std::pair{first, 11}, std::pair{second, 12}}) {
    PullResponse header;
    header.set_shard_id(start);
    header.set_applied_updates(100 + start);
    header.set_start_step(start);
    std::string bytes;
    AppendEncoded(WireDtype::kFloat32, values, &bytes);
    pull_writer.AddPart(header, SliceOwning(std::move(bytes)));
  }
  grpc::ByteBuffer pull_reply = pull_writer.Finish();
  std::vector<float> a(3), b(2);
  absl::StatusOr<std::vector<ReplyPart>> pulled =
      DecodeShardsReply(ReplyKind::kPull, &pull_reply, WireDtype::kFloat32,
                        {absl::MakeSpan(a), absl::MakeSpan(b)}, "ps-0");
  REQUIRE(pulled.ok());
  CHECK(a == first);
  CHECK(b == second);
  CHECK((*pulled)[0].applied_updates == 111);
  CHECK((*pulled)[1].start_step == 12);

  ShardsReplyWriter push_writer(ReplyKind::kPush);
  PushResponse done;
  done.set_applied_updates(5);
  done.set_pulled(true);
  std::string bytes;
  AppendEncoded(WireDtype::kFloat16, first, &bytes);
  push_writer.AddPart(done, SliceOwning(std::move(bytes)));
  PushResponse duplicate;
  duplicate.set_duplicate(true);
  duplicate.set_pull_error("DEADLINE_EXCEEDED: shard 2 waits for worker 1");
  push_writer.AddPart(duplicate, grpc::Slice());
  grpc::ByteBuffer push_reply = push_writer.Finish();
  std::vector<float> c(3), d(2, -1.0f);
  absl::StatusOr<std::vector<ReplyPart>> pushed =
      DecodeShardsReply(ReplyKind::kPush, &push_reply, WireDtype::kFloat16,
                        {absl::MakeSpan(c), absl::MakeSpan(d)}, "ps-1");
  REQUIRE(pushed.ok());
  CHECK((*pushed)[0].pulled);
  CHECK(c == first);  // 1, 2, 3 are float16 values: exact
  CHECK((*pushed)[1].duplicate);
  CHECK_FALSE((*pushed)[1].has_values);
  CHECK((*pushed)[1].pull_error == "DEADLINE_EXCEEDED: shard 2 waits for worker 1");
  CHECK(d == std::vector<float>{-1.0f, -1.0f});
}

TEST_CASE("malformed requests are refused with INVALID_ARGUMENT saying what is wrong") {
  auto push_error = [](const std::string& bytes) {
    return DecodePushShards(ByteBufferOf(bytes)).status();
  };
  CHECK(push_error(std::string("\x0a\x05\x08", 3)).message() ==
        "malformed PushShards request: truncated number");  // a part cut short
  CHECK(push_error(std::string("\x0a\xff\xff\xff\xff\x0f", 6)).code() ==
        absl::StatusCode::kInvalidArgument);  // a part wider than 31 bits
  // shard_id (field 1, int32) holding 2^40.
  CHECK(push_error(std::string("\x0a\x07\x08\x80\x80\x80\x80\x80\x20", 9)).message() ==
        "malformed PushShards request: field 1 holds 1099511627776, wider than its 32 bits");
  // ids (field 8) longer than any shard's part may be: refused before they are read.
  CHECK(push_error(std::string("\x0a\x06\x42\x81\x80\x80\x10\x00", 8)).message() ==
        "malformed PushShards request: 33554433 bytes of ids for one shard; at most 4194304 "
        "ids are accepted");
  CHECK(DecodePullShards(ByteBufferOf(std::string("\x0a\x05\x08", 3))).status().message() ==
        "malformed PullShards request: not a PullShardsRequest");

  const std::vector<float> gradient = {1, 2, 3};
  const grpc::ByteBuffer request =
      EncodePushShards({{Header(3, WireDtype::kFloat32), gradient}}, WireDtype::kFloat32);
  absl::StatusOr<std::vector<PushPartView>> decoded = DecodePushShards(request);
  REQUIRE(decoded.ok());
  std::vector<float> wrong(2);
  const absl::Status size = ReadGradient(request, (*decoded)[0], WireDtype::kFloat32,
                                         absl::MakeSpan(wrong), "gradient for shard 3");
  CHECK(size.code() == absl::StatusCode::kInvalidArgument);
  CHECK(size.message().find("gradient for shard 3") != absl::string_view::npos);
}

}  // namespace
}  // namespace paramserver
