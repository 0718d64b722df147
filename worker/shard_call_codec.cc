#include "worker/shard_call_codec.h"

#include <cstring>

#include "absl/base/config.h"
#include "absl/strings/str_cat.h"
#include "common/shard_call_wire.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/slice.h"

namespace paramserver {
namespace {

using google::protobuf::io::CodedInputStream;
using google::protobuf::internal::WireFormatLite;

// Field numbers of proto/parameter_server.proto that this file writes or reads.
constexpr int kShardsField = 1;  // PushShardsRequest/PullShardsResponse/PushShardsResponse.shards
constexpr int kPushGradientField = 5;
constexpr int kPullAppliedField = 2, kPullValuesField = 3, kPullStartStepField = 4;
constexpr int kPushDuplicateField = 1, kPushAppliedField = 2, kPushPulledField = 3, kPushValuesField = 4,
              kPushPullErrorField = 5;

uint32_t LengthDelimitedTag(int field) {
  return WireFormatLite::MakeTag(field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
}

}  // namespace

grpc::ByteBuffer EncodePushShards(const std::vector<PushPart>& parts, WireDtype encoding) {
  std::vector<grpc::Slice> slices;
  slices.reserve(2 * parts.size());
  for (const PushPart& part : parts) {
    const size_t payload_bytes = part.gradient.size() * WireBytesPerValue(encoding);
#ifdef ABSL_IS_LITTLE_ENDIAN
    if (encoding == WireDtype::kFloat32) {
      // The gradient's own memory, referred to, not copied.
      AppendShardPart(part.header, kPushGradientField,
                      grpc::Slice(part.gradient.data(), payload_bytes, grpc::Slice::STATIC_SLICE), &slices);
      continue;
    }
#endif
    std::string encoded;
    encoded.reserve(payload_bytes);
    AppendEncoded(encoding, part.gradient, &encoded);
    AppendShardPart(part.header, kPushGradientField, SliceOwning(std::move(encoded)), &slices);
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

grpc::ByteBuffer EncodePullShards(const PullShardsRequest& request) {
  grpc::Slice slice(request.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

absl::StatusOr<std::vector<ReplyPart>> DecodeShardsReply(ReplyKind kind, grpc::ByteBuffer* reply,
                                                         WireDtype encoding,
                                                         const std::vector<absl::Span<float>>& destinations,
                                                         const std::string& server) {
  auto malformed = [&](const std::string& why) {
    return absl::InternalError(absl::StrCat("malformed ", kind == ReplyKind::kPull ? "PullShards" : "PushShards",
                                            " reply from ", server, ": ", why));
  };
  const int values_field = kind == ReplyKind::kPull ? kPullValuesField : kPushValuesField;
  grpc::ProtoBufferReader reader(reply);
  if (!reader.status().ok()) return malformed(reader.status().error_message());
  CodedInputStream input(&reader);
  std::vector<ReplyPart> parts;
  std::string scratch;
  while (true) {
    const uint32_t tag = input.ReadTag();
    if (tag == 0) break;
    if (tag != LengthDelimitedTag(kShardsField)) {
      if (!WireFormatLite::SkipField(&input, tag)) return malformed("cannot skip an unknown field");
      continue;
    }
    uint32_t length;
    if (!input.ReadVarint32(&length)) return malformed("truncated part");
    const CodedInputStream::Limit limit = input.PushLimit(static_cast<int>(length));
    const size_t index = parts.size();
    if (index >= destinations.size()) return malformed(absl::StrCat("more than the ", destinations.size(), " parts asked"));
    ReplyPart& part = parts.emplace_back();
    while (true) {
      const uint32_t field_tag = input.ReadTag();
      if (field_tag == 0) break;
      const int field = WireFormatLite::GetTagFieldNumber(field_tag);
      const bool varint = WireFormatLite::GetTagWireType(field_tag) == WireFormatLite::WIRETYPE_VARINT;
      uint64_t number = 0;
      if (field == values_field && WireFormatLite::GetTagWireType(field_tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
        uint32_t bytes;
        if (!input.ReadVarint32(&bytes)) return malformed("truncated values");
        const absl::Span<float> destination = destinations[index];
        const size_t expected = destination.size() * WireBytesPerValue(encoding);
        if (bytes != expected) {
          return malformed(absl::StrCat("part ", index, " has ", bytes, " bytes of values; ", expected, " expected"));
        }
#ifdef ABSL_IS_LITTLE_ENDIAN
        if (encoding == WireDtype::kFloat32) {
          if (!input.ReadRaw(destination.data(), static_cast<int>(bytes))) return malformed("truncated values");
          part.has_values = true;
          continue;
        }
#endif
        if (!input.ReadString(&scratch, static_cast<int>(bytes))) return malformed("truncated values");
        absl::Status decoded = DecodeExactly(encoding, scratch, destination, "values");
        if (!decoded.ok()) return malformed(std::string(decoded.message()));
        part.has_values = true;
      } else if (kind == ReplyKind::kPush && field == kPushPullErrorField &&
                 WireFormatLite::GetTagWireType(field_tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
        uint32_t bytes;
        if (!input.ReadVarint32(&bytes) || !input.ReadString(&part.pull_error, static_cast<int>(bytes))) {
          return malformed("truncated pull_error");
        }
      } else if (varint && (field == kPullAppliedField || (kind == ReplyKind::kPull && field == kPullStartStepField) ||
                            (kind == ReplyKind::kPush && (field == kPushDuplicateField || field == kPushPulledField)))) {
        if (!input.ReadVarint64(&number)) return malformed("truncated number");
        if (field == kPullAppliedField) {  // == kPushAppliedField
          part.applied_updates = static_cast<int64_t>(number);
        } else if (kind == ReplyKind::kPull) {
          part.start_step = static_cast<int64_t>(number);
        } else if (field == kPushDuplicateField) {
          part.duplicate = number != 0;
        } else {
          part.pulled = number != 0;
        }
      } else if (!WireFormatLite::SkipField(&input, field_tag)) {
        return malformed("cannot skip a field");
      }
    }
    if (!input.ConsumedEntireMessage()) return malformed("a part ends inside a field");
    input.PopLimit(limit);
  }
  if (!input.ConsumedEntireMessage()) return malformed("ends inside a field");
  if (parts.size() != destinations.size()) {
    return malformed(absl::StrCat(parts.size(), " parts for the ", destinations.size(), " asked"));
  }
  static_assert(kPullAppliedField == kPushAppliedField, "one branch reads both");
  return parts;
}

}  // namespace paramserver
