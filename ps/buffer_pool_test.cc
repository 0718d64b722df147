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

TEST_CASE("a buffer taken for a size is the smallest that fits, and an empty one is not kept") {
  std::shared_ptr<BufferPool<UninitializedFloats>> pool =
      BufferPool<UninitializedFloats>::Create(8, 1 << 24);
  for (size_t size : {1000, 100, 10000}) {
    UninitializedFloats buffer(size);
    pool->GiveBack(std::move(buffer));
  }
  pool->GiveBack(UninitializedFloats());  // no storage: nothing to keep
  CHECK(pool->kept() == 3);
  CHECK(pool->TakeFitting(500).capacity() == 1000);     // not the 10000 one
  CHECK(pool->TakeFitting(20000).capacity() == 10000);  // none fits: the largest grows least
  CHECK(pool->TakeFitting(1).capacity() == 100);
  CHECK(pool->kept() == 0);
  CHECK(pool->TakeFitting(1).capacity() == 0);  // an empty pool hands out a new buffer
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
