#include "ps/checkpoint_writer.h"

#include "spdlog/spdlog.h"

namespace paramserver {

CheckpointWriter::CheckpointWriter(std::string dir, int keep)
    : dir_(std::move(dir)), keep_(keep), thread_([this] { Loop(); }) {}

CheckpointWriter::~CheckpointWriter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void CheckpointWriter::Enqueue(ShardState state) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(state));
}

absl::Status CheckpointWriter::WriteNow(const ShardState& state) { return Write(state); }

absl::Status CheckpointWriter::Write(const ShardState& state) {
  absl::MutexLock write_lock(&write_mu_);
  absl::Status written = WriteShardCheckpoint(dir_, state);
  absl::MutexLock lock(&mu_);
  if (!written.ok()) {
    ++failed_writes_;
    spdlog::error("checkpoint of shard {} at step {} failed: {}", state.shard_id, state.step, written.ToString());
    return written;
  }
  int64_t& newest = newest_step_.try_emplace(state.shard_id, -1).first->second;
  newest = std::max(newest, state.step);
  RemoveOldShardCheckpoints(dir_, state.shard_id, keep_, retain_from_);
  if (queue_.size() > 100) {
    spdlog::warn("{} checkpoints are waiting to be written: checkpoint.every_steps may be too small", queue_.size());
  }
  return absl::OkStatus();
}

void CheckpointWriter::set_retain_from(int64_t step) {
  absl::MutexLock lock(&mu_);
  retain_from_ = step;
}

void CheckpointWriter::Loop() {
  while (true) {
    ShardState next;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(1));
      if (queue_.empty()) {
        if (stopping_) return;
        continue;
      }
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    Write(next).IgnoreError();  // logged and counted in Write
  }
}

int64_t CheckpointWriter::newest_step(int shard_id) const {
  absl::MutexLock lock(&mu_);
  auto it = newest_step_.find(shard_id);
  return it == newest_step_.end() ? -1 : it->second;
}

int64_t CheckpointWriter::failed_writes() const {
  absl::MutexLock lock(&mu_);
  return failed_writes_;
}

}  // namespace paramserver
