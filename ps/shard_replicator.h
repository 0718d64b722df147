// Primary-backup replication of one shard: the primary's mutation log, forwarded in
// order to every backup, and the wait that holds a push's acknowledgement until all
// backups have applied it. Also the wire form of log entries and replica states.
#ifndef PARAMSERVER_PS_SHARD_REPLICATOR_H_
#define PARAMSERVER_PS_SHARD_REPLICATOR_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/parameter_server.grpc.pb.h"
#include "ps/parameter_shard.h"

namespace paramserver {

struct BackupTarget {
  std::string name;
  std::string address;
};

// Thread-safe. One sender thread per backup sends the log entries that backup has not
// acknowledged, consecutively from its acknowledged index, one request at a time, and
// retries (with backoff) until they are acknowledged, the backup is removed, or the
// replicator is closed. Entries every backup acknowledged are dropped.
class ShardReplicator final : public ShardLogSink {
 public:
  // `rpc_timeout` bounds each Replicate call.
  ShardReplicator(int shard_id, std::string primary_name, absl::Duration rpc_timeout);
  // Close()s.
  ~ShardReplicator() override;

  // From now on replicates to `backups`, stamping requests with `epoch`. Backups it
  // already had keep their progress; a new one counts as having every entry up to
  // `log_index` (it copies the shard's state, taken at or after that index).
  void SetBackups(int64_t epoch, const std::vector<BackupTarget>& backups, int64_t log_index)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Queues one entry (its index set by the shard, in index order).
  void Append(ShardMutation mutation) override ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until every backup has applied entry `index`, or `deadline`. OK at once with
  // no backups. UNAVAILABLE naming the backup that is behind, at the deadline;
  // FAILED_PRECONDITION once a backup refused this server as the shard's primary
  // (it was replaced: fenced); UNAVAILABLE after Close().
  absl::Status WaitReplicated(int64_t index, absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);

  // Stops the senders (waits for calls in flight, at most rpc_timeout) and wakes waiters.
  void Close() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Backup {
    BackupTarget target;
    std::unique_ptr<ParameterServer::Stub> stub;
    int64_t acked = 0;
    bool removed = false;
    std::thread sender;
  };

  void SendLoop(Backup* backup) ABSL_LOCKS_EXCLUDED(mu_);
  int64_t MinAckedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TrimLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int shard_id_;
  const std::string primary_name_;
  const absl::Duration rpc_timeout_;
  mutable absl::Mutex mu_;
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::string fenced_ ABSL_GUARDED_BY(mu_);  // why a backup refused us; empty if none did
  std::map<int64_t, ShardMutation> entries_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Backup>> backups_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Backup>> retired_ ABSL_GUARDED_BY(mu_);  // removed; joined on Close
};

// The log entry as a backup applies it. INVALID_ARGUMENT for a gradient of the wrong
// size or an entry with no mutation.
absl::StatusOr<ShardMutation> MutationFromEntry(const ShardLogEntry& entry, int64_t shard_size);
// The wire form of a primary's log entry for `shard_id`.
ShardLogEntry EntryFromMutation(const ShardMutation& mutation, int shard_id);

ShardReplicaState ReplicaStateToProto(const ReplicaState& replica);
// INVALID_ARGUMENT for byte fields whose lengths do not match the range.
absl::StatusOr<ReplicaState> ReplicaStateFromProto(const ShardReplicaState& proto);

}  // namespace paramserver

#endif  // PARAMSERVER_PS_SHARD_REPLICATOR_H_
