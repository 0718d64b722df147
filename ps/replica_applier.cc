#include "ps/replica_applier.h"

#include <algorithm>
#include <utility>

#include "spdlog/spdlog.h"

namespace paramserver {
namespace {

// How long an idle applier sleeps before it looks again (every wait has a deadline).
constexpr absl::Duration kIdleWait = absl::Seconds(1);

}  // namespace

ReplicaApplier::ReplicaApplier(int threads, absl::Duration hold) : hold_(hold) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { Run(); });
}

ReplicaApplier::~ReplicaApplier() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& thread : threads_) thread.join();
}

int ReplicaApplier::DefaultThreads() {
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 2, 1, 4);
}

void ReplicaApplier::Schedule(const std::shared_ptr<ParameterShard>& shard) {
  absl::MutexLock lock(&mu_);
  if (!queued_.insert(shard).second) return;  // already queued: that apply takes these too
  queue_.push_back(Scheduled{shard, absl::Now() + hold_});
}

void ReplicaApplier::Run() {
  while (true) {
    Scheduled next;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.AwaitWithTimeout(absl::Condition(&ready), kIdleWait);
      if (stopping_) return;
      if (queue_.empty()) continue;
      next = std::move(queue_.front());
      queue_.pop_front();
      // Entries received from here on schedule the shard again.
      queued_.erase(next.shard);
      // A test's hold: entries stay received and unapplied this long.
      auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
      if (hold_ > absl::ZeroDuration() &&
          mu_.AwaitWithDeadline(absl::Condition(&stopping), next.due)) {
        return;
      }
    }
    std::shared_ptr<ParameterShard> shard = next.shard.lock();
    if (shard == nullptr) continue;
    const absl::Time received_before =
        hold_ > absl::ZeroDuration() ? absl::Now() - hold_ : absl::InfiniteFuture();
    if (absl::Status applied = shard->ApplyReceived(received_before); !applied.ok()) {
      spdlog::error("shard {}: {}", shard->options().shard_id, applied.ToString());
    } else if (hold_ > absl::ZeroDuration() && shard->has_unapplied()) {
      Schedule(shard);  // the entries received since wait their turn
    }
  }
}

}  // namespace paramserver
