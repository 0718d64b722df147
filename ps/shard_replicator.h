// Primary-backup replication: each primary shard's mutation log, forwarded in order to
// every backup, and the wait that holds a push's acknowledgement until every backup that
// holds the shard has received it: in order, in memory, applied or to be applied before
// that backup serves as a primary (ParameterShard::ReceiveLogEntries). One link per backup server
// carries the entries of every shard it backs up for this server in one call, so replication costs
// one RPC per batch, not per shard. Also the wire form of log entries and replica states.
#ifndef PARAMSERVER_PS_SHARD_REPLICATOR_H_
#define PARAMSERVER_PS_SHARD_REPLICATOR_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/rpc/retry_policy.h"
#include "common/security/peer_credentials.h"
#include "proto/parameter_server.grpc.pb.h"
#include "ps/parameter_shard.h"

namespace paramserver {

struct BackupTarget {
  std::string name;
  std::string address;
};

class ReplicationLink;

// Thread-safe. The log of one primary shard and each backup's progress through it.
// Entries every backup acknowledged are dropped. Create with ReplicationLinks::
// NewReplicator; Close() it when the shard stops being primary here.
class ShardReplicator final : public ShardLogSink,
                              public std::enable_shared_from_this<ShardReplicator> {
 public:
  ShardReplicator(int shard_id, std::string primary_name, class ReplicationLinks* links);
  ~ShardReplicator() override;

  // From now on replicates to `backups`, stamping batches with `epoch`. Backups it
  // already had keep their progress; a new one is sent the entries after `log_index`
  // but holds nothing until it copies the shard (CopyStarting).
  void SetBackups(int64_t epoch, const std::vector<BackupTarget>& backups, int64_t log_index)
      ABSL_LOCKS_EXCLUDED(mu_);

  // This server is about to take a copy of the shard for `backup`: from now on
  // acknowledgements wait for it. Before that they do not: a
  // backup still copying cannot be promoted (the scheduler promotes one only once it
  // has reported the copy done), and the copy it takes holds every entry applied
  // before. Then BackupHolds with the copy's log index.
  void CopyStarting(const std::string& backup) ABSL_LOCKS_EXCLUDED(mu_);
  // `backup` holds the shard's state at `log_index` (a copy this server took for it, or
  // the state it had as the shard's primary when it handed the shard to this server):
  // acknowledgements wait for it, and it is sent the entries after. Both are ignored
  // for a backup this replicator does not have, and hold whatever the map the copy was
  // asked under: a backup kept across maps keeps following this log (and one that
  // abandoned its copy copies again, so counting it early only delays).
  void BackupHolds(const std::string& backup, int64_t log_index) ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until `backup` holds the shard and has received entry `index`: OK then.
  // FAILED_PRECONDITION if it is not one of the backups, or once a backup refused this
  // server as primary; UNAVAILABLE at the deadline or after Close().
  absl::Status AwaitBackup(const std::string& backup, int64_t index, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Queues one entry (its index set by the shard, in index order).
  void Append(ShardMutation mutation) override ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until every backup that holds the shard (CopyStarting) has received entry
  // `index` (it applies it before it could serve as the primary), or `deadline`. OK at once with
  // none. UNAVAILABLE naming the backup that is behind, at the deadline; FAILED_PRECONDITION once a
  // backup refused this server as the shard's primary (it was replaced: fenced); UNAVAILABLE after
  // Close().
  absl::Status WaitReplicated(int64_t index, absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);

  // Detaches from the links and wakes waiters. Idempotent.
  void Close() ABSL_LOCKS_EXCLUDED(mu_);

  // For the links: adds this shard's next entries for `backup` to `request` (nothing if
  // none are ready); returns whether it added a batch.
  bool TakeBatch(const std::string& backup, ReplicateRequest* request) ABSL_LOCKS_EXCLUDED(mu_);
  // For the links: the backup's answer for this shard, or `failure` if the call failed.
  void OnResult(const std::string& backup, const ShardReplicationResult& result)
      ABSL_LOCKS_EXCLUDED(mu_);
  void OnCallFailed(const std::string& backup, const grpc::Status& failure)
      ABSL_LOCKS_EXCLUDED(mu_);

  int shard_id() const { return shard_id_; }

 private:
  struct Backup {
    BackupTarget target;
    std::shared_ptr<ReplicationLink> link;
    int64_t acked = 0;
    // It has a copy of the shard (a backup kept from an earlier map, or one this server
    // copied the shard for): acknowledgements wait for it.
    bool holds = false;
    bool in_flight = false;  // a batch of ours is on its way to this backup
    absl::Time retry_at;     // after a failed batch: not before then
    // Between retries of a batch the backup did not take.
    ExponentialBackoff backoff{{absl::Milliseconds(10), absl::Milliseconds(500)}};
    bool reported_gap = false;
    // Until it takes a batch at the newest map (a new backup copies the shard, and any
    // backup installs the map and learns our credential) its failures are retried at
    // once, for a while: the steps' acknowledgements wait for it.
    absl::Time map_changed_at;
    bool took_batch_at_map = false;
  };

  // The lowest index every backup has received (entries up to it may be dropped).
  int64_t MinAckedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether every backup that holds the shard has received `index`.
  bool ReplicatedLocked(int64_t index) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Backup* FindLocked(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HasReadyLocked(const Backup& backup) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int shard_id_;
  const std::string primary_name_;
  ReplicationLinks* const links_;
  mutable absl::Mutex mu_;
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::string fenced_ ABSL_GUARDED_BY(mu_);  // why a backup refused us; empty if none did
  std::map<int64_t, ShardMutation> entries_ ABSL_GUARDED_BY(mu_);
  std::vector<Backup> backups_ ABSL_GUARDED_BY(mu_);
};

// Thread-safe. The links of one server to its backup servers (one sender thread each;
// each shard's batches go one at a time, retried with backoff until acknowledged or
// the replicator is closed), and the replicators of its primary shards.
class ReplicationLinks {
 public:
  // `rpc_timeout` bounds each Replicate call; every call carries `credentials` (this
  // server's: backups accept replication only from the shard's primary).
  // `lease`: a primary none of whose backups holds its shard yet (they all still copy
  // it) acknowledges updates alone only within `lease` of the last RenewLease. The
  // daemon gives half the failure timeout and renews with each heartbeat the scheduler
  // answered, from when it was sent: a primary the scheduler has declared dead (silent a
  // whole failure timeout) and replaced cannot acknowledge anything alone. Infinite:
  // always (a server with no scheduler).
  ReplicationLinks(std::string node_name, absl::Duration rpc_timeout,
                   std::shared_ptr<const CallCredentials> credentials = nullptr,
                   absl::Duration lease = absl::InfiniteDuration());
  // Stops every link (waiting at most rpc_timeout plus 2 s for a call in flight, the
  // last second after cancelling it).
  ~ReplicationLinks();

  std::shared_ptr<ShardReplicator> NewReplicator(int shard_id);
  // The scheduler answered a heartbeat this server sent at `sent_at`.
  void RenewLease(absl::Time sent_at);
  // Whether a primary may acknowledge with no backup holding its shard (see `lease`).
  bool MayAcknowledgeAlone() const;
  // The link to `backup` (created on first use).
  std::shared_ptr<ReplicationLink> Link(const BackupTarget& backup) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::string node_name_;
  const absl::Duration rpc_timeout_;
  const std::shared_ptr<const CallCredentials> credentials_;
  const absl::Duration lease_;
  std::atomic<int64_t> lease_until_unix_ns_{std::numeric_limits<int64_t>::min()};
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<ReplicationLink>> links_
      ABSL_GUARDED_BY(mu_);  // by name@address
};

// The wire form of a primary's log entry for `shard_id`.
ShardLogEntry EntryFromMutation(const ShardMutation& mutation, int shard_id);
// The log entry as a backup of a shard with `options` applies it. INVALID_ARGUMENT for a
// gradient of the wrong size, ids that do not fit an embedding shard, or an entry with
// no mutation.
absl::StatusOr<ShardMutation> MutationFromEntry(const ShardLogEntry& entry,
                                                const ParameterShardOptions& options);

// The replica's whole state as one message (an embedding shard's rows with their
// recency links, when the replica has them: ExportReplicaAsStored's).
ShardReplicaState ReplicaStateToProto(const ReplicaState& replica);

// What the receiver expects of a replica: the range its shard map assigns, and the
// cluster's worker count. Checked before anything is allocated for the peer's numbers.
struct ReplicaExpectation {
  ParameterRange range;
  int num_workers = 0;
  const EmbeddingShardOptions* embedding = nullptr;  // an embedding shard's tables
  // The spec's optimizer, which pending settings (a script's) are read against; null:
  // a replica carrying any is refused.
  const DenseOptimizerOptions* optimizer = nullptr;
};
// INVALID_ARGUMENT for a range other than the expected one, per-worker state for another
// worker count, or byte fields whose lengths do not match the range.
absl::StatusOr<ReplicaState> ReplicaStateFromProto(const ShardReplicaState& proto,
                                                   const ReplicaExpectation& expected);

// The bytes of bulk data a FetchShardState piece carries at most (the last piece less):
// far below a message's limit, so a shard of any size can be copied.
inline constexpr size_t kShardStatePieceBytes = 4 << 20;

// A new backup copies its primary's state as a stream of pieces (ShardStatePiece): a
// header (the state without its bulk fields, and their lengths) first, then the bulk
// fields' bytes, at most `piece_bytes` a piece. `write` sends one piece and returns
// false once the stream is broken (the caller went away); then this stops, with
// CANCELLED. RESOURCE_EXHAUSTED, before anything is written, for a header past
// `max_header_bytes` (pending gradients of a sync step too large to send), naming the
// shard and its size.
absl::Status WriteReplicaStatePieces(const ReplicaState& replica, size_t piece_bytes,
                                     size_t max_header_bytes,
                                     const std::function<bool(const ShardStatePiece&)>& write);

// A backup's side of that stream: rebuilds the primary's state from its pieces, each
// checked as it comes, before anything is reserved for it. The header must come first;
// the lengths it declares must fit `expected` (a dense range's floats exactly; a
// table's ids, rows, state and recency links (or none) one row count of its dim and
// optimizer, within its max_rows when it has one) and, in all, this machine's memory;
// no piece may carry more than was declared. Finish orders rows that came with links.
// Not thread-safe.
class ReplicaStateAssembler {
 public:
  // `expected`'s pointers outlive the assembler.
  explicit ReplicaStateAssembler(ReplicaExpectation expected);

  // INVALID_ARGUMENT naming what is wrong with the piece (then nothing more may be
  // added). Takes the piece's bytes.
  absl::Status Add(ShardStatePiece&& piece);
  // The state, checked as ReplicaStateFromProto checks one (which it calls), once the
  // header and every byte it declared have come; INVALID_ARGUMENT naming what is
  // missing otherwise.
  absl::StatusOr<ReplicaState> Finish();

  int64_t bulk_bytes_received() const { return received_; }
  int64_t bulk_bytes_expected() const { return expected_bytes_; }

 private:
  absl::Status AddHeader(ShardStatePiece&& piece);

  ReplicaExpectation expected_;
  bool has_header_ = false;
  absl::Status broken_;  // the first refusal; every later call returns it
  ShardReplicaState state_;
  std::vector<std::string*> fields_;  // the bulk fields of state_, in the stream's order
  std::vector<int64_t> lengths_;      // each one's declared length
  size_t field_ = 0;                  // the field being filled
  int64_t received_ = 0;
  int64_t expected_bytes_ = 0;
};

}  // namespace paramserver

#endif  // PARAMSERVER_PS_SHARD_REPLICATOR_H_
