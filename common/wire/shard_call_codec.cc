#include "common/wire/shard_call_codec.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>

#include "absl/base/config.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/wire/sparse_rows.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/support/proto_buffer_reader.h"

namespace paramserver {

namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;

// The field every one of these messages keeps its parts in: `repeated ... shards = 1`.
constexpr int kShardsField = 1;

// PushRequest's fields.
constexpr int kShardIdField = PushRequest::kShardIdFieldNumber;
constexpr int kEpochField = PushRequest::kEpochFieldNumber;
constexpr int kWorkerRankField = PushRequest::kWorkerRankFieldNumber;
constexpr int kStepField = PushRequest::kStepFieldNumber;
constexpr int kGradientField = PushRequest::kGradientFieldNumber;
constexpr int kPullNextField = PushRequest::kPullNextFieldNumber;
constexpr int kEncodingField = PushRequest::kEncodingFieldNumber;
constexpr int kIdsField = PushRequest::kIdsFieldNumber;
constexpr int kIdCountsField = PushRequest::kIdCountsFieldNumber;
constexpr int kNextIdsField = PushRequest::kNextIdsFieldNumber;
constexpr int kNextIdCountsField = PushRequest::kNextIdCountsFieldNumber;
constexpr int kOptimizerField = PushRequest::kOptimizerFieldNumber;
constexpr int kSkipStepField = PushRequest::kSkipStepFieldNumber;
constexpr int kClipGradNormField = PushRequest::kClipGradNormFieldNumber;
constexpr int kPushSumSquaresField = PushResponse::kStepSumSquaresFieldNumber;
// A step's settings are a few dozen bytes per parameter group: a shard's past this are
// refused before they are parsed.
constexpr uint32_t kMaxOptimizerBytes = 1 << 20;
// More tables than any model has (the spec allows 1024): a peer's list past it is refused.
constexpr int kMaxIdCounts = 4096;

// The replies' fields.
constexpr int kPullAppliedField = PullResponse::kAppliedUpdatesFieldNumber;
constexpr int kPullValuesField = PullResponse::kValuesFieldNumber;
constexpr int kPullStartStepField = PullResponse::kStartStepFieldNumber;
constexpr int kPushDuplicateField = PushResponse::kDuplicateFieldNumber;
constexpr int kPushAppliedField = PushResponse::kAppliedUpdatesFieldNumber;
constexpr int kPushPulledField = PushResponse::kPulledFieldNumber;
constexpr int kPushLateField = PushResponse::kLateFieldNumber;
constexpr int kPushValuesField = PushResponse::kValuesFieldNumber;
constexpr int kPushPullErrorField = PushResponse::kPullErrorFieldNumber;
static_assert(kPullAppliedField == kPushAppliedField, "ReadReplyPart reads both in one branch");

void AppendVarint(uint64_t value, std::string* out) {
  uint8_t bytes[10];
  const uint8_t* end = CodedOutputStream::WriteVarint64ToArray(value, bytes);
  out->append(reinterpret_cast<const char*>(bytes), end - bytes);
}

void AppendLengthDelimitedTag(int field, std::string* out) {
  AppendVarint(WireFormatLite::MakeTag(field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED), out);
}

}  // namespace

grpc::Slice SliceOwning(std::string bytes) {
  auto* owned = new std::string(std::move(bytes));
  return grpc::Slice(
      owned->data(), owned->size(), [](void* string) { delete static_cast<std::string*>(string); },
      owned);
}

grpc::Slice SliceKeepingAlive(std::shared_ptr<const void> owner, const void* data, size_t size) {
  auto* kept = new std::shared_ptr<const void>(std::move(owner));
  return grpc::Slice(
      const_cast<void*>(data), size,
      [](void* pointer) { delete static_cast<std::shared_ptr<const void>*>(pointer); }, kept);
}

namespace {

// Appends to `slices` one element of the `repeated ... shards = 1` field every one of
// these messages has: `header` (the part without its tensor) and then, unless `tensor`
// is empty, the bytes field `tensor_field` holding `tensor` (referred to, not copied).
void AppendShardPart(const google::protobuf::MessageLite& header, int tensor_field,
                     grpc::Slice tensor, std::vector<grpc::Slice>* slices) {
  const std::string header_bytes = header.SerializeAsString();
  std::string tensor_prefix;
  if (tensor.size() > 0) {
    AppendLengthDelimitedTag(tensor_field, &tensor_prefix);
    AppendVarint(tensor.size(), &tensor_prefix);
  }
  std::string prefix;
  AppendLengthDelimitedTag(kShardsField, &prefix);
  AppendVarint(header_bytes.size() + tensor_prefix.size() + tensor.size(), &prefix);
  prefix += header_bytes;
  prefix += tensor_prefix;
  slices->push_back(SliceOwning(std::move(prefix)));
  if (tensor.size() > 0) slices->push_back(std::move(tensor));
}

// Reads the `repeated ... shards = 1` field of the message in `input` (other fields
// skipped), calling `read_part(index)` with the input limited to each part in turn. A
// part's own error is returned as it is; bytes that are not such a message get
// `malformed(why)`: among them a part whose declared length is wider than 31 bits or
// runs past the end of the message.
absl::Status ReadShardParts(CodedInputStream& input,
                            const std::function<absl::Status(size_t index)>& read_part,
                            const std::function<absl::Status(const std::string& why)>& malformed) {
  const uint32_t shards_tag =
      WireFormatLite::MakeTag(kShardsField, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
  for (size_t index = 0;;) {
    const uint32_t tag = input.ReadTag();
    if (tag == 0) break;
    if (tag != shards_tag) {
      if (!WireFormatLite::SkipField(&input, tag)) return malformed("cannot skip an unknown field");
      continue;
    }
    uint64_t length;
    if (!input.ReadVarint64(&length)) return malformed("truncated part");
    if (length > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
      return malformed(absl::StrCat("part ", index, " declares ", length, " bytes"));
    }
    const int start = input.CurrentPosition();
    const CodedInputStream::Limit limit = input.PushLimit(static_cast<int>(length));
    if (absl::Status read = read_part(index); !read.ok()) return read;
    if (!input.ConsumedEntireMessage())
      return malformed(absl::StrCat("part ", index, " ends inside a field"));
    if (input.CurrentPosition() - start != static_cast<int>(length)) {
      return malformed(absl::StrCat("part ", index, " declares ", length,
                                    " bytes but the message ends after ",
                                    input.CurrentPosition() - start));
    }
    input.PopLimit(limit);
    ++index;
  }
  if (!input.ConsumedEntireMessage()) return malformed("ends inside a field");
  return absl::OkStatus();
}

}  // namespace

// ---- PushShards and PullShards requests

namespace {

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

// A packed id_counts (or next_id_counts) field's values, into *counts.
absl::Status ReadPackedIdCounts(CodedInputStream& input,
                                google::protobuf::RepeatedField<int32_t>* counts) {
  uint32_t bytes;
  if (!input.ReadVarint32(&bytes)) return NotPushShards("truncated id counts");
  const CodedInputStream::Limit limit = input.PushLimit(static_cast<int>(bytes));
  while (input.BytesUntilLimit() > 0) {
    uint64_t count;
    if (!input.ReadVarint64(&count) || !FitsInt32(count))
      return NotPushShards("malformed id counts");
    if (counts->size() >= kMaxIdCounts)
      return NotPushShards(absl::StrCat("more than ", kMaxIdCounts, " id counts"));
    counts->Add(static_cast<int32_t>(count));
  }
  input.PopLimit(limit);
  return absl::OkStatus();
}

// A varint field `field` of a PushRequest read as `value`, into *header (an unpacked id
// count into *counts); a number that does not fit its field is refused.
absl::Status SetNumberField(int field, uint64_t value, PushRequest* header,
                            google::protobuf::RepeatedField<int32_t>* counts) {
  const bool int32_field = field == kShardIdField || field == kWorkerRankField ||
                           field == kEncodingField || field == kIdCountsField ||
                           field == kNextIdCountsField;
  if (int32_field && !FitsInt32(value)) {
    return NotPushShards(
        absl::StrCat("field ", field, " holds ", value, ", wider than its 32 bits"));
  }
  switch (field) {  // other numbers: fields this server does not know, skipped
    case kShardIdField:
      header->set_shard_id(static_cast<int32_t>(value));
      break;
    case kEpochField:
      header->set_epoch(static_cast<int64_t>(value));
      break;
    case kWorkerRankField:
      header->set_worker_rank(static_cast<int32_t>(value));
      break;
    case kStepField:
      header->set_step(static_cast<int64_t>(value));
      break;
    case kPullNextField:
      header->set_pull_next(value != 0);
      break;
    case kSkipStepField:
      header->set_skip_step(value != 0);
      break;
    case kEncodingField:
      header->set_encoding(static_cast<WireEncoding>(static_cast<int32_t>(value)));
      break;
    case kIdCountsField:  // written unpacked
    case kNextIdCountsField:
      if (counts->size() >= kMaxIdCounts)
        return NotPushShards(absl::StrCat("more than ", kMaxIdCounts, " id counts"));
      counts->Add(static_cast<int32_t>(value));
      break;
  }
  return absl::OkStatus();
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
    PushRequest& header = part->header;
    const bool next = field == kNextIdsField || field == kNextIdCountsField;
    std::string* ids = next ? header.mutable_next_ids() : header.mutable_ids();
    google::protobuf::RepeatedField<int32_t>* counts =
        next ? header.mutable_next_id_counts() : header.mutable_id_counts();
    if ((field == kIdsField || field == kNextIdsField) &&
        wire_type == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      uint32_t bytes;
      if (!input.ReadVarint32(&bytes)) return NotPushShards("truncated ids");
      if (bytes > kMaxIdsPerShardCall * sizeof(int64_t)) {
        return NotPushShards(absl::StrCat(bytes, " bytes of ids for one shard; at most ",
                                          kMaxIdsPerShardCall, " ids are accepted"));
      }
      if (!input.ReadString(ids, static_cast<int>(bytes))) return NotPushShards("truncated ids");
      continue;
    }
    if ((field == kIdCountsField || field == kNextIdCountsField) &&
        wire_type == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      PS_RETURN_IF_ERROR(ReadPackedIdCounts(input, counts));
      continue;
    }
    if (field == kOptimizerField && wire_type == WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      uint32_t bytes;
      std::string message;
      if (!input.ReadVarint32(&bytes)) return NotPushShards("truncated optimizer settings");
      if (bytes > kMaxOptimizerBytes) {
        return NotPushShards(absl::StrCat(bytes,
                                          " bytes of optimizer settings for one shard; at "
                                          "most ",
                                          kMaxOptimizerBytes, " are accepted"));
      }
      if (!input.ReadString(&message, static_cast<int>(bytes)) ||
          !header.mutable_optimizer()->MergeFromString(message)) {
        return NotPushShards("malformed optimizer settings");
      }
      continue;
    }
    if (field == kClipGradNormField && wire_type == WireFormatLite::WIRETYPE_FIXED64) {
      uint64_t bits;
      if (!input.ReadLittleEndian64(&bits)) return NotPushShards("truncated clip_grad_norm");
      double clip;
      std::memcpy(&clip, &bits, sizeof bits);
      header.set_clip_grad_norm(clip);
      continue;
    }
    if (wire_type != WireFormatLite::WIRETYPE_VARINT) {
      if (!WireFormatLite::SkipField(&input, tag)) return NotPushShards("cannot skip a field");
      continue;
    }
    uint64_t value;
    if (!input.ReadVarint64(&value)) return NotPushShards("truncated number");
    PS_RETURN_IF_ERROR(SetNumberField(field, value, &header, counts));
  }
}

}  // namespace

absl::StatusOr<std::vector<PushPartView>> DecodePushShards(const grpc::ByteBuffer& request) {
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

absl::StatusOr<PullShardsRequest> DecodePullShards(const grpc::ByteBuffer& request) {
  grpc::ByteBuffer buffer(request);
  grpc::ProtoBufferReader reader(&buffer);
  PullShardsRequest parsed;
  if (!reader.status().ok() || !parsed.ParseFromZeroCopyStream(&reader)) {
    return absl::InvalidArgumentError("malformed PullShards request: not a PullShardsRequest");
  }
  return parsed;
}

// ---- Replies

namespace {

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
    } else if (kind == ReplyKind::kPush && field == kPushSumSquaresField &&
               wire_type == WireFormatLite::WIRETYPE_FIXED64) {
      uint64_t bits;
      if (!input.ReadLittleEndian64(&bits)) return malformed("truncated step_sum_squares");
      std::memcpy(&part->step_sum_squares, &bits, sizeof bits);
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
                 (field == kPushDuplicateField || field == kPushPulledField ||
                  field == kPushLateField)))) {
      uint64_t number;
      if (!input.ReadVarint64(&number)) return malformed("truncated number");
      if (field == kPullAppliedField) {
        part->applied_updates = static_cast<int64_t>(number);
      } else if (kind == ReplyKind::kPull) {
        part->start_step = static_cast<int64_t>(number);
      } else if (field == kPushDuplicateField) {
        part->duplicate = number != 0;
      } else if (field == kPushLateField) {
        part->late = number != 0;
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
      AppendShardPart(part.header, kGradientField,
                      grpc::Slice(part.gradient.data(), payload_bytes, grpc::Slice::STATIC_SLICE),
                      &slices);
      continue;
    }
#endif
    std::string encoded;
    encoded.reserve(payload_bytes);
    AppendEncoded(encoding, part.gradient, &encoded);
    AppendShardPart(part.header, kGradientField, SliceOwning(std::move(encoded)), &slices);
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

void ShardsReplyWriter::AddPart(const google::protobuf::MessageLite& header, grpc::Slice values) {
  AppendShardPart(header, kind_ == ReplyKind::kPull ? kPullValuesField : kPushValuesField,
                  std::move(values), &slices_);
}

grpc::ByteBuffer ShardsReplyWriter::Finish() {
  return grpc::ByteBuffer(slices_.data(), slices_.size());
}

}  // namespace paramserver
