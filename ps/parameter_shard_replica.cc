// ParameterShard's replication: a backup applying its primary's log, and the whole
// state a new replica starts from.
#include <algorithm>
#include <cmath>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "ps/dense_update_rule.h"
#include "ps/parameter_shard.h"
#include "spdlog/spdlog.h"

namespace paramserver {

namespace {

// What a received entry holds in memory until it is applied.
size_t ReceivedBytes(const ShardMutation& mutation) {
  return mutation.gradient.size() * sizeof(float) + mutation.rows.ids.size() * sizeof(int64_t) +
         mutation.rows.counts.size() * sizeof(int32_t);
}

}  // namespace

absl::StatusOr<int64_t> ParameterShard::ApplyLogEntry(const ShardMutation& mutation) {
  PS_RETURN_IF_ERROR(ApplyReceived());  // nothing waits before it: there is room
  std::vector<ShardMutation> entries{mutation};
  PS_ASSIGN_OR_RETURN(const int64_t received,
                      ReceiveLogEntries(std::move(entries), absl::Now() + absl::Seconds(10)));
  if (received < mutation.index) {
    return absl::UnavailableError(
        absl::StrCat("shard ", options_.shard_id, " has no room for log entry ", mutation.index));
  }
  absl::MutexLock lock(&mu_);
  PS_RETURN_IF_ERROR(ApplyReceivedLocked());
  return log_.index();
}

absl::StatusOr<int64_t> ParameterShard::ReceiveLogEntries(std::vector<ShardMutation> entries,
                                                          absl::Time deadline) {
  absl::MutexLock lock(&received_mu_);
  if (!apply_failure_.ok()) return apply_failure_;
  auto new_entries = entries.begin();
  while (new_entries != entries.end() && new_entries->index <= received_through_) ++new_entries;
  if (new_entries == entries.end()) return received_through_;  // repeats only
  if (!accepting_entries_) {
    // Promoted (its replicator took the log index): an entry applied now would reach no
    // backup. Its old primary is refused, as any replaced primary is.
    return absl::AbortedError(absl::StrCat(
        "shard ", options_.shard_id, " is a primary here now; it takes no replicated entries"));
  }
  if (new_entries->index != received_through_ + 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", options_.shard_id, " replica has received log index ",
                     received_through_, "; entry ", new_entries->index, " leaves a gap"));
  }
  auto has_room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(received_mu_) {
    return received_bytes_ < options_.max_received_bytes || received_bytes_ == 0 ||
           !accepting_entries_ || !apply_failure_.ok();
  };
  if (!received_mu_.AwaitWithDeadline(absl::Condition(&has_room), deadline)) {
    return received_through_;  // full: the primary sends them again
  }
  if (!accepting_entries_) {
    return absl::AbortedError(absl::StrCat("shard ", options_.shard_id,
                                           " became a primary here while its old primary's "
                                           "entries waited; it takes no replicated entries"));
  }
  if (!apply_failure_.ok()) return apply_failure_;
  for (; new_entries != entries.end(); ++new_entries) {
    // An overlapping call for this shard may have taken some while this one waited.
    if (new_entries->index <= received_through_) continue;
    if (new_entries->index != received_through_ + 1) break;  // not consecutive: the rest later
    received_bytes_ += ReceivedBytes(*new_entries);
    received_through_ = new_entries->index;
    received_.push_back(ReceivedEntry{std::move(*new_entries), absl::Now()});
  }
  return received_through_;
}

absl::Status ParameterShard::ApplyReceived(absl::Time received_before) {
  absl::MutexLock lock(&mu_);
  return ApplyReceivedLocked(received_before);
}

absl::Status ParameterShard::ApplyReceivedLocked(absl::Time received_before) {
  // One pass over what is held now, not until nothing is left: a primary sending steadily
  // would otherwise keep mu_ held here indefinitely, and with it the heartbeat's counters,
  // the metrics and map installs. Entries received meanwhile are scheduled again by the
  // Replicate call that brought them (ReplicaApplier::Schedule).
  std::vector<ShardMutation> taken;
  {
    absl::MutexLock received_lock(&received_mu_);
    if (!apply_failure_.ok()) return apply_failure_;
    while (!received_.empty() && received_.front().at < received_before) {
      taken.push_back(std::move(received_.front().mutation));
      received_.pop_front();
    }
    if (taken.empty()) return absl::OkStatus();
  }
  size_t applied_bytes = 0;
  absl::Status failure;
  replaying_ = true;  // a backup's steps start no checkpoint chain (CheckpointSnapshotLocked)
  for (const ShardMutation& mutation : taken) {
    applied_bytes += ReceivedBytes(mutation);
    absl::StatusOr<int64_t> applied = ApplyLogEntryLocked(mutation);
    if (!applied.ok()) {
      failure = applied.status();
      break;
    }
  }
  replaying_ = false;
  absl::MutexLock received_lock(&received_mu_);
  received_bytes_ -= std::min(received_bytes_, applied_bytes);
  applied_through_ = log_.index();
  if (!failure.ok()) {
    // Nothing after a failed entry can apply: the replica is no copy of its primary.
    apply_failure_ = failure;
    received_.clear();
    received_bytes_ = 0;
    closed_ = true;
    closed_reason_ =
        absl::StrCat("its replica failed to apply its primary's log: ", failure.ToString());
    return failure;
  }
  return absl::OkStatus();
}

int64_t ParameterShard::received_index() const {
  absl::MutexLock lock(&received_mu_);
  return received_through_;
}

bool ParameterShard::has_unapplied() const {
  absl::MutexLock lock(&received_mu_);
  return received_through_ > applied_through_;
}

absl::StatusOr<int64_t> ParameterShard::ApplyLogEntryLocked(const ShardMutation& mutation) {
  if (mutation.index <= log_.index()) return log_.index();
  if (mutation.index != log_.index() + 1) {
    return absl::FailedPreconditionError(absl::StrCat("shard ", options_.shard_id,
                                                      " replica is at log index ", log_.index(),
                                                      "; entry ", mutation.index, " leaves a gap"));
  }
  const auto diverged = [&](const std::string& why) {
    return absl::InternalError(absl::StrCat("shard ", options_.shard_id,
                                            " replica diverged from its primary: log entry ",
                                            mutation.index, " ", why));
  };
  // The entry's rows, checked once here (a backup trusts its primary no more than a
  // worker).
  CheckedRowIds rows;
  if (embedding_ != nullptr && !mutation.skipped &&
      (mutation.kind == ShardMutation::Kind::kPush ||
       mutation.kind == ShardMutation::Kind::kSyncStep)) {
    absl::StatusOr<CheckedRowIds> checked =
        CheckedRowIds::Check(mutation.rows, embedding_->shape());
    if (!checked.ok()) return diverged(absl::StrCat("names rows: ", checked.status().message()));
    rows = *std::move(checked);
  }
  switch (mutation.kind) {
    case ShardMutation::Kind::kActiveWorkers:
      if (static_cast<int>(mutation.active.size()) != options_.num_workers) {
        return absl::InvalidArgumentError(absl::StrCat(
            "shard ", options_.shard_id, " log entry ", mutation.index, ": active set of ",
            mutation.active.size(), " workers, not ", options_.num_workers));
      }
      PS_RETURN_IF_ERROR(SetActiveWorkersLocked(mutation.active, nullptr));
      return log_.index();
    case ShardMutation::Kind::kSyncStep: {
      if (options_.mode != TrainingMode::kSync || mutation.step != applied_updates_ ||
          (mutation.skipped ? !mutation.gradient.empty()
                            : !storage_->CheckGradientShape(rows, mutation.gradient).ok())) {
        return absl::InternalError(absl::StrCat("shard ", options_.shard_id, " replica (at step ",
                                                applied_updates_,
                                                ") diverged from its primary: log entry ",
                                                mutation.index, " applies step ", mutation.step));
      }
      if (mutation.skipped) {
        SkipSyncStepLocked(nullptr);
        gate_.AssumePushedBefore(applied_updates_);
        log_.CountReplayed();
        return log_.index();
      }
      if (absl::Status prepared = storage_->PrepareFor(mutation.settings); !prepared.ok()) {
        return diverged(absl::StrCat("carries settings refused here: ", prepared.message()));
      }
      PushOutcome ignored;  // checkpoints are the primary's to write
      absl::Status applied =
          ApplyUpdate(rows.view(), mutation.settings, mutation.gradient, &ignored);
      gate_.EndStep();
      gate_.AssumePushedBefore(applied_updates_);
      EndSyncStepLocked();
      if (mutation.clip_coefficient > 0) {
        RememberStepLocked(
            ClippedStep{mutation.step, mutation.step_sum_squares, mutation.clip_coefficient});
      }
      log_.CountReplayed();
      if (!applied.ok()) return diverged(applied.ToString());
      return log_.index();
    }
    case ShardMutation::Kind::kInitialValues:
      if (dense_ == nullptr || !awaiting_initial_values_ ||
          mutation.gradient.size() != dense_->values().size()) {
        return diverged(
            absl::StrCat("sets initial values on a shard that ",
                         awaiting_initial_values_ ? "holds another number of them" : "has values"));
      }
      dense_->SetValues(mutation.gradient);
      awaiting_initial_values_ = false;
      log_.CountReplayed();
      return log_.index();
    case ShardMutation::Kind::kPush: {
      if (options_.mode == TrainingMode::kSync) {
        return absl::InternalError(absl::StrCat("shard ", options_.shard_id,
                                                " (sync) got a push as log entry ", mutation.index,
                                                "; sync primaries log completed steps"));
      }
      ShardPush push{mutation.worker_rank,
                     mutation.step,
                     UninitializedFloats(mutation.gradient.begin(), mutation.gradient.end()),
                     std::move(rows),
                     mutation.settings,
                     mutation.skipped};
      PushOutcome outcome;
      absl::Status pushed = PushLocked(&push, &outcome, /*record=*/false);
      if (!pushed.ok() || outcome.duplicate) {
        return diverged(absl::StrCat(
            "(push of worker ", mutation.worker_rank, " for step ", mutation.step, ") was ",
            pushed.ok() ? std::string("a duplicate here") : pushed.ToString()));
      }
      return log_.index();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("log entry ", mutation.index, " of an unknown kind"));
}

ReplicaState ParameterShard::ExportReplica() const {
  ReplicaState replica = ExportReplicaAsStored();
  // After the lock: pushes wait only for the copy, not for the LRU walk and the gather.
  for (EmbeddingShardState& table : replica.shard.tables) {
    // The table's own links lead through every row once; a failure is a bug, said loudly.
    if (absl::Status ordered = OrderRowsByRecency(&table); !ordered.ok()) {
      spdlog::error("shard {}: {}", options_.shard_id, std::string(ordered.message()));
    }
  }
  return replica;
}

ReplicaState ParameterShard::ExportReplicaAsStored() const {
  absl::MutexLock lock(&mu_);
  ReplicaState replica;
  replica.shard = SnapshotLocked(RowOrder::kAsStoredWithRecency);
  replica.log_index = log_.index();
  replica.awaiting_initial_values = awaiting_initial_values_;
  replica.active = gate_.active();
  replica.pushed_steps = gate_.pushed_steps();
  replica.pending_received = gate_.received();
  replica.pending_gradients.resize(options_.num_workers);
  replica.pending_rows.resize(options_.num_workers);
  for (int r = 0; r < options_.num_workers && r < static_cast<int>(pending_.size()); ++r) {
    if (!gate_.received(r)) continue;
    replica.pending_gradients[r].assign(pending_[r].gradient.begin(), pending_[r].gradient.end());
    replica.pending_rows[r] = pending_[r].rows.rows();
  }
  replica.pending_settings = step_settings_;
  replica.pending_clip_grad_norm = step_clip_;
  replica.recent_steps.assign(recent_steps_.begin(), recent_steps_.end());
  replica.held = held_;
  if (held_) {
    replica.held_mean = held_mean_;
    replica.held_sum_squares = held_sum_squares_;
  }
  replica.pending_skipped.assign(options_.num_workers, false);
  for (int r = 0; r < options_.num_workers && r < static_cast<int>(pending_.size()); ++r) {
    replica.pending_skipped[r] = gate_.received(r) && pending_[r].skip;
  }
  if (embedding_ != nullptr) replica.sightings = embedding_->Sightings();
  return replica;
}

absl::StatusOr<std::unique_ptr<ParameterShard>> ParameterShard::FromReplica(
    ParameterShardOptions options, ReplicaState replica) {
  const size_t size = options.range.size();
  const size_t workers = options.num_workers;
  if (!(replica.shard.range == options.range) || replica.shard.values.size() != size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the replica of shard ", options.shard_id, " covers [", replica.shard.range.begin, ", ",
        replica.shard.range.end, ") with ", replica.shard.values.size(), " values; expected [",
        options.range.begin, ", ", options.range.end, ")"));
  }
  if (replica.active.size() != workers || replica.pushed_steps.size() != workers ||
      replica.pending_received.size() != workers || replica.pending_gradients.size() != workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("the replica of shard ", options.shard_id, " has per-worker state for ",
                     replica.active.size(), " workers; this cluster has ", workers));
  }
  const bool sync = options.mode == TrainingMode::kSync;
  for (int64_t next : replica.pushed_steps) {
    // sync: the step after a worker's last push taken, at most the one being collected's.
    if (next < 0 || (sync && next > replica.shard.step + 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the replica of shard ", options.shard_id, " says a worker's next step is ", next,
          (sync ? absl::StrCat(" at step ", replica.shard.step) : std::string())));
    }
  }
  const bool embedding = options.embedding != nullptr;
  if (!embedding) {
    replica.shard.shard_id = options.shard_id;
    PS_RETURN_IF_ERROR(CheckResumableState(options.optimizer, replica.shard));
  }
  if (embedding && (replica.pending_rows.size() != workers ||
                    replica.sightings.size() != options.embedding->tables.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the replica of embedding shard ", options.shard_id, " has pending rows for ",
        replica.pending_rows.size(), " workers and sightings for ", replica.sightings.size(),
        " tables; expected ", workers, " and ", options.embedding->tables.size()));
  }
  // The tables are restored in the order given (least recently updated first), which
  // rebuilds the primary's recency order.
  if (embedding) {
    PS_RETURN_IF_ERROR(EmbeddingStorage::CheckTablesFit(options.shard_id, *options.embedding,
                                                        replica.shard.tables));
  } else if (!replica.shard.tables.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", options.shard_id, " holds dense parameters, not table rows"));
  }
  auto shard = std::make_unique<ParameterShard>(std::move(options), std::move(replica.shard));
  absl::MutexLock lock(&shard->mu_);
  const int shard_id = shard->options_.shard_id;
  for (size_t r = 0; sync && r < workers; ++r) {
    if (!replica.pending_received[r]) continue;
    ShardPush& pending = shard->pending_[r];
    if (r < replica.pending_skipped.size() && replica.pending_skipped[r]) {
      if (!replica.pending_gradients[r].empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("the replica of shard ", shard->options_.shard_id, " has worker ", r,
                         "'s push skipping the step with a gradient"));
      }
      pending.skip = true;
      continue;
    }
    absl::Status fits;
    if (embedding) {
      absl::StatusOr<CheckedRowIds> rows =
          CheckedRowIds::Check(std::move(replica.pending_rows[r]), shard->embedding_->shape());
      fits = rows.status();
      if (rows.ok()) pending.rows = *std::move(rows);
    }
    if (fits.ok())
      fits = shard->storage_->CheckGradientShape(pending.rows, replica.pending_gradients[r]);
    if (!fits.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("the replica of shard ", shard_id,
                                                     " has a pending gradient of worker ", r,
                                                     " that does not fit: ", fits.message()));
    }
    pending.gradient.assign(replica.pending_gradients[r].begin(),
                            replica.pending_gradients[r].end());
    if (shard->step_settings_rank_ < 0) {
      if (absl::Status prepared = shard->storage_->PrepareFor(replica.pending_settings);
          !prepared.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("the replica of shard ", shard_id,
                         " has pending settings refused here: ", prepared.message()));
      }
      shard->step_settings_ = replica.pending_settings;
      shard->step_settings_rank_ = static_cast<int>(r);
    }
  }
  shard->recent_steps_.assign(replica.recent_steps.begin(), replica.recent_steps.end());
  const bool clips = replica.pending_clip_grad_norm > 0 || replica.held;
  if (clips && (!sync || embedding ||
                (replica.held &&
                 (replica.held_mean.size() != size || !std::isfinite(replica.held_sum_squares) ||
                  replica.held_sum_squares < 0)))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the replica of shard ", shard_id,
        " holds a clipped step that does not fit it (only a sync job's dense shards clip)"));
  }
  // The pending pushes' clip_grad_norm, first sent by the first non-skipping one.
  for (size_t r = 0; sync && r < workers && shard->step_clip_rank_ < 0; ++r) {
    if (!replica.pending_received[r] || shard->pending_[r].skip) continue;
    shard->step_clip_ = replica.pending_clip_grad_norm;
    shard->step_clip_rank_ = static_cast<int>(r);
  }
  if (replica.held) {  // as its primary told the workers
    shard->held_ = true;
    shard->held_mean_ = std::move(replica.held_mean);
    shard->held_sum_squares_ = replica.held_sum_squares;
  }
  if (embedding) shard->embedding_->RestoreSightings(replica.sightings);
  shard->log_.ContinueFrom(replica.log_index);
  {
    absl::MutexLock received_lock(&shard->received_mu_);
    shard->received_through_ = replica.log_index;
    shard->applied_through_ = replica.log_index;
  }
  shard->awaiting_initial_values_ = replica.awaiting_initial_values;
  shard->gate_.Restore(std::move(replica.active), std::move(replica.pushed_steps),
                       std::move(replica.pending_received));
  return shard;
}

}  // namespace paramserver
