#include "ps/shard_call_parser.h"

#include <cstdint>
#include <limits>
#include <string>

#include "absl/base/config.h"
#include "absl/strings/str_cat.h"
#include "common/shard_call_wire.h"
#include "common/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace paramserver {
namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;

// PushRequest's fields.
constexpr int kShardIdField = PushRequest::kShardIdFieldNumber;
constexpr int kEpochField = PushRequest::kEpochFieldNumber;
constexpr int kWorkerRankField = PushRequest::kWorkerRankFieldNumber;
constexpr int kStepField = PushRequest::kStepFieldNumber;
constexpr int kGradientField = PushRequest::kGradientFieldNumber;
constexpr int kPullNextField = PushRequest::kPullNextFieldNumber;
constexpr int kEncodingField = PushRequest::kEncodingFieldNumber;

absl::Status NotPushShards(const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("malformed PushShards request: ", why));
}

// Whether a varint read as 64 bits is a value of an int32 field (negative values take
// ten bytes, sign-extended).
bool FitsInt32(uint64_t value) {
  const int64_t signed_value = static_cast<int64_t>(value);
  return signed_value >= std::numeric_limits<int32_t>::min() &&
         signed_value <= std::numeric_limits<int32_t>::max();
}

// Reads one PushRequest that ends at the input's current limit.
absl::Status ParsePushPart(CodedInputStream& input, PushPartView* part) {
  while (true) {
    const uint32_t tag = input.ReadTag();
    if (tag == 0) return absl::OkStatus();
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    const WireFormatLite::WireType wire_type = WireFormatLite::GetTagWireType(tag);
    if (field == kGradientField && wire_type == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      uint64_t bytes;
      if (!input.ReadVarint64(&bytes)) return NotPushShards("truncated gradient");
      if (bytes > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
        return NotPushShards(absl::StrCat("a gradient of ", bytes, " bytes"));
      }
      part->gradient_offset = input.CurrentPosition();
      part->gradient_bytes = bytes;
      if (!input.Skip(static_cast<int>(bytes))) return NotPushShards("truncated gradient");
      continue;
    }
    if (wire_type != WireFormatLite::WIRETYPE_VARINT) {
      if (!WireFormatLite::SkipField(&input, tag)) return NotPushShards("cannot skip a field");
      continue;
    }
    uint64_t value;
    if (!input.ReadVarint64(&value)) return NotPushShards("truncated number");
    PushRequest& header = part->header;
    const bool int32_field =
        field == kShardIdField || field == kWorkerRankField || field == kEncodingField;
    if (int32_field && !FitsInt32(value)) {
      return NotPushShards(
          absl::StrCat("field ", field, " holds ", value, ", wider than its 32 bits"));
    }
    switch (field) {  // other numbers: fields this server does not know, skipped
      case kShardIdField:
        header.set_shard_id(static_cast<int32_t>(value));
        break;
      case kEpochField:
        header.set_epoch(static_cast<int64_t>(value));
        break;
      case kWorkerRankField:
        header.set_worker_rank(static_cast<int32_t>(value));
        break;
      case kStepField:
        header.set_step(static_cast<int64_t>(value));
        break;
      case kPullNextField:
        header.set_pull_next(value != 0);
        break;
      case kEncodingField:
        header.set_encoding(static_cast<WireEncoding>(static_cast<int32_t>(value)));
        break;
    }
  }
}

}  // namespace

absl::StatusOr<std::vector<PushPartView>> ParsePushShards(const grpc::ByteBuffer& request) {
  grpc::ByteBuffer buffer(request);  // shares the slices
  grpc::ProtoBufferReader reader(&buffer);
  if (!reader.status().ok()) return NotPushShards(reader.status().error_message());
  CodedInputStream input(&reader);
  std::vector<PushPartView> parts;
  PS_RETURN_IF_ERROR(ReadShardParts(
      input, [&](size_t) { return ParsePushPart(input, &parts.emplace_back()); }, NotPushShards));
  return parts;
}

absl::Status ReadGradient(const grpc::ByteBuffer& request, const PushPartView& part,
                          WireDtype encoding, absl::Span<float> out, absl::string_view what) {
  if (absl::Status size = CheckWireSize(encoding, part.gradient_bytes, out.size(), what);
      !size.ok())
    return size;
  if (part.gradient_bytes == 0) return absl::OkStatus();
  grpc::ByteBuffer buffer(request);
  grpc::ProtoBufferReader reader(&buffer);
  CodedInputStream input(&reader);
  if (!reader.status().ok() || !input.Skip(static_cast<int>(part.gradient_offset))) {
    return absl::InternalError(
        absl::StrCat(what, ": the request is shorter than when it was parsed"));
  }
  const int bytes = static_cast<int>(part.gradient_bytes);
#ifdef ABSL_IS_LITTLE_ENDIAN
  if (encoding == WireDtype::kFloat32) {
    // From gRPC's slices into place: the only copy.
    if (!input.ReadRaw(out.data(), bytes))
      return absl::InternalError(absl::StrCat(what, ": truncated"));
    return absl::OkStatus();
  }
#endif
  std::string scratch;
  if (!input.ReadString(&scratch, bytes))
    return absl::InternalError(absl::StrCat(what, ": truncated"));
  return DecodeExactly(encoding, scratch, out, what);
}

absl::StatusOr<PullShardsRequest> ParsePullShards(const grpc::ByteBuffer& request) {
  grpc::ByteBuffer buffer(request);
  grpc::ProtoBufferReader reader(&buffer);
  PullShardsRequest parsed;
  if (!reader.status().ok() || !parsed.ParseFromZeroCopyStream(&reader)) {
    return absl::InvalidArgumentError("malformed PullShards request: not a PullShardsRequest");
  }
  return parsed;
}

}  // namespace paramserver
