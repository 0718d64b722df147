// Large buffers kept for reuse. A fresh 64 MB buffer costs a page fault, and the kernel
// zeroing a page, every 4 KB the first time it is written; a buffer used before has
// its pages mapped.
#ifndef PARAMSERVER_PS_BUFFER_POOL_H_
#define PARAMSERVER_PS_BUFFER_POOL_H_

#include <algorithm>
#include <cstddef>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/support/slice.h"
#include "ps/uninitialized_floats.h"

namespace paramserver {

// Thread-safe. `Buffer` is std::string or a std::vector: anything with clear(),
// capacity() and value_type. Create it with Create (it hands out shared ownership, so
// that a buffer given back late finds it alive).
template <typename Buffer>
class BufferPool : public std::enable_shared_from_this<BufferPool<Buffer>> {
 public:
  // Keeps at most `max_kept` buffers and `max_kept_bytes` of capacity; the rest is freed.
  static std::shared_ptr<BufferPool> Create(size_t max_kept = 32,
                                            size_t max_kept_bytes = size_t{512} << 20) {
    return std::shared_ptr<BufferPool>(new BufferPool(max_kept, max_kept_bytes));
  }

  // An empty buffer: the largest one given back, when there is one.
  Buffer Take() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (kept_.empty()) return Buffer();
    auto largest = std::max_element(
        kept_.begin(), kept_.end(),
        [](const Buffer& a, const Buffer& b) { return a.capacity() < b.capacity(); });
    Buffer taken = std::move(*largest);
    *largest = std::move(kept_.back());
    kept_.pop_back();
    kept_bytes_ -= Bytes(taken);
    return taken;
  }

  // An empty buffer for `elements` elements: the smallest one given back that holds them
  // without growing, else the largest (it grows the least). A buffer a caller keeps for
  // long (a sync push's gradient waits in its shard) then does not pin a larger one.
  Buffer TakeFitting(size_t elements) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (kept_.empty()) return Buffer();
    auto chosen = kept_.begin();
    for (auto it = kept_.begin(); it != kept_.end(); ++it) {
      const bool fits = it->capacity() >= elements, chosen_fits = chosen->capacity() >= elements;
      if (fits ? (!chosen_fits || it->capacity() < chosen->capacity())
               : (!chosen_fits && it->capacity() > chosen->capacity()))
        chosen = it;
    }
    Buffer taken = std::move(*chosen);
    *chosen = std::move(kept_.back());
    kept_.pop_back();
    kept_bytes_ -= Bytes(taken);
    return taken;
  }

  // Keeps `buffer`'s capacity for a later Take (a buffer with none is not kept).
  void GiveBack(Buffer buffer) ABSL_LOCKS_EXCLUDED(mu_) {
    if (buffer.capacity() == 0) return;
    buffer.clear();  // keeps the capacity
    absl::MutexLock lock(&mu_);
    if (kept_.size() >= max_kept_ || kept_bytes_ + Bytes(buffer) > max_kept_bytes_)
      return;  // freed
    kept_bytes_ += Bytes(buffer);
    kept_.push_back(std::move(buffer));
  }

  size_t kept() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return kept_.size();
  }

 private:
  BufferPool(size_t max_kept, size_t max_kept_bytes)
      : max_kept_(max_kept), max_kept_bytes_(max_kept_bytes) {}
  static size_t Bytes(const Buffer& buffer) {
    return buffer.capacity() * sizeof(typename Buffer::value_type);
  }

  const size_t max_kept_;
  const size_t max_kept_bytes_;
  mutable absl::Mutex mu_;
  std::vector<Buffer> kept_ ABSL_GUARDED_BY(mu_);
  size_t kept_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

// Byte strings of sent replies, kept for the next ones.
using ReplyBufferPool = BufferPool<std::string>;

// A slice owning `bytes` (moved) that gives them back to `pool` once gRPC is done.
grpc::Slice SliceGivingBack(std::shared_ptr<ReplyBufferPool> pool, std::string bytes);

}  // namespace paramserver

#endif  // PARAMSERVER_PS_BUFFER_POOL_H_
