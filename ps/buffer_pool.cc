#include "ps/buffer_pool.h"

namespace paramserver {

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

}  // namespace paramserver
