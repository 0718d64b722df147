#include "common/shard_call_wire.h"

#include <string>

#include "catch2/catch.hpp"
#include "proto/parameter_server.pb.h"

namespace paramserver {
namespace {

std::string Bytes(const grpc::Slice& slice) {
  return std::string(reinterpret_cast<const char*>(slice.begin()), slice.size());
}

TEST_CASE(
    "a reply buffer comes back to the pool when gRPC releases its slice, and is handed out again") {
  std::shared_ptr<ReplyBufferPool> pool =
      ReplyBufferPool::Create(/*max_kept=*/2, /*max_kept_bytes=*/1 << 20);
  std::string first = pool->Take();
  CHECK(first.empty());
  first.assign(100000, 'x');
  const char* storage = first.data();
  {
    grpc::Slice slice = SliceGivingBack(pool, std::move(first));
    CHECK(Bytes(slice) == std::string(100000, 'x'));
    CHECK(reinterpret_cast<const char*>(slice.begin()) == storage);  // not copied
    CHECK(pool->kept() == 0);                                        // gRPC still holds it
  }
  CHECK(pool->kept() == 1);
  std::string again = pool->Take();
  CHECK(again.empty());
  CHECK(again.capacity() >= 100000);
  CHECK(again.data() == storage);  // the same pages
  CHECK(pool->kept() == 0);
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

TEST_CASE("a float buffer comes back from the pool with its storage") {
  std::shared_ptr<BufferPool<UninitializedFloats>> pool =
      BufferPool<UninitializedFloats>::Create(4, 1 << 20);
  UninitializedFloats buffer = pool->Take();
  buffer.resize(1000);
  buffer[999] = 7.0f;
  const float* storage = buffer.data();
  pool->GiveBack(std::move(buffer));
  UninitializedFloats again = pool->Take();
  CHECK(again.empty());
  CHECK(again.capacity() >= 1000);
  CHECK(again.data() == storage);
}

TEST_CASE("the pool keeps no more strings or bytes than it was told") {
  std::shared_ptr<ReplyBufferPool> pool =
      ReplyBufferPool::Create(/*max_kept=*/2, /*max_kept_bytes=*/300000);
  for (int i = 0; i < 3; ++i)
    SliceGivingBack(pool, std::string(100000, 'y'));  // each released at once
  CHECK(pool->kept() == 2);
  (void)pool->Take();
  SliceGivingBack(pool, std::string(250000, 'z'));  // 100000 + 250000 > 300000: freed, not kept
  CHECK(pool->kept() == 1);
}

TEST_CASE(
    "a shard part is the message protobuf would write, with the tensor referred to, not copied") {
  PushResponse header;
  header.set_applied_updates(7);
  header.set_pulled(true);
  const std::string values = "0123456789abcdef";
  std::vector<grpc::Slice> slices;
  AppendShardPart(header, 4, grpc::Slice(values.data(), values.size(), grpc::Slice::STATIC_SLICE),
                  &slices);
  AppendShardPart(header, 4, grpc::Slice(), &slices);  // no tensor: no field
  REQUIRE(slices.size() == 3);
  CHECK(reinterpret_cast<const char*>(slices[1].begin()) == values.data());
  std::string bytes;
  for (const grpc::Slice& slice : slices) bytes += Bytes(slice);
  PushShardsResponse expected;
  *expected.add_shards() = header;
  expected.mutable_shards(0)->set_values(values);
  *expected.add_shards() = header;
  CHECK(bytes == expected.SerializeAsString());
}

}  // namespace
}  // namespace paramserver
