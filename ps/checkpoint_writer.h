// Writes shard checkpoints on a background thread, so training never waits on the disk.
#ifndef PARAMSERVER_PS_CHECKPOINT_WRITER_H_
#define PARAMSERVER_PS_CHECKPOINT_WRITER_H_

#include <deque>
#include <map>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/checkpoint/shard_checkpoint.h"
#include "common/files/file_system.h"

namespace paramserver {

// Why checkpoints are not being written, while they are not (all zero once one is).
struct CheckpointFailure {
  int64_t failing_since_step = -1;  // the step of the first failed write
  int64_t failed_writes = 0;        // since the last success
  std::string error;                // the last error
};

// Thread-safe. Files go to `dir` on `fs` (see common/checkpoint/shard_checkpoint.h, and for an
// embedding shard's state common/checkpoint/embedding_checkpoint_files.h), which must
// outlive the writer; after each write the
// shard's files beyond its newest `keep` are deleted, except those at or after the
// retain-from step.
//
// A failed write (a full disk) does not wait for the next success to free space: the
// writer deletes every file of the shards it has written that is older than the
// retain-from step (never the rollback target, which is at or after it), and retries
// once. A write that still fails is logged, counted and reported by failure() until a
// later write succeeds.
class CheckpointWriter {
 public:
  CheckpointWriter(std::string dir, int keep, FileSystem& fs = LocalFileSystem());
  // Writes what is queued, then stops.
  ~CheckpointWriter();

  const std::string& dir() const { return dir_; }

  // Queues `state` for writing; returns at once. A failed write is logged and counted.
  // An embedding shard's rows may come in any order (a shard copies them as stored,
  // under its lock): the writer's thread sorts them by id (SortRowsById) first.
  void Enqueue(ShardState state) ABSL_LOCKS_EXCLUDED(mu_);

  // Writes `state` now, on the caller's thread (a handoff: the next owner reads it next).
  // REQUIRES: an embedding shard's rows by id (ParameterShard::Snapshot's); others are
  // refused (INVALID_ARGUMENT), never written out of order.
  absl::Status WriteNow(const ShardState& state) ABSL_LOCKS_EXCLUDED(mu_);

  // Files at or after `step` are never deleted (the scheduler's rollback horizon).
  void set_retain_from(int64_t step) ABSL_LOCKS_EXCLUDED(mu_);

  // The newest step written for `shard_id`, or -1.
  int64_t newest_step(int shard_id) const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `shard_id`'s checkpoint at `step` is written, or queued and not failed (one
  // of its last kRememberedWrites): what a delta may be written against.
  bool Holds(int shard_id, int64_t step) const ABSL_LOCKS_EXCLUDED(mu_);
  static constexpr size_t kRememberedWrites = 16;
  int64_t failed_writes() const ABSL_LOCKS_EXCLUDED(mu_);
  // failed_writes == 0 when the last write succeeded (or none failed).
  CheckpointFailure failure() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Write(const ShardState& state) ABSL_LOCKS_EXCLUDED(mu_);
  // Records `step` among `shard_id`'s held ones (once), the newest kRememberedWrites kept.
  void HoldLocked(int shard_id, int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Deletes the files older than the retain-from step of every shard written here;
  // returns how many. -1 when the retain-from step is not known yet (nothing deleted).
  int ReclaimSpace() ABSL_LOCKS_EXCLUDED(mu_);
  // RemoveOldShardCheckpoints, or for an embedding shard (in `buckets`: its bucket of
  // how many) RemoveOldEmbeddingCheckpoints.
  int RemoveOld(int shard_id, int keep, int64_t retain_from,
                const std::map<int, std::pair<int, int>>& buckets);

  const std::string dir_;
  const int keep_;
  FileSystem& fs_;
  mutable absl::Mutex mu_;
  std::deque<ShardState> queue_ ABSL_GUARDED_BY(mu_);
  std::map<int, int64_t> newest_step_ ABSL_GUARDED_BY(mu_);
  // Per shard, the steps queued or written (not failed), the newest kRememberedWrites.
  std::map<int, std::deque<int64_t>> held_steps_ ABSL_GUARDED_BY(mu_);
  // The embedding shards written: shard id -> (bucket, bucket count).
  std::map<int, std::pair<int, int>> embedding_buckets_ ABSL_GUARDED_BY(mu_);
  int64_t failed_writes_ ABSL_GUARDED_BY(mu_) = 0;
  CheckpointFailure failure_ ABSL_GUARDED_BY(mu_);
  int64_t retain_from_ ABSL_GUARDED_BY(mu_) = -1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex write_mu_;  // one file write at a time, in order
  std::thread thread_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_PS_CHECKPOINT_WRITER_H_
