#include "worker/shard_call_codec.h"

#include <cstring>
#include <functional>

#include "absl/base/config.h"
#include "absl/strings/str_cat.h"
#include "common/shard_call_wire.h"
#include "common/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/slice.h"

namespace paramserver {
namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;

// The fields of proto/parameter_server.proto this file writes or reads.
constexpr int kPushGradientField = PushRequest::kGradientFieldNumber;
constexpr int kPullAppliedField = PullResponse::kAppliedUpdatesFieldNumber;
constexpr int kPullValuesField = PullResponse::kValuesFieldNumber;
constexpr int kPullStartStepField = PullResponse::kStartStepFieldNumber;
constexpr int kPushDuplicateField = PushResponse::kDuplicateFieldNumber;
constexpr int kPushAppliedField = PushResponse::kAppliedUpdatesFieldNumber;
constexpr int kPushPulledField = PushResponse::kPulledFieldNumber;
constexpr int kPushValuesField = PushResponse::kValuesFieldNumber;
constexpr int kPushPullErrorField = PushResponse::kPullErrorFieldNumber;
static_assert(kPullAppliedField == kPushAppliedField, "ReadReplyPart reads both in one branch");

using Malformed = std::function<absl::Status(const std::string& why)>;

// Reads part `index` of a reply (the input limited to it) into *part, its values, in
// `encoding`, into `destination`. `scratch` holds half-precision bytes on their way.
absl::Status ReadReplyPart(CodedInputStream& input, ReplyKind kind, WireDtype encoding,
                           absl::Span<float> destination, size_t index, const Malformed& malformed,
                           std::string* scratch, ReplyPart* part) {
  const int values_field = kind == ReplyKind::kPull ? kPullValuesField : kPushValuesField;
  while (true) {
    const uint32_t tag = input.ReadTag();
    if (tag == 0) return absl::OkStatus();
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    const WireFormatLite::WireType wire_type = WireFormatLite::GetTagWireType(tag);
    const bool length_delimited = wire_type == WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
    if (field == values_field && length_delimited) {
      uint32_t bytes;
      if (!input.ReadVarint32(&bytes)) return malformed("truncated values");
      const size_t expected = destination.size() * WireBytesPerValue(encoding);
      if (bytes != expected) {
        return malformed(absl::StrCat("part ", index, " has ", bytes, " bytes of values; ",
                                      expected, " expected"));
      }
      part->has_values = true;
#ifdef ABSL_IS_LITTLE_ENDIAN
      if (encoding == WireDtype::kFloat32) {
        if (!input.ReadRaw(destination.data(), static_cast<int>(bytes)))
          return malformed("truncated values");
        continue;
      }
#endif
      if (!input.ReadString(scratch, static_cast<int>(bytes))) return malformed("truncated values");
      absl::Status decoded = DecodeExactly(encoding, *scratch, destination, "values");
      if (!decoded.ok()) return malformed(std::string(decoded.message()));
    } else if (kind == ReplyKind::kPush && field == kPushPullErrorField && length_delimited) {
      uint32_t bytes;
      if (!input.ReadVarint32(&bytes) ||
          !input.ReadString(&part->pull_error, static_cast<int>(bytes))) {
        return malformed("truncated pull_error");
      }
    } else if (wire_type == WireFormatLite::WIRETYPE_VARINT &&
               (field == kPullAppliedField ||
                (kind == ReplyKind::kPull && field == kPullStartStepField) ||
                (kind == ReplyKind::kPush &&
                 (field == kPushDuplicateField || field == kPushPulledField)))) {
      uint64_t number;
      if (!input.ReadVarint64(&number)) return malformed("truncated number");
      if (field == kPullAppliedField) {
        part->applied_updates = static_cast<int64_t>(number);
      } else if (kind == ReplyKind::kPull) {
        part->start_step = static_cast<int64_t>(number);
      } else if (field == kPushDuplicateField) {
        part->duplicate = number != 0;
      } else {
        part->pulled = number != 0;
      }
    } else if (!WireFormatLite::SkipField(&input, tag)) {
      return malformed("cannot skip a field");
    }
  }
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
                      grpc::Slice(part.gradient.data(), payload_bytes, grpc::Slice::STATIC_SLICE),
                      &slices);
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

absl::StatusOr<std::vector<ReplyPart>> DecodeShardsReply(
    ReplyKind kind, grpc::ByteBuffer* reply, WireDtype encoding,
    const std::vector<absl::Span<float>>& destinations, const std::string& server) {
  const Malformed malformed = [&](const std::string& why) {
    return absl::InternalError(absl::StrCat("malformed ",
                                            kind == ReplyKind::kPull ? "PullShards" : "PushShards",
                                            " reply from ", server, ": ", why));
  };
  grpc::ProtoBufferReader reader(reply);
  if (!reader.status().ok()) return malformed(reader.status().error_message());
  CodedInputStream input(&reader);
  std::vector<ReplyPart> parts;
  std::string scratch;
  PS_RETURN_IF_ERROR(ReadShardParts(
      input,
      [&](size_t index) {
        if (index >= destinations.size()) {
          return malformed(absl::StrCat("more than the ", destinations.size(), " parts asked"));
        }
        return ReadReplyPart(input, kind, encoding, destinations[index], index, malformed, &scratch,
                             &parts.emplace_back());
      },
      malformed));
  if (parts.size() != destinations.size()) {
    return malformed(absl::StrCat(parts.size(), " parts for the ", destinations.size(), " asked"));
  }
  return parts;
}

}  // namespace paramserver
