#include "ps/shard_replicator.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/rpc_endpoints.h"
#include "common/tensor_codec.h"
#include "spdlog/spdlog.h"

namespace paramserver {
namespace {

// One Replicate request carries at most this many entries / bytes.
constexpr int kMaxEntriesPerRequest = 64;
constexpr size_t kMaxBytesPerRequest = 64 << 20;

}  // namespace

ShardReplicator::ShardReplicator(int shard_id, std::string primary_name, absl::Duration rpc_timeout)
    : shard_id_(shard_id), primary_name_(std::move(primary_name)), rpc_timeout_(rpc_timeout) {}

ShardReplicator::~ShardReplicator() { Close(); }

void ShardReplicator::SetBackups(int64_t epoch, const std::vector<BackupTarget>& backups, int64_t log_index) {
  absl::MutexLock lock(&mu_);
  if (closed_) return;
  epoch_ = std::max(epoch_, epoch);
  fenced_.clear();  // a new map: whoever refused us may accept us now, or we are dropped
  std::vector<std::unique_ptr<Backup>> kept;
  for (std::unique_ptr<Backup>& backup : backups_) {
    const bool still = std::any_of(backups.begin(), backups.end(), [&](const BackupTarget& target) {
      return target.name == backup->target.name && target.address == backup->target.address;
    });
    if (still) {
      kept.push_back(std::move(backup));
    } else {
      backup->removed = true;
      retired_.push_back(std::move(backup));
    }
  }
  backups_ = std::move(kept);
  for (const BackupTarget& target : backups) {
    const bool known = std::any_of(backups_.begin(), backups_.end(),
                                   [&](const std::unique_ptr<Backup>& b) { return b->target.name == target.name; });
    if (known) continue;
    auto backup = std::make_unique<Backup>();
    backup->target = target;
    backup->stub = ParameterServer::NewStub(CreateChannel(target.address));
    backup->acked = log_index;
    Backup* raw = backup.get();
    backups_.push_back(std::move(backup));
    raw->sender = std::thread([this, raw] { SendLoop(raw); });
  }
  TrimLocked();
}

void ShardReplicator::Append(ShardMutation mutation) {
  absl::MutexLock lock(&mu_);
  if (closed_ || backups_.empty() || mutation.index <= MinAckedLocked()) return;
  const int64_t index = mutation.index;
  entries_.emplace(index, std::move(mutation));
}

int64_t ShardReplicator::MinAckedLocked() const {
  int64_t acked = std::numeric_limits<int64_t>::max();
  for (const std::unique_ptr<Backup>& backup : backups_) acked = std::min(acked, backup->acked);
  return acked;
}

void ShardReplicator::TrimLocked() {
  const int64_t acked = MinAckedLocked();
  entries_.erase(entries_.begin(), entries_.upper_bound(acked));
}

absl::Status ShardReplicator::WaitReplicated(int64_t index, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto settled = [this, index]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || !fenced_.empty() || MinAckedLocked() >= index;
  };
  mu_.AwaitWithDeadline(absl::Condition(&settled), deadline);
  if (closed_) return absl::UnavailableError(absl::StrCat("shard ", shard_id_, " is no longer served here"));
  if (!fenced_.empty()) return absl::FailedPreconditionError(fenced_);
  if (MinAckedLocked() >= index) return absl::OkStatus();
  std::vector<std::string> behind;
  for (const std::unique_ptr<Backup>& backup : backups_) {
    if (backup->acked < index) behind.push_back(absl::StrCat(backup->target.name, " (at ", backup->acked, ")"));
  }
  return absl::UnavailableError(absl::StrCat("shard ", shard_id_, ": log entry ", index,
                                             " is not yet applied by backup ", absl::StrJoin(behind, ", ")));
}

void ShardReplicator::SendLoop(Backup* backup) {
  absl::Duration backoff = absl::Milliseconds(10);
  bool reported_gap = false;
  while (true) {
    ReplicateRequest request;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this, backup]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return closed_ || backup->removed || entries_.count(backup->acked + 1) > 0;
      };
      if (!mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(200))) continue;
      if (closed_ || backup->removed) return;
      request.set_shard_id(shard_id_);
      request.set_primary_name(primary_name_);
      request.set_epoch(epoch_);
      size_t bytes = 0;
      for (auto it = entries_.find(backup->acked + 1);
           it != entries_.end() && it->first == backup->acked + 1 + request.entries_size() &&
           request.entries_size() < kMaxEntriesPerRequest && bytes < kMaxBytesPerRequest;
           ++it) {
        *request.add_entries() = EntryFromMutation(it->second, shard_id_);
        bytes += it->second.gradient.size() * sizeof(float);
      }
    }
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + rpc_timeout_));
    ReplicateResponse response;
    const grpc::Status status = backup->stub->Replicate(&context, request, &response);
    absl::MutexLock lock(&mu_);
    if (status.ok()) {
      backoff = absl::Milliseconds(10);
      const int64_t first = request.entries(0).index();
      if (response.applied_index() < first - 1) {
        // The backup lacks entries before these: resend from where it is, if we still can.
        if (entries_.count(response.applied_index() + 1) == 0 && !reported_gap) {
          spdlog::error("shard {}: backup {} is at log index {}, but entries from {} on are no longer held; "
                        "it cannot catch up until the scheduler replaces it",
                        shard_id_, backup->target.name, response.applied_index(), response.applied_index() + 1);
          reported_gap = true;
        }
        backup->acked = response.applied_index();
      } else {
        backup->acked = std::max(backup->acked, response.applied_index());
        if (!backup->removed) TrimLocked();
      }
      continue;
    }
    if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION && fenced_.empty() && !backup->removed) {
      fenced_ = absl::StrCat("shard ", shard_id_, ": backup ", backup->target.name,
                             " refused this server as primary: ", status.error_message(), "; refresh the shard map");
      spdlog::warn("{}", fenced_);
    }
    // Unreachable, behind us on the map, or refusing: retry; a new map settles it.
    mu_.AwaitWithTimeout(absl::Condition(&closed_), backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(500));
  }
}

void ShardReplicator::Close() {
  std::vector<Backup*> senders;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    for (const std::unique_ptr<Backup>& backup : backups_) senders.push_back(backup.get());
    for (const std::unique_ptr<Backup>& backup : retired_) senders.push_back(backup.get());
  }
  for (Backup* backup : senders) {
    if (backup->sender.joinable()) backup->sender.join();
  }
}

absl::StatusOr<ShardMutation> MutationFromEntry(const ShardLogEntry& entry, int64_t shard_size) {
  ShardMutation mutation;
  mutation.index = entry.index();
  if (entry.has_push()) {
    mutation.kind = ShardMutation::Kind::kPush;
    mutation.worker_rank = entry.push().worker_rank();
    mutation.step = entry.push().step();
    mutation.gradient.resize(shard_size);
    absl::Status decoded =
        DecodeFloatsExactly(entry.push().gradient(), absl::MakeSpan(mutation.gradient),
                            absl::StrCat("log entry ", entry.index(), " gradient"));
    if (!decoded.ok()) return decoded;
    return mutation;
  }
  if (entry.has_sync_step()) {
    mutation.kind = ShardMutation::Kind::kSyncStep;
    mutation.step = entry.sync_step().step();
    mutation.gradient.resize(shard_size);
    absl::Status decoded =
        DecodeFloatsExactly(entry.sync_step().mean_gradient(), absl::MakeSpan(mutation.gradient),
                            absl::StrCat("log entry ", entry.index(), " mean gradient"));
    if (!decoded.ok()) return decoded;
    return mutation;
  }
  if (entry.has_active_workers()) {
    mutation.kind = ShardMutation::Kind::kActiveWorkers;
    mutation.active.assign(entry.active_workers().active().begin(), entry.active_workers().active().end());
    return mutation;
  }
  return absl::InvalidArgumentError(absl::StrCat("log entry ", entry.index(), " has no mutation"));
}

ShardLogEntry EntryFromMutation(const ShardMutation& mutation, int shard_id) {
  ShardLogEntry entry;
  entry.set_index(mutation.index);
  switch (mutation.kind) {
    case ShardMutation::Kind::kPush: {
      PushRequest* push = entry.mutable_push();
      push->set_shard_id(shard_id);
      push->set_worker_rank(mutation.worker_rank);
      push->set_step(mutation.step);
      AppendFloatsLittleEndian(mutation.gradient, push->mutable_gradient());
      break;
    }
    case ShardMutation::Kind::kSyncStep:
      entry.mutable_sync_step()->set_step(mutation.step);
      AppendFloatsLittleEndian(mutation.gradient, entry.mutable_sync_step()->mutable_mean_gradient());
      break;
    case ShardMutation::Kind::kActiveWorkers:
      for (bool a : mutation.active) entry.mutable_active_workers()->add_active(a);
      break;
  }
  return entry;
}

ShardReplicaState ReplicaStateToProto(const ReplicaState& replica) {
  ShardReplicaState proto;
  proto.set_shard_id(replica.shard.shard_id);
  proto.set_begin(replica.shard.range.begin);
  proto.set_end(replica.shard.range.end);
  proto.set_applied_updates(replica.shard.step);
  proto.set_log_index(replica.log_index);
  AppendFloatsLittleEndian(replica.shard.values, proto.mutable_values());
  AppendFloatsLittleEndian(replica.shard.first_moment, proto.mutable_first_moment());
  AppendFloatsLittleEndian(replica.shard.second_moment, proto.mutable_second_moment());
  for (bool a : replica.active) proto.add_active_workers(a);
  for (int64_t s : replica.pushed_steps) proto.add_pushed_steps(s);
  for (bool p : replica.pending_received) proto.add_pending_received(p);
  for (const std::vector<float>& gradient : replica.pending_gradients) {
    AppendFloatsLittleEndian(gradient, proto.add_pending_gradients());
  }
  return proto;
}

absl::StatusOr<ReplicaState> ReplicaStateFromProto(const ShardReplicaState& proto) {
  ReplicaState replica;
  replica.shard.shard_id = proto.shard_id();
  replica.shard.range = {proto.begin(), proto.end()};
  replica.shard.step = proto.applied_updates();
  replica.log_index = proto.log_index();
  const int64_t size = replica.shard.range.size();
  if (size <= 0) return absl::InvalidArgumentError(absl::StrCat("replica of an empty range of shard ", proto.shard_id()));
  for (auto [bytes, out, what] : {std::make_tuple(&proto.values(), &replica.shard.values, "values"),
                                  std::make_tuple(&proto.first_moment(), &replica.shard.first_moment, "first moments"),
                                  std::make_tuple(&proto.second_moment(), &replica.shard.second_moment,
                                                  "second moments")}) {
    out->resize(size);
    absl::Status decoded = DecodeFloatsExactly(*bytes, absl::MakeSpan(*out),
                                               absl::StrCat("replica of shard ", proto.shard_id(), " ", what));
    if (!decoded.ok()) return decoded;
  }
  replica.active.assign(proto.active_workers().begin(), proto.active_workers().end());
  replica.pushed_steps.assign(proto.pushed_steps().begin(), proto.pushed_steps().end());
  replica.pending_received.assign(proto.pending_received().begin(), proto.pending_received().end());
  for (const std::string& bytes : proto.pending_gradients()) {
    if (bytes.size() % sizeof(float) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("replica of shard ", proto.shard_id(),
                                                     ": a pending gradient of ", bytes.size(), " bytes"));
    }
    std::vector<float>& gradient = replica.pending_gradients.emplace_back(bytes.size() / sizeof(float));
    DecodeFloatsLittleEndian(bytes, gradient.data());
  }
  return replica;
}

}  // namespace paramserver
