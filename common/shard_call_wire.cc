#include "common/shard_call_wire.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"

namespace paramserver {
namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;

constexpr int kShardsField = 1;

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

grpc::Slice SliceGivingBack(std::shared_ptr<ReplyBufferPool> pool, std::string bytes) {
  struct Owned {
    std::shared_ptr<ReplyBufferPool> pool;
    std::string bytes;
  };
  auto* owned = new Owned{std::move(pool), std::move(bytes)};
  return grpc::Slice(
      owned->bytes.data(), owned->bytes.size(),
      [](void* pointer) {
        std::unique_ptr<Owned> released(static_cast<Owned*>(pointer));
        released->pool->GiveBack(std::move(released->bytes));
      },
      owned);
}

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

}  // namespace paramserver
