// The buffer pools: storage handed back and out again, and reply buffers given back
// when gRPC releases the slice that sent them.
#include "ps/buffer_pool.h"

#include <string>

#include "catch2/catch.hpp"

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

}  // namespace
}  // namespace paramserver
