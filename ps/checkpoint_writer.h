// Writes shard checkpoints on a background thread, so training never waits on the disk.
#ifndef PARAMSERVER_PS_CHECKPOINT_WRITER_H_
#define PARAMSERVER_PS_CHECKPOINT_WRITER_H_

#include <deque>
#include <map>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/shard_checkpoint.h"

namespace paramserver {

// Thread-safe. Files go to `dir` (see common/shard_checkpoint.h); after each write the
// shard's files beyond its newest `keep` are deleted, except those at or after the
// retain-from step.
class CheckpointWriter {
 public:
  CheckpointWriter(std::string dir, int keep);
  // Writes what is queued, then stops.
  ~CheckpointWriter();

  const std::string& dir() const { return dir_; }

  // Queues `state` for writing; returns at once. A failed write is logged and counted.
  void Enqueue(ShardState state) ABSL_LOCKS_EXCLUDED(mu_);

  // Writes `state` now, on the caller's thread (a handoff: the next owner reads it next).
  absl::Status WriteNow(const ShardState& state) ABSL_LOCKS_EXCLUDED(mu_);

  // Files at or after `step` are never deleted (the scheduler's rollback horizon).
  void set_retain_from(int64_t step) ABSL_LOCKS_EXCLUDED(mu_);

  // The newest step written for `shard_id`, or -1.
  int64_t newest_step(int shard_id) const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t failed_writes() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Write(const ShardState& state) ABSL_LOCKS_EXCLUDED(mu_);

  const std::string dir_;
  const int keep_;
  mutable absl::Mutex mu_;
  std::deque<ShardState> queue_ ABSL_GUARDED_BY(mu_);
  std::map<int, int64_t> newest_step_ ABSL_GUARDED_BY(mu_);
  int64_t failed_writes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t retain_from_ ABSL_GUARDED_BY(mu_) = -1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex write_mu_;  // one file write at a time, in order
  std::thread thread_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_PS_CHECKPOINT_WRITER_H_
