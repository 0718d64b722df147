#include "ps/shard_replicator.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/rpc/rpc_endpoints.h"
#include "common/wire/sparse_rows.h"
#include "common/wire/tensor_codec.h"
#include "spdlog/spdlog.h"

namespace paramserver {
namespace {

// One shard's batch in a Replicate call carries at most this many entries / bytes.
constexpr int kMaxEntriesPerBatch = 64;
constexpr size_t kMaxBytesPerBatch = 32 << 20;
// A backup that is not ready after a map change (still copying the shard, installing the
// map) is asked again this soon, for kMapChangeGrace: a step's acknowledgement may wait
// for it, and getting ready takes milliseconds.
constexpr absl::Duration kNotReadyRetry = absl::Milliseconds(1);
// How long after a map change a backup's failures count as its getting ready (then:
// backoff).
constexpr absl::Duration kMapChangeGrace = absl::Seconds(1);
// With nothing to send, the link looks again this often (batches whose backoff passed).
constexpr absl::Duration kIdlePoll = absl::Milliseconds(20);

}  // namespace

// Thread-safe. Sends the ready entries of every attached replicator to one backup
// server: whatever is ready goes out together in one call; calls overlap, but each
// shard has at most one batch in flight, so its entries arrive in order. Always owned
// by a shared_ptr, and stopped (Stop) before its owners let it go. The link owns its
// calls (reactors: gRPC has let a call go when its OnDone runs), and frees them on its
// own thread or in Stop, so neither a call nor the link's channel goes on a gRPC thread
// (the last of a process's channels going there ends gRPC on it while its owner's
// thread goes on). The exception: a call still in flight when Stop's wait ends, even
// cancelled, keeps the link alive, and the last such call lets it go on gRPC's thread.
class ReplicationLink : public std::enable_shared_from_this<ReplicationLink> {
 public:
  ReplicationLink(BackupTarget target, absl::Duration rpc_timeout,
                  const std::shared_ptr<const CallCredentials>& credentials)
      : target_(std::move(target)),
        rpc_timeout_(rpc_timeout),
        stub_(ParameterServer::NewStub(CreateChannel(target_.address, credentials))),
        thread_([this] { SendLoop(); }) {}
  ~ReplicationLink() { Stop(); }  // stopped already by its owner: then nothing to do

  void Attach(std::shared_ptr<ShardReplicator> replicator) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    attached_.push_back(std::move(replicator));
    pending_ = true;
  }
  void Detach(const ShardReplicator* replicator) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    attached_.erase(std::remove_if(attached_.begin(), attached_.end(),
                                   [&](const std::shared_ptr<ShardReplicator>& r) {
                                     return r.get() == replicator;
                                   }),
                    attached_.end());
  }
  void Notify() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    pending_ = true;
  }
  // Looks for ready batches again no later than `when` (a retry's time).
  void NotifyAt(absl::Time when) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    wake_at_ = std::min(wake_at_, when);
  }
  // Stops sending and waits (at most rpc_timeout plus a margin) for calls in flight, then
  // cancels those left and waits a little more; one still in flight after that finishes
  // later, keeping the link alive meanwhile. Idempotent; not from two threads at once.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<std::shared_ptr<ShardReplicator>> detached;  // let go with no lock held
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
      detached.swap(attached_);
    }
    if (thread_.joinable()) thread_.join();
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_flight_.empty(); };
    std::vector<grpc::ClientContext*> late;
    {
      absl::MutexLock lock(&mu_);
      if (!mu_.AwaitWithTimeout(absl::Condition(&idle), rpc_timeout_ + absl::Seconds(1))) {
        for (const auto& call : in_flight_) late.push_back(&call->context);
      }
    }
    // Cancelled with no lock held (a call's end takes it). Each call lives meanwhile:
    // only the send thread (stopped) and Stop free calls.
    for (grpc::ClientContext* context : late) context->TryCancel();
    std::vector<std::unique_ptr<Call>> ended;
    absl::MutexLock lock(&mu_);
    if (!late.empty() && !mu_.AwaitWithTimeout(absl::Condition(&idle), kCancelledCallEnd)) {
      spdlog::warn("replication to {}: {} call(s) still in flight past their deadline at stop",
                   target_.name, in_flight_.size());
      // Their completions use the link: it lives until the last (none, in the
      // destructor: every owner stops the link before it lets it go).
      kept_alive_by_calls_ = weak_from_this().lock();
    }
    ended.swap(ended_);
  }

 private:
  // One Replicate call. gRPC has let it go when OnDone runs: the link frees it after.
  struct Call final : public grpc::ClientUnaryReactor {
    explicit Call(ReplicationLink* link) : link(link) {}
    void OnDone(const grpc::Status& status) override { link->Finish(this, status); }

    ReplicationLink* const link;
    grpc::ClientContext context;
    ReplicateRequest request;
    ReplicateResponse response;
    std::vector<std::shared_ptr<ShardReplicator>> sent;  // in the order of request.shards()
  };

  void SendLoop() ABSL_LOCKS_EXCLUDED(mu_) {
    while (true) {
      std::vector<std::shared_ptr<ShardReplicator>> replicators;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || pending_; };
        // The deadline also retries batches whose backoff has passed.
        mu_.AwaitWithDeadline(absl::Condition(&ready), std::min(wake_at_, absl::Now() + kIdlePoll));
        if (stop_) return;
        pending_ = false;
        // A retry time not yet reached stays: the next wait ends at it.
        if (absl::Now() >= wake_at_) wake_at_ = absl::InfiniteFuture();
        replicators = attached_;
      }
      auto call = std::make_unique<Call>(this);
      for (const auto& replicator : replicators) {
        if (replicator->TakeBatch(target_.name, &call->request)) call->sent.push_back(replicator);
      }
      std::vector<std::unique_ptr<Call>> ended;
      {
        absl::MutexLock lock(&mu_);
        ended.swap(ended_);  // freed here, on this thread
      }
      if (call->sent.empty()) continue;
      call->context.set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout_));
      Call* sending = call.get();
      {
        absl::MutexLock lock(&mu_);
        in_flight_.push_back(std::move(call));
      }
      stub_->async()->Replicate(&sending->context, &sending->request, &sending->response, sending);
      sending->StartCall();
    }
  }

  // The end of `call`, from its OnDone (gRPC's thread): hands the call back to the link,
  // and lets the link go if Stop left it to its calls. Nothing after touches either.
  void Finish(Call* call, const grpc::Status& status) ABSL_LOCKS_EXCLUDED(mu_) {
    if (status.ok() && call->response.results_size() == static_cast<int>(call->sent.size())) {
      for (size_t i = 0; i < call->sent.size(); ++i)
        call->sent[i]->OnResult(target_.name, call->response.results(i));
    } else {
      const grpc::Status failure =
          status.ok() ? grpc::Status(grpc::StatusCode::INTERNAL, "malformed Replicate response")
                      : status;
      for (const auto& replicator : call->sent) replicator->OnCallFailed(target_.name, failure);
    }
    std::shared_ptr<ReplicationLink> last_use;
    {
      absl::MutexLock lock(&mu_);
      auto it = std::find_if(in_flight_.begin(), in_flight_.end(),
                             [call](const std::unique_ptr<Call>& c) { return c.get() == call; });
      if (it == in_flight_.end()) {  // gRPC ends each call once: a broken invariant
        spdlog::critical("replication to {}: a call ended that was not in flight", target_.name);
        std::abort();
      }
      ended_.push_back(std::move(*it));
      in_flight_.erase(it);
      pending_ = true;
      if (in_flight_.empty()) last_use = std::move(kept_alive_by_calls_);
    }
  }  // `last_use` may free the link: nothing here touches it after.

  const BackupTarget target_;
  const absl::Duration rpc_timeout_;
  const std::unique_ptr<ParameterServer::Stub> stub_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool pending_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time wake_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // The calls gRPC has not completed, and those completed but not yet freed.
  std::vector<std::unique_ptr<Call>> in_flight_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Call>> ended_ ABSL_GUARDED_BY(mu_);
  // Set by a Stop whose wait ended with calls in flight: the last of them lets it go.
  std::shared_ptr<ReplicationLink> kept_alive_by_calls_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<ShardReplicator>> attached_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: starts once the rest is built
};

ReplicationLinks::ReplicationLinks(std::string node_name, absl::Duration rpc_timeout,
                                   std::shared_ptr<const CallCredentials> credentials,
                                   absl::Duration lease)
    : node_name_(std::move(node_name)),
      rpc_timeout_(rpc_timeout),
      credentials_(std::move(credentials)),
      lease_(lease) {}

void ReplicationLinks::RenewLease(absl::Time sent_at) {
  const int64_t until = absl::ToUnixNanos(sent_at + lease_);
  int64_t now_until = lease_until_unix_ns_.load();
  while (until > now_until && !lease_until_unix_ns_.compare_exchange_weak(now_until, until)) {
  }
}

bool ReplicationLinks::MayAcknowledgeAlone() const {
  return lease_ == absl::InfiniteDuration() ||
         absl::ToUnixNanos(absl::Now()) < lease_until_unix_ns_.load();
}

ReplicationLinks::~ReplicationLinks() {
  std::map<std::string, std::shared_ptr<ReplicationLink>> links;
  {
    absl::MutexLock lock(&mu_);
    links.swap(links_);
  }
  for (auto& [key, link] : links) link->Stop();
}

std::shared_ptr<ShardReplicator> ReplicationLinks::NewReplicator(int shard_id) {
  return std::make_shared<ShardReplicator>(shard_id, node_name_, this);
}

std::shared_ptr<ReplicationLink> ReplicationLinks::Link(const BackupTarget& backup) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<ReplicationLink>& link = links_[backup.name + "@" + backup.address];
  if (link == nullptr) link = std::make_shared<ReplicationLink>(backup, rpc_timeout_, credentials_);
  return link;
}

ShardReplicator::ShardReplicator(int shard_id, std::string primary_name, ReplicationLinks* links)
    : shard_id_(shard_id), primary_name_(std::move(primary_name)), links_(links) {}

ShardReplicator::~ShardReplicator() { Close(); }

ShardReplicator::Backup* ShardReplicator::FindLocked(const std::string& name) {
  for (Backup& backup : backups_) {
    if (backup.target.name == name) return &backup;
  }
  return nullptr;
}

void ShardReplicator::SetBackups(int64_t epoch, const std::vector<BackupTarget>& backups,
                                 int64_t log_index) {
  absl::MutexLock lock(&mu_);
  if (closed_) return;
  const bool map_changed = epoch > epoch_;
  epoch_ = std::max(epoch_, epoch);
  fenced_.clear();  // a new map: whoever refused us may accept us now, or we are dropped
  const absl::Time now = absl::Now();
  std::vector<Backup> next;
  for (const BackupTarget& target : backups) {
    Backup* known = FindLocked(target.name);
    if (known != nullptr && known->target.address == target.address) {
      next.push_back(*known);
      if (map_changed) {
        // It may refuse our batches until it serves this map too.
        next.back().map_changed_at = now;
        next.back().took_batch_at_map = false;
      }
      continue;
    }
    Backup backup;
    backup.target = target;
    backup.link = links_->Link(target);
    backup.link->Attach(shared_from_this());
    backup.acked = log_index;
    backup.map_changed_at = now;
    next.push_back(std::move(backup));
  }
  for (const Backup& old : backups_) {
    const bool kept =
        std::any_of(next.begin(), next.end(), [&](const Backup& b) { return b.link == old.link; });
    if (!kept) old.link->Detach(this);
  }
  backups_ = std::move(next);
  entries_.erase(entries_.begin(), entries_.upper_bound(MinAckedLocked()));
  for (const Backup& backup : backups_) backup.link->Notify();
}

void ShardReplicator::CopyStarting(const std::string& backup_name) {
  absl::MutexLock lock(&mu_);
  Backup* backup = FindLocked(backup_name);
  if (closed_ || backup == nullptr) return;
  backup->holds = true;
}

void ShardReplicator::BackupHolds(const std::string& backup_name, int64_t log_index) {
  absl::MutexLock lock(&mu_);
  Backup* backup = FindLocked(backup_name);
  if (closed_ || backup == nullptr) return;
  backup->holds = true;
  // It holds every entry up to log_index: the batches start after it.
  backup->acked = std::max(backup->acked, log_index);
  entries_.erase(entries_.begin(), entries_.upper_bound(MinAckedLocked()));
  backup->link->Notify();
}

void ShardReplicator::Append(ShardMutation mutation) {
  absl::MutexLock lock(&mu_);
  if (closed_ || backups_.empty() || mutation.index <= MinAckedLocked()) return;
  const int64_t index = mutation.index;
  entries_.emplace(index, std::move(mutation));
  for (const Backup& backup : backups_) {
    if (backup.acked + 1 == index) backup.link->Notify();
  }
}

int64_t ShardReplicator::MinAckedLocked() const {
  int64_t acked = std::numeric_limits<int64_t>::max();
  for (const Backup& backup : backups_) acked = std::min(acked, backup.acked);
  return acked;
}

bool ShardReplicator::ReplicatedLocked(int64_t index) const {
  bool any_holds = false;
  for (const Backup& backup : backups_) {
    if (!backup.holds) continue;
    if (backup.acked < index) return false;
    any_holds = true;
  }
  // Every backup still copying: on this server's word alone, only while it is surely
  // not replaced (ReplicationLinks' lease).
  return any_holds || backups_.empty() || links_->MayAcknowledgeAlone();
}

bool ShardReplicator::HasReadyLocked(const Backup& backup) const {
  return !closed_ && !backup.in_flight && absl::Now() >= backup.retry_at &&
         entries_.count(backup.acked + 1) > 0;
}

bool ShardReplicator::TakeBatch(const std::string& backup_name, ReplicateRequest* request) {
  absl::MutexLock lock(&mu_);
  Backup* backup = FindLocked(backup_name);
  if (backup == nullptr || !HasReadyLocked(*backup)) return false;
  backup->in_flight = true;
  ShardLogBatch* batch = request->add_shards();
  batch->set_shard_id(shard_id_);
  batch->set_primary_name(primary_name_);
  batch->set_epoch(epoch_);
  size_t bytes = 0;
  for (auto it = entries_.find(backup->acked + 1);
       it != entries_.end() && it->first == backup->acked + 1 + batch->entries_size() &&
       batch->entries_size() < kMaxEntriesPerBatch && bytes < kMaxBytesPerBatch;
       ++it) {
    *batch->add_entries() = EntryFromMutation(it->second, shard_id_);
    bytes += it->second.gradient.size() * sizeof(float);
  }
  return true;
}

void ShardReplicator::OnResult(const std::string& backup_name,
                               const ShardReplicationResult& result) {
  absl::MutexLock lock(&mu_);
  Backup* backup = FindLocked(backup_name);
  if (closed_ || backup == nullptr) return;
  backup->in_flight = false;
  if (result.code() == grpc::StatusCode::OK) {
    backup->backoff.Reset();
    backup->took_batch_at_map = true;
    // The backup's own word on where it is: behind what we thought means it lacks
    // entries (resend them, if we still hold them).
    backup->acked = result.received_index();
    if (entries_.count(backup->acked + 1) == 0 && !entries_.empty() &&
        entries_.rbegin()->first > backup->acked && !backup->reported_gap) {
      spdlog::error(
          "shard {}: backup {} is at log index {}, but entries from {} on are no longer held; it "
          "cannot "
          "catch up until the scheduler replaces it",
          shard_id_, backup_name, backup->acked, backup->acked + 1);
      backup->reported_gap = true;
    }
    entries_.erase(entries_.begin(), entries_.upper_bound(MinAckedLocked()));
    return;
  }
  const bool getting_ready = !backup->took_batch_at_map &&
                             absl::Now() < backup->map_changed_at + kMapChangeGrace &&
                             result.code() != grpc::StatusCode::FAILED_PRECONDITION;
  if (getting_ready) {
    // A backup not ready for this map yet (copying the shard, installing the map, not
    // yet knowing this server's credential): soon, without backing off, for
    // kMapChangeGrace.
    backup->retry_at = absl::Now() + kNotReadyRetry;
    backup->link->NotifyAt(backup->retry_at);
    return;
  }
  // Unreachable or refusing: retry after a pause; a new map settles it.
  backup->retry_at = absl::Now() + backup->backoff.NextDelay();
  if (result.code() == grpc::StatusCode::FAILED_PRECONDITION && fenced_.empty()) {
    fenced_ = absl::StrCat("shard ", shard_id_, ": backup ", backup_name,
                           " refused this server as primary: ", result.message(),
                           "; refresh the shard map");
    spdlog::warn("{}", fenced_);
  }
}

void ShardReplicator::OnCallFailed(const std::string& backup_name, const grpc::Status& failure) {
  ShardReplicationResult result;
  result.set_shard_id(shard_id_);
  result.set_code(failure.error_code());
  result.set_message(failure.error_message());
  OnResult(backup_name, result);
}

absl::Status ShardReplicator::WaitReplicated(int64_t index, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto settled = [this, index]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || !fenced_.empty() || ReplicatedLocked(index);
  };
  mu_.AwaitWithDeadline(absl::Condition(&settled), deadline);
  if (closed_)
    return absl::UnavailableError(absl::StrCat("shard ", shard_id_, " is no longer served here"));
  if (!fenced_.empty()) return absl::FailedPreconditionError(fenced_);
  if (ReplicatedLocked(index)) return absl::OkStatus();
  std::vector<std::string> behind;
  for (const Backup& backup : backups_) {
    if (backup.holds && backup.acked < index)
      behind.push_back(absl::StrCat(backup.target.name, " (at ", backup.acked, ")"));
  }
  if (behind.empty()) {
    return absl::UnavailableError(absl::StrCat(
        "shard ", shard_id_, ": log entry ", index,
        " has no backup holding the shard yet (they copy it), and this server has not heard "
        "from the scheduler lately enough to acknowledge it alone"));
  }
  return absl::UnavailableError(absl::StrCat("shard ", shard_id_, ": log entry ", index,
                                             " is not yet received by backup ",
                                             absl::StrJoin(behind, ", ")));
}

absl::Status ShardReplicator::AwaitBackup(const std::string& backup_name, int64_t index,
                                          absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto has_it = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Backup* backup = FindLocked(backup_name);
    return backup != nullptr && backup->holds && backup->acked >= index;
  };
  auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || !fenced_.empty() || FindLocked(backup_name) == nullptr || has_it();
  };
  mu_.AwaitWithDeadline(absl::Condition(&settled), deadline);
  if (has_it()) return absl::OkStatus();
  if (closed_)
    return absl::UnavailableError(absl::StrCat("shard ", shard_id_, " is no longer served here"));
  if (!fenced_.empty()) return absl::FailedPreconditionError(fenced_);
  const Backup* backup = FindLocked(backup_name);
  if (backup == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", shard_id_, ": ", backup_name, " is not one of its backups here"));
  }
  return absl::UnavailableError(
      absl::StrCat("shard ", shard_id_, ": backup ", backup_name, " is at log index ",
                   backup->acked, backup->holds ? "" : " (still copying)", ", not yet at ", index));
}

void ShardReplicator::Close() {
  std::vector<std::shared_ptr<ReplicationLink>> links;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    for (const Backup& backup : backups_) links.push_back(backup.link);
  }
  for (const auto& link : links) link->Detach(this);
}

}  // namespace paramserver
