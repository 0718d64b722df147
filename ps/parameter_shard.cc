#include "ps/parameter_shard.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "ps/dense_update_rule.h"
#include "spdlog/spdlog.h"

namespace paramserver {

ParameterShard::ParameterShard(ParameterShardOptions options, std::vector<float> values,
                               ShardState* resumed)
    : options_(std::move(options)),
      gate_(options_.shard_id, options_.mode, options_.num_workers, options_.staleness,
            resumed != nullptr ? resumed->step : 0, options_.backup_workers),
      log_(options_.hand_back_log),
      applied_updates_(resumed != nullptr ? resumed->step : 0),
      skipped_steps_(resumed != nullptr ? resumed->skipped_steps : 0),
      pending_(options_.mode == TrainingMode::kSync ? options_.num_workers : 0) {
  absl::MutexLock lock(&mu_);
  if (options_.embedding != nullptr) {
    embedding_ = std::make_unique<EmbeddingStorage>(options_.shard_id, options_.embedding);
    storage_ = embedding_.get();
  } else {
    std::unique_ptr<DenseUpdateRule> rule;
    if (resumed != nullptr) {
      // Its callers checked it (CheckResumableState); a state that fails it starts the
      // optimizer afresh rather than read past its slots.
      if (absl::Status usable = CheckResumableState(options_.optimizer, *resumed); usable.ok()) {
        rule = ResumeDenseUpdateRule(options_.optimizer, resumed, options_.optimizer_segments);
      } else {
        spdlog::error("{}", std::string(usable.message()));
      }
    }
    if (rule == nullptr) {
      rule = MakeDenseUpdateRule(options_.optimizer, options_.range.size(),
                                 options_.optimizer_segments);
    }
    dense_ = std::make_unique<DenseStorage>(options_.shard_id, options_.range, std::move(values),
                                            std::move(rule));
    storage_ = dense_.get();
  }
  counters_.applied_updates = applied_updates_;
  counters_.skipped_steps = skipped_steps_;
}

ParameterShard::ParameterShard(ParameterShardOptions options, std::vector<float> initial_values)
    : ParameterShard(std::move(options), std::move(initial_values), nullptr) {}

ParameterShard::ParameterShard(ParameterShardOptions options, ShardState state)
    : ParameterShard(std::move(options), std::move(state.values), &state) {
  absl::MutexLock lock(&mu_);
  if (embedding_ == nullptr) {
    if (!state.tables.empty())
      spdlog::error("shard {} holds dense parameters, not table rows", options_.shard_id);
    return;
  }
  if (absl::Status restored = embedding_->Restore(state.tables); !restored.ok()) {
    spdlog::error("shard {}: {}", options_.shard_id, restored.ToString());
  }
}

std::unique_ptr<ParameterShard> ParameterShard::AwaitingInitialValues(
    ParameterShardOptions options) {
  const size_t size = options.range.size();
  auto shard = std::make_unique<ParameterShard>(std::move(options), std::vector<float>(size));
  absl::MutexLock lock(&shard->mu_);
  shard->awaiting_initial_values_ = true;
  return shard;
}

absl::Status ParameterShard::ClosedError() const {
  return absl::UnavailableError(
      absl::StrCat("shard ", options_.shard_id, " is closed: ", closed_reason_));
}

absl::StatusOr<PushOutcome> ParameterShard::SetInitialValues(absl::Span<const float> values) {
  absl::MutexLock lock(&mu_);
  if (closed_) return ClosedError();
  if (static_cast<int64_t>(values.size()) != options_.range.size() || dense_ == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("initial values for shard ", options_.shard_id, ": ", values.size(),
                     " values, but it holds ", options_.range.size(), " parameters [",
                     options_.range.begin, ", ", options_.range.end, ")"));
  }
  if (const size_t i = FirstNonFinite(values); i < values.size()) {
    return absl::InvalidArgumentError(absl::StrCat("initial values for shard ", options_.shard_id,
                                                   ": parameter ", options_.range.begin + i, " is ",
                                                   values[i], " (NaN or Inf)"));
  }
  PushOutcome outcome;
  if (!awaiting_initial_values_) {
    outcome.duplicate = true;
    outcome.log_index = log_.index();
    return outcome;
  }
  dense_->SetValues(values);
  awaiting_initial_values_ = false;
  ShardMutation mutation;
  mutation.kind = ShardMutation::Kind::kInitialValues;
  if (log_.KeepsEntries()) mutation.gradient.assign(values.begin(), values.end());
  RecordLocked(std::move(mutation), &outcome);
  outcome.log_index = log_.index();
  outcome.checkpoint = SnapshotLocked(RowOrder::kAsStored);
  return outcome;
}

int64_t ParameterShard::waiting_pulls() const {
  absl::MutexLock lock(&mu_);
  return waiting_pulls_;
}

bool ParameterShard::awaiting_initial_values() const {
  absl::MutexLock lock(&mu_);
  return awaiting_initial_values_;
}

bool ParameterShard::PullMayProceed(int64_t step) const {
  if (closed_) return true;
  if (awaiting_initial_values_) return false;
  if (step_conflict_.has_value() && step > applied_updates_) return true;
  return gate_.PullMayProceed(step, applied_updates_);
}

std::string ParameterShard::DescribeWait(int64_t step) const {
  if (awaiting_initial_values_) {
    return absl::StrCat("shard ", options_.shard_id,
                        " has no values yet: it waits for the worker that declared the model to "
                        "set them (job.register)");
  }
  return gate_.DescribeWait(step, applied_updates_);
}

absl::StatusOr<PulledValues> ParameterShard::Pull(int worker_rank, int64_t step,
                                                  absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  PS_ASSIGN_OR_RETURN(int64_t start_step, AwaitPullLocked(worker_rank, step, deadline));
  // An embedding shard's values are its rows, which a pull names (PullRowsInto): none here.
  std::vector<float> values = dense_ != nullptr ? dense_->values() : std::vector<float>();
  return PulledValues{std::move(values), applied_updates_, start_step};
}

absl::Status ParameterShard::PullInto(int worker_rank, int64_t step, absl::Time deadline,
                                      WireDtype encoding, std::string* values_bytes,
                                      PulledValues* info) {
  absl::MutexLock lock(&mu_);
  PS_ASSIGN_OR_RETURN(int64_t start_step, AwaitPullLocked(worker_rank, step, deadline));
  if (dense_ != nullptr) dense_->AppendValues({}, encoding, values_bytes);
  if (info != nullptr) *info = PulledValues{{}, applied_updates_, start_step};
  return absl::OkStatus();
}

absl::Status ParameterShard::PullShared(int worker_rank, int64_t step, absl::Time deadline,
                                        std::shared_ptr<const std::vector<float>>* values,
                                        PulledValues* info) {
  absl::MutexLock lock(&mu_);
  PS_ASSIGN_OR_RETURN(int64_t start_step, AwaitPullLocked(worker_rank, step, deadline));
  *values = dense_ != nullptr ? dense_->Share() : std::make_shared<const std::vector<float>>();
  if (info != nullptr) *info = PulledValues{{}, applied_updates_, start_step};
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ParameterShard::AwaitPullLocked(int worker_rank, int64_t step,
                                                        absl::Time deadline) {
  PS_RETURN_IF_ERROR(gate_.CheckWorker(worker_rank));
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("pull for negative step ", step));
  auto may_proceed = [this, step]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return PullMayProceed(step); };
  ++waiting_pulls_;
  const bool proceeded = mu_.AwaitWithDeadline(absl::Condition(&may_proceed), deadline);
  --waiting_pulls_;
  if (!proceeded) return absl::DeadlineExceededError(DescribeWait(step));
  if (closed_) return ClosedError();
  if (step_conflict_.has_value() && step > applied_updates_) return *step_conflict_;
  return gate_.StartStep(worker_rank, applied_updates_);
}

absl::StatusOr<PushOutcome> ParameterShard::Push(ShardPush* push) {
  absl::MutexLock lock(&mu_);
  PushOutcome outcome;
  PS_RETURN_IF_ERROR(PushLocked(push, &outcome, /*record=*/true));
  return outcome;
}

absl::StatusOr<PushOutcome> ParameterShard::Push(int worker_rank, int64_t step,
                                                 absl::Span<const float> gradient) {
  ShardPush push{worker_rank, step, UninitializedFloats(gradient.begin(), gradient.end()), {}};
  return Push(&push);
}

absl::StatusOr<CheckedRowIds> ParameterShard::CheckRows(RowIdsView rows) const {
  if (options_.embedding == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard ", options_.shard_id, " holds dense parameters; ids name embedding rows"));
  }
  absl::StatusOr<CheckedRowIds> checked = CheckedRowIds::Check(
      RowIds{{rows.counts.begin(), rows.counts.end()}, {rows.ids.begin(), rows.ids.end()}},
      options_.embedding->shape);
  if (checked.ok()) return checked;
  return absl::InvalidArgumentError(
      absl::StrCat("embedding shard ", options_.shard_id, ": ", checked.status().message()));
}

absl::StatusOr<PushOutcome> ParameterShard::PushRows(int worker_rank, int64_t step, RowIdsView rows,
                                                     absl::Span<const float> gradient) {
  ShardPush push{worker_rank, step, UninitializedFloats(gradient.begin(), gradient.end()), {}};
  if (options_.embedding != nullptr || !rows.ids.empty()) {
    absl::StatusOr<CheckedRowIds> checked = CheckRows(rows);
    if (!checked.ok()) {
      absl::MutexLock lock(&mu_);
      // What a push is refused for before its rows are looked at comes first.
      PS_RETURN_IF_ERROR(CheckPushMayProceedLocked(worker_rank, step, /*from_primary_log=*/false));
      ++counters_.rejected_pushes;
      return checked.status();
    }
    push.rows = *std::move(checked);
  }
  return Push(&push);
}

absl::Status ParameterShard::PushLocked(ShardPush* push, PushOutcome* outcome, bool record) {
  const int rank = push->worker_rank;
  const int64_t step = push->step;
  const absl::Span<const float> gradient(push->gradient.data(), push->gradient.size());
  const RowIdsView rows = push->rows.view();
  // An entry of the primary's log (not `record`) applies on a closed backup too: a
  // primary that handed its shard over follows its successor's log (Close).
  PS_RETURN_IF_ERROR(CheckPushMayProceedLocked(rank, step, /*from_primary_log=*/!record));
  if (push->skip) {
    if (!gradient.empty() || !rows.ids.empty()) {
      ++counters_.rejected_pushes;
      return absl::InvalidArgumentError(
          absl::StrCat("shard ", options_.shard_id, ": worker ", rank, "'s push for step ", step,
                       " skips the step but carries ", gradient.size(), " gradient values"));
    }
  } else if (absl::Status shape = storage_->CheckGradientShape(push->rows, gradient); !shape.ok()) {
    ++counters_.rejected_pushes;
    return shape;
  } else {
    PS_RETURN_IF_ERROR(CheckGradientValuesLocked(rank, step, rows, gradient, {},
                                                 /*against_state=*/false));
  }
  if (options_.backup_workers > 0 && push->clip_grad_norm != 0) {
    // Refused whether the push is new, late or a repeat: no clipped step is held here.
    PS_RETURN_IF_ERROR(AdmitClipLocked(*push));
  }
  outcome->applied_updates = applied_updates_;
  outcome->log_index = log_.index();
  absl::StatusOr<ConsistencyGate::Verdict> verdict = gate_.Judge(rank, step, applied_updates_);
  if (!verdict.ok()) {
    ++counters_.rejected_pushes;
    return verdict.status();
  }
  if (*verdict == ConsistencyGate::Verdict::kRepeat) {
    ++counters_.duplicate_pushes;
    outcome->duplicate = true;
    return absl::OkStatus();
  }
  if (*verdict == ConsistencyGate::Verdict::kLate) {
    ++counters_.late_pushes;
    outcome->late = true;
    return absl::OkStatus();
  }
  if (!push->skip) {
    PS_RETURN_IF_ERROR(AdmitSettingsLocked(*push));
    PS_RETURN_IF_ERROR(AdmitClipLocked(*push));
    // Against the state the push is applied to: in sync mode nothing changes it before
    // the step completes (see ps/optimizer_state_limit.h for why the mean needs no check
    // of its own); in async mode it applies now, under the same lock.
    PS_RETURN_IF_ERROR(CheckGradientValuesLocked(rank, step, rows, gradient, push->settings,
                                                 /*against_state=*/true));
  }
  gate_.Take(rank, step);
  ++counters_.accepted_pushes;
  if (options_.mode == TrainingMode::kSync) {
    pending_[rank].skip = push->skip;
    if (step_clip_rank_ < 0 && !push->skip) {
      step_clip_ = push->clip_grad_norm;
      step_clip_rank_ = rank;
    }
    if (step_settings_rank_ < 0 && !push->skip) {
      step_settings_ = push->settings;
      step_settings_rank_ = rank;
    }
    // Not a log entry by itself: the step it completes is (see MaybeCompleteSyncStep).
    // The push's buffers wait here; the caller gets the spare ones.
    std::swap(pending_[rank].gradient, push->gradient);
    std::swap(pending_[rank].rows, push->rows);
    return MaybeCompleteSyncStep(outcome);
  }
  ShardMutation entry;
  entry.kind = ShardMutation::Kind::kPush;
  entry.worker_rank = rank;
  entry.step = step;
  if (record && log_.KeepsEntries()) {
    entry.gradient.assign(gradient.begin(), gradient.end());
    if (!push->skip) entry.rows = push->rows.rows();  // a skip's names no row
    entry.settings = push->settings;
  }
  entry.skipped = push->skip;
  RecordLocked(std::move(entry), record ? outcome : nullptr);
  if (push->skip) {
    ++counters_.skipped_steps;
    outcome->applied_updates = applied_updates_;
    return absl::OkStatus();
  }
  return ApplyUpdate(rows, push->settings, gradient, outcome);
}

void ParameterShard::RecordLocked(ShardMutation mutation, PushOutcome* outcome) {
  log_.Record(std::move(mutation), outcome != nullptr ? &outcome->log : nullptr);
  if (outcome != nullptr) outcome->log_index = log_.index();
}

void ParameterShard::SetLogSink(std::shared_ptr<ShardLogSink> sink,
                                const std::function<void(int64_t)>& at_index) {
  const bool takes_entries = sink == nullptr;
  SetRole(std::move(sink), at_index, takes_entries);
}

void ParameterShard::ServeAlone() { SetRole(nullptr, {}, /*takes_entries=*/false); }

void ParameterShard::SetRole(std::shared_ptr<ShardLogSink> sink,
                             const std::function<void(int64_t)>& at_index, bool takes_entries) {
  absl::MutexLock lock(&mu_);
  int64_t waiting = 0;
  {
    // A promoted backup takes no more entries from now on; those it has apply first.
    absl::MutexLock received_lock(&received_mu_);
    accepting_entries_ = takes_entries;
    waiting = received_through_ - applied_through_;
  }
  if (absl::Status applied = ApplyReceivedLocked(); !applied.ok()) {
    spdlog::error("shard {}: {}", options_.shard_id, applied.ToString());
  } else if (waiting > 0) {
    spdlog::info("shard {}: applied the {} log entries it had received and not yet applied",
                 options_.shard_id, waiting);
  }
  {
    // Entries received since the drain (a backup staying one) stay counted.
    absl::MutexLock received_lock(&received_mu_);
    received_through_ = std::max(received_through_, log_.index());
    applied_through_ = log_.index();
  }
  log_.SetSink(std::move(sink));
  if (at_index) at_index(log_.index());
}

absl::Status ParameterShard::MaybeCompleteSyncStep(PushOutcome* outcome) {
  const std::vector<int> contributors = gate_.CompleteStepContributors();
  if (contributors.empty() || held_) {  // a held step's pushes are final
    outcome->applied_updates = applied_updates_;
    return absl::OkStatus();
  }
  for (int r : contributors) {
    if (!pending_[r].skip) continue;
    SkipSyncStepLocked(outcome);
    return absl::OkStatus();
  }
  if (step_clip_ > 0) {  // applied when ApplyClippedStep brings the coefficient
    HoldClippedStepLocked(contributors);
    outcome->applied_updates = applied_updates_;
    return absl::OkStatus();
  }
  // Every active worker's gradient is in: their mean, summed in rank order, is one update.
  ShardMutation entry;
  entry.kind = ShardMutation::Kind::kSyncStep;
  CheckedRowIds mean_rows;
  MeanOfStepLocked(contributors, &mean_rows, &entry.gradient);
  absl::Status applied = ApplyUpdate(mean_rows.view(), step_settings_, entry.gradient, outcome);
  gate_.EndStep();
  entry.settings = std::move(step_settings_);
  EndSyncStepLocked();
  entry.step = applied_updates_ - 1;
  entry.rows = std::move(mean_rows).TakeRows();
  RecordLocked(std::move(entry), outcome);
  return applied;
}

absl::StatusOr<int64_t> ParameterShard::AwaitStepApplied(int64_t step, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto applied = [this, step]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || applied_updates_ > step || step_conflict_.has_value();
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&applied), deadline)) {
    return absl::DeadlineExceededError(DescribeWait(step + 1));
  }
  if (applied_updates_ > step) return log_.index();
  if (step_conflict_.has_value() && !closed_) return *step_conflict_;
  return ClosedError();
}

absl::Status ParameterShard::ApplyUpdate(RowIdsView rows, const StepHyperparameters& settings,
                                         absl::Span<const float> gradient, PushOutcome* outcome) {
  absl::Status applied = storage_->Apply(NextUpdateLocked(), rows, settings, gradient);
  ++applied_updates_;
  if (!applied.ok()) spdlog::error("shard {}: {}", options_.shard_id, applied.ToString());
  AfterStepLocked(outcome);
  return applied;
}

void ParameterShard::MeanOfStepLocked(const std::vector<int>& contributors, CheckedRowIds* rows,
                                      std::vector<float>* mean) const {
  std::vector<const CheckedRowIds*> their_rows;
  std::vector<absl::Span<const float>> gradients;
  for (int r : contributors) {
    their_rows.push_back(&pending_[r].rows);
    gradients.emplace_back(pending_[r].gradient.data(), pending_[r].gradient.size());
  }
  storage_->Mean(their_rows, gradients, rows, mean);
}

void ParameterShard::SkipSyncStepLocked(PushOutcome* outcome) {
  ++applied_updates_;
  ++skipped_steps_;
  ++counters_.skipped_steps;
  counters_.applied_updates = applied_updates_;
  RememberStepLocked(ClippedStep{applied_updates_ - 1, 0, 0});
  gate_.EndStep();
  EndSyncStepLocked();
  if (outcome == nullptr) return;  // a backup replaying its primary's entry
  ShardMutation entry;
  entry.kind = ShardMutation::Kind::kSyncStep;
  entry.step = applied_updates_ - 1;
  entry.skipped = true;
  RecordLocked(std::move(entry), outcome);
  AfterStepLocked(outcome);
}

void ParameterShard::EndSyncStepLocked() {
  step_settings_.clear();
  step_settings_rank_ = -1;
  step_conflict_.reset();
  for (ShardPush& pending : pending_) pending.skip = false;
  step_clip_ = 0;
  step_clip_rank_ = -1;
  held_ = false;
}

void ParameterShard::AfterStepLocked(PushOutcome* outcome) {
  counters_.applied_updates = applied_updates_;
  outcome->applied_updates = applied_updates_;
  const bool periodic = options_.checkpoint_every_steps > 0 &&
                        applied_updates_ % options_.checkpoint_every_steps == 0;
  if (periodic || scheduled_checkpoints_.erase(applied_updates_) > 0)
    outcome->checkpoint = CheckpointSnapshotLocked();
}

ShardState ParameterShard::CheckpointSnapshotLocked() {
  if (embedding_ == nullptr || options_.embedding_deltas == 0 || replaying_)
    return SnapshotLocked(RowOrder::kAsStored);
  const bool delta = delta_base_step_ >= 0 && delta_base_step_ < applied_updates_ &&
                     deltas_since_full_ < options_.embedding_deltas &&
                     embedding_->ChangesComplete() && options_.checkpoint_held &&
                     options_.checkpoint_held(delta_base_step_);
  if (delta) {
    // Every change since the base (not since the last delta): a delta lost or failed
    // costs its own step only.
    ++deltas_since_full_;
    return SnapshotLocked(RowOrder::kAsStored, delta_base_step_);
  }
  ShardState state = SnapshotLocked(RowOrder::kAsStored);
  embedding_->ClearChanges();
  delta_base_step_ = applied_updates_;
  deltas_since_full_ = 0;
  return state;
}

ActiveWorkersOutcome ParameterShard::SetActiveWorkers(const std::vector<bool>& active) {
  absl::MutexLock lock(&mu_);
  PushOutcome outcome;
  absl::Status completed = SetActiveWorkersLocked(active, &outcome);
  if (!completed.ok()) spdlog::error("shard {}: {}", options_.shard_id, completed.ToString());
  return ActiveWorkersOutcome{std::move(outcome.checkpoint), std::move(outcome.log)};
}

absl::Status ParameterShard::SetActiveWorkersLocked(const std::vector<bool>& active,
                                                    PushOutcome* outcome) {
  ShardMutation entry;
  entry.kind = ShardMutation::Kind::kActiveWorkers;
  entry.active = active;
  RecordLocked(std::move(entry), outcome);
  gate_.SetActive(active);
  // A backup (no outcome) never completes a step by itself: its primary's log says when.
  if (options_.mode != TrainingMode::kSync || outcome == nullptr || !gate_.AnyPending())
    return absl::OkStatus();
  return MaybeCompleteSyncStep(outcome);
}

int64_t ParameterShard::log_index() const {
  absl::MutexLock lock(&mu_);
  return log_.index();
}

bool ParameterShard::ScheduleCheckpointAt(int64_t step) {
  absl::MutexLock lock(&mu_);
  if (options_.checkpoint_at_next_update) step = applied_updates_ + 1;
  if (applied_updates_ >= step) return false;
  scheduled_checkpoints_.insert(step);
  return true;
}

ShardState ParameterShard::SnapshotLocked(RowOrder order, int64_t delta_of) const {
  ShardState state;
  state.shard_id = options_.shard_id;
  state.range = options_.range;
  if (delta_of >= 0) {
    embedding_->SaveChanges(applied_updates_, delta_of, &state);
  } else {
    storage_->Save(applied_updates_, order, &state);
  }
  state.skipped_steps = skipped_steps_;
  for (EmbeddingShardState& table : state.tables) table.skipped_steps = skipped_steps_;
  return state;
}

absl::Status ParameterShard::PullRowsInto(int worker_rank, int64_t step, absl::Time deadline,
                                          const CheckedRowIds& rows, WireDtype encoding,
                                          std::string* values_bytes, PulledValues* info) {
  absl::MutexLock lock(&mu_);
  if (embedding_ == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard ", options_.shard_id, " holds dense parameters; ids name embedding rows"));
  }
  if (!rows.CheckedFor(embedding_->shape())) {
    return absl::InvalidArgumentError(absl::StrCat("embedding shard ", options_.shard_id,
                                                   ": the rows pulled were not checked for it"));
  }
  PS_ASSIGN_OR_RETURN(int64_t start_step, AwaitPullLocked(worker_rank, step, deadline));
  embedding_->AppendValues(rows.view(), encoding, values_bytes);
  if (info != nullptr) *info = PulledValues{{}, applied_updates_, start_step};
  return absl::OkStatus();
}

absl::Status ParameterShard::PullRowsInto(int worker_rank, int64_t step, absl::Time deadline,
                                          RowIdsView rows, WireDtype encoding,
                                          std::string* values_bytes, PulledValues* info) {
  PS_ASSIGN_OR_RETURN(CheckedRowIds checked, CheckRows(rows));
  return PullRowsInto(worker_rank, step, deadline, checked, encoding, values_bytes, info);
}

absl::StatusOr<std::vector<int64_t>> ParameterShard::ExportRowIds(int worker_rank, int64_t step,
                                                                  absl::Time deadline, int table,
                                                                  bool from_start,
                                                                  int64_t after_id) {
  std::vector<int64_t> ids;
  {
    absl::MutexLock lock(&mu_);
    PS_RETURN_IF_ERROR(CheckExportedTable(table));
    PS_RETURN_IF_ERROR(AwaitPullLocked(worker_rank, step, deadline).status());
    PS_RETURN_IF_ERROR(embedding_->AppendRowIds(table, from_start, after_id, &ids));
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

absl::Status ParameterShard::ExportRowsOf(int table, absl::Span<const int64_t> ids,
                                          std::vector<int64_t>* held_ids,
                                          std::vector<float>* rows) const {
  absl::MutexLock lock(&mu_);
  PS_RETURN_IF_ERROR(CheckExportedTable(table));
  return embedding_->CopyHeldRows(table, ids, held_ids, rows);
}

absl::Status ParameterShard::CheckExportedTable(int table) const {
  if (embedding_ == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", options_.shard_id, " holds no rows of table index ", table));
  }
  return embedding_->CheckTableIndex(table);
}

EmbeddingCounters ParameterShard::embedding_counters() const {
  absl::MutexLock lock(&mu_);
  return embedding_ != nullptr ? embedding_->counters() : EmbeddingCounters{};
}

ShardState ParameterShard::Snapshot() const {
  ShardState state;
  {
    absl::MutexLock lock(&mu_);
    state = SnapshotLocked(RowOrder::kAsStored);
  }
  SortRowsById(&state);  // after the lock: pushes wait only for the copy
  return state;
}

void ParameterShard::Close(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  closed_reason_ = reason;
}

void ParameterShard::Reopen() {
  absl::MutexLock lock(&mu_);
  absl::MutexLock received_lock(&received_mu_);
  if (!apply_failure_.ok()) return;  // a diverged replica serves nothing
  closed_ = false;
  closed_reason_.clear();
}

std::vector<int64_t> ParameterShard::worker_next_steps() const {
  absl::MutexLock lock(&mu_);
  if (options_.mode == TrainingMode::kSync) return std::vector<int64_t>(options_.num_workers, 0);
  return gate_.pushed_steps();
}

ShardCounters ParameterShard::counters() const {
  absl::MutexLock lock(&mu_);
  return counters_;
}

}  // namespace paramserver
