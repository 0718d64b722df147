#include "ps/checkpoint_writer.h"

#include <algorithm>

#include "common/checkpoint/embedding_checkpoint_files.h"
#include "spdlog/spdlog.h"

namespace paramserver {
namespace {

// A dense shard's one file, or an embedding shard's file per table.
absl::Status WriteState(FileSystem& fs, const std::string& dir, const ShardState& state) {
  if (state.tables.empty()) return WriteShardCheckpoint(fs, dir, state);
  return WriteEmbeddingCheckpoints(fs, dir, state.tables, state.epoch);
}

}  // namespace

CheckpointWriter::CheckpointWriter(std::string dir, int keep, FileSystem& fs)
    : dir_(std::move(dir)), keep_(keep), fs_(fs), thread_([this] { Loop(); }) {}

CheckpointWriter::~CheckpointWriter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void CheckpointWriter::Enqueue(ShardState state) {
  absl::MutexLock lock(&mu_);
  HoldLocked(state.shard_id, state.step);
  queue_.push_back(std::move(state));
}

void CheckpointWriter::HoldLocked(int shard_id, int64_t step) {
  std::deque<int64_t>& held = held_steps_[shard_id];
  if (std::find(held.begin(), held.end(), step) != held.end()) return;
  held.push_back(step);
  while (held.size() > kRememberedWrites) held.pop_front();
}

bool CheckpointWriter::Holds(int shard_id, int64_t step) const {
  absl::MutexLock lock(&mu_);
  auto held = held_steps_.find(shard_id);
  return held != held_steps_.end() &&
         std::find(held->second.begin(), held->second.end(), step) != held->second.end();
}

absl::Status CheckpointWriter::WriteNow(const ShardState& state) { return Write(state); }

int CheckpointWriter::ReclaimSpace() {
  int64_t retain_from = -1;
  std::vector<int> shards;
  std::map<int, std::pair<int, int>> buckets;
  {
    absl::MutexLock lock(&mu_);
    retain_from = retain_from_;
    for (const auto& [id, step] : newest_step_) shards.push_back(id);
    buckets = embedding_buckets_;
  }
  if (retain_from < 0) return -1;
  int removed = 0;
  for (int id : shards) removed += RemoveOld(id, /*keep=*/0, retain_from, buckets);
  return removed;
}

absl::Status CheckpointWriter::Write(const ShardState& state) {
  absl::MutexLock write_lock(&write_mu_);
  absl::Status written = WriteState(fs_, dir_, state);
  if (!written.ok()) {
    const int reclaimed = ReclaimSpace();
    if (reclaimed > 0) {
      spdlog::warn(
          "checkpoint of shard {} at step {} failed ({}); deleted {} files older than the rollback "
          "target "
          "to make room, retrying",
          state.shard_id, state.step, std::string(written.message()), reclaimed);
      written = WriteState(fs_, dir_, state);
    }
  }
  absl::MutexLock lock(&mu_);
  if (!written.ok()) {
    // A delta must not be written against it (Holds).
    std::deque<int64_t>& held = held_steps_[state.shard_id];
    held.erase(std::remove(held.begin(), held.end(), state.step), held.end());
    ++failed_writes_;
    if (failure_.failed_writes++ == 0) failure_.failing_since_step = state.step;
    failure_.error = std::string(written.message());
    // The 1st, 2nd, 4th, 8th... failure: a full disk is named at once without a line per
    // attempt; heartbeats, psctl status and the metrics carry it continuously.
    if ((failure_.failed_writes & (failure_.failed_writes - 1)) == 0) {
      spdlog::error(
          "checkpoint of shard {} at step {} failed: {} (failing since step {}, {} failed writes)",
          state.shard_id, state.step, written.ToString(), failure_.failing_since_step,
          failure_.failed_writes);
    }
    return written;
  }
  if (failure_.failed_writes > 0) {
    spdlog::info(
        "checkpoints are written again (shard {} at step {}), after {} failed writes since step {}",
        state.shard_id, state.step, failure_.failed_writes, failure_.failing_since_step);
    failure_ = CheckpointFailure{};
  }
  HoldLocked(state.shard_id, state.step);  // a WriteNow's; an Enqueue's is held already
  int64_t& newest = newest_step_.try_emplace(state.shard_id, -1).first->second;
  newest = std::max(newest, state.step);
  if (!state.tables.empty()) {
    embedding_buckets_[state.shard_id] = {state.tables[0].shard_id, state.tables[0].shard_count};
  }
  RemoveOld(state.shard_id, keep_, retain_from_, embedding_buckets_);
  if (queue_.size() > 100) {
    spdlog::warn(
        "{} checkpoints are waiting to be written: checkpoint.every_steps may be too small",
        queue_.size());
  }
  return absl::OkStatus();
}

int CheckpointWriter::RemoveOld(int shard_id, int keep, int64_t retain_from,
                                const std::map<int, std::pair<int, int>>& buckets) {
  auto bucket = buckets.find(shard_id);
  if (bucket == buckets.end())
    return RemoveOldShardCheckpoints(fs_, dir_, shard_id, keep, retain_from);
  return RemoveOldEmbeddingCheckpoints(fs_, dir_, bucket->second.first, bucket->second.second, keep,
                                       retain_from);
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
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(1));
      if (queue_.empty()) {
        if (stopping_) return;
        continue;
      }
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    SortRowsById(&next);        // the shard copied its rows as stored, under its lock
    Write(next).IgnoreError();  // logged and counted in Write
  }
}

int64_t CheckpointWriter::newest_step(int shard_id) const {
  absl::MutexLock lock(&mu_);
  auto it = newest_step_.find(shard_id);
  return it == newest_step_.end() ? -1 : it->second;
}

CheckpointFailure CheckpointWriter::failure() const {
  absl::MutexLock lock(&mu_);
  return failure_;
}

int64_t CheckpointWriter::failed_writes() const {
  absl::MutexLock lock(&mu_);
  return failed_writes_;
}

}  // namespace paramserver
