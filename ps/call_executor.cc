#include "ps/call_executor.h"

namespace paramserver {

CallExecutor::CallExecutor(int max_threads) : max_threads_(max_threads < 1 ? 1 : max_threads) {}

CallExecutor::~CallExecutor() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    threads.swap(threads_);
  }
  for (std::thread& thread : threads) thread.join();
}

void CallExecutor::Run(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
  // A thread that is idle takes it; else a new one, while there may be more.
  if (idle_ >= static_cast<int>(queue_.size())) return;
  if (static_cast<int>(threads_.size()) < max_threads_) threads_.emplace_back([this] { Loop(); });
}

int CallExecutor::threads() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(threads_.size());
}

int CallExecutor::idle_threads() const {
  absl::MutexLock lock(&mu_);
  return idle_;
}

void CallExecutor::Loop() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      ++idle_;
      auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      // Idle threads wake now and then: a wait without a deadline is a hang waiting to
      // happen, and the check is cheap.
      while (!mu_.AwaitWithTimeout(absl::Condition(&has_work), absl::Seconds(10))) {
      }
      --idle_;
      if (queue_.empty()) return;  // stopping, and nothing left to run
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace paramserver
