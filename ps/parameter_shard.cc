#include "ps/parameter_shard.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/tensor_codec.h"
#include "spdlog/spdlog.h"

namespace paramserver {
namespace {

std::vector<EmbeddingTable> MakeTables(const ParameterShardOptions& options) {
  std::vector<EmbeddingTable> tables;
  if (options.embedding == nullptr) return tables;
  tables.reserve(options.embedding->tables.size());
  for (const EmbeddingTableOptions& table : options.embedding->tables) tables.emplace_back(table);
  return tables;
}

}  // namespace

ParameterShard::ParameterShard(ParameterShardOptions options, std::vector<float> initial_values)
    : options_(std::move(options)),
      values_(std::make_shared<std::vector<float>>(std::move(initial_values))),
      adam_(options_.adam, options_.range.size()),
      active_(options_.num_workers, true),
      pending_gradients_(options_.mode == TrainingMode::kSync ? options_.num_workers : 0),
      pending_received_(options_.num_workers, false),
      tables_(MakeTables(options_)),
      pending_rows_(options_.num_workers),
      pushed_steps_(options_.num_workers, 0) {}

ParameterShard::ParameterShard(ParameterShardOptions options, ShardState state)
    : options_(std::move(options)),
      values_(std::make_shared<std::vector<float>>(std::move(state.values))),
      adam_(options_.adam, state.step, std::move(state.first_moment),
            std::move(state.second_moment)),
      active_(options_.num_workers, true),
      pending_gradients_(options_.mode == TrainingMode::kSync ? options_.num_workers : 0),
      pending_received_(options_.num_workers, false),
      tables_(MakeTables(options_)),
      pending_rows_(options_.num_workers),
      // In async/ssp mode every push of every worker is one update: after `step` updates
      // each of the W workers has pushed about step / W steps.
      pushed_steps_(options_.num_workers,
                    options_.mode == TrainingMode::kSync ? 0 : state.step / options_.num_workers) {
  counters_.applied_updates = adam_.step();
  absl::MutexLock lock(&mu_);
  if (absl::Status restored = RestoreTablesLocked(state.tables); !restored.ok()) {
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

absl::StatusOr<PushOutcome> ParameterShard::SetInitialValues(absl::Span<const float> values) {
  absl::MutexLock lock(&mu_);
  if (closed_) {
    return absl::UnavailableError(
        absl::StrCat("shard ", options_.shard_id, " is closed: ", closed_reason_));
  }
  if (static_cast<int64_t>(values.size()) != options_.range.size() ||
      options_.embedding != nullptr) {
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
    outcome.log_index = log_index_;
    return outcome;
  }
  std::copy(values.begin(), values.end(), values_->begin());
  awaiting_initial_values_ = false;
  ShardMutation mutation;
  mutation.kind = ShardMutation::Kind::kInitialValues;
  if (LogEntriesKeptLocked()) mutation.gradient.assign(values.begin(), values.end());
  RecordLocked(std::move(mutation), &outcome);
  outcome.log_index = log_index_;
  outcome.checkpoint = SnapshotLocked();
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

absl::Status ParameterShard::CheckWorker(int worker_rank) const {
  if (worker_rank < 0 || worker_rank >= options_.num_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown worker rank ", worker_rank, ": the cluster has ",
                     options_.num_workers, " workers (ranks 0..", options_.num_workers - 1, ")"));
  }
  return absl::OkStatus();
}

bool ParameterShard::PullMayProceed(int64_t step) const {
  if (closed_) return true;
  if (awaiting_initial_values_) return false;
  switch (options_.mode) {
    case TrainingMode::kSync:
      return adam_.step() >= step;
    case TrainingMode::kSsp: {
      int64_t slowest = step;
      for (int r = 0; r < options_.num_workers; ++r) {
        if (active_[r]) slowest = std::min(slowest, pushed_steps_[r]);
      }
      return slowest >= step - options_.staleness;
    }
    case TrainingMode::kAsync:
      return true;
  }
  return true;
}

std::string ParameterShard::DescribeWait(int64_t step) const {
  if (awaiting_initial_values_) {
    return absl::StrCat("shard ", options_.shard_id,
                        " has no values yet: it waits for the worker that declared the model to "
                        "set them (job.register)");
  }
  std::vector<int> missing;
  if (options_.mode == TrainingMode::kSync) {
    for (int r = 0; r < options_.num_workers; ++r) {
      if (active_[r] && !pending_received_[r]) missing.push_back(r);
    }
    return absl::StrCat("shard ", options_.shard_id, " is at step ", adam_.step(),
                        " and a pull for step ", step, " waits for the step-", adam_.step(),
                        " pushes of workers [", absl::StrJoin(missing, ", "), "]");
  }
  const int64_t needed = step - options_.staleness;
  for (int r = 0; r < options_.num_workers; ++r) {
    if (active_[r] && pushed_steps_[r] < needed) missing.push_back(r);
  }
  return absl::StrCat("shard ", options_.shard_id, ": a pull for step ", step, " (staleness ",
                      options_.staleness, ") waits for workers [", absl::StrJoin(missing, ", "),
                      "] to push step ", needed - 1);
}

absl::StatusOr<PulledValues> ParameterShard::Pull(int worker_rank, int64_t step,
                                                  absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  PS_ASSIGN_OR_RETURN(int64_t start_step, AwaitPullLocked(worker_rank, step, deadline));
  return PulledValues{*values_, adam_.step(), start_step};
}

absl::Status ParameterShard::PullInto(int worker_rank, int64_t step, absl::Time deadline,
                                      WireDtype encoding, std::string* values_bytes,
                                      PulledValues* info) {
  absl::MutexLock lock(&mu_);
  PS_ASSIGN_OR_RETURN(int64_t start_step, AwaitPullLocked(worker_rank, step, deadline));
  AppendEncoded(encoding, *values_, values_bytes);
  if (info != nullptr) *info = PulledValues{{}, adam_.step(), start_step};
  return absl::OkStatus();
}

absl::Status ParameterShard::PullShared(int worker_rank, int64_t step, absl::Time deadline,
                                        std::shared_ptr<const std::vector<float>>* values,
                                        PulledValues* info) {
  absl::MutexLock lock(&mu_);
  PS_ASSIGN_OR_RETURN(int64_t start_step, AwaitPullLocked(worker_rank, step, deadline));
  *values = values_;
  if (info != nullptr) *info = PulledValues{{}, adam_.step(), start_step};
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ParameterShard::AwaitPullLocked(int worker_rank, int64_t step,
                                                        absl::Time deadline) {
  if (absl::Status s = CheckWorker(worker_rank); !s.ok()) return s;
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("pull for negative step ", step));
  auto may_proceed = [this, step]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return PullMayProceed(step); };
  ++waiting_pulls_;
  const bool proceeded = mu_.AwaitWithDeadline(absl::Condition(&may_proceed), deadline);
  --waiting_pulls_;
  if (!proceeded) return absl::DeadlineExceededError(DescribeWait(step));
  if (closed_) {
    return absl::UnavailableError(
        absl::StrCat("shard ", options_.shard_id, " is closed: ", closed_reason_));
  }
  int64_t start_step = adam_.step();
  if (options_.mode != TrainingMode::kSync) {
    // The slowest active worker, counting this one: 0 in a fresh job; for a worker
    // taking a dead one's rank, where its predecessor left off.
    start_step = pushed_steps_[worker_rank];
    for (int r = 0; r < options_.num_workers; ++r) {
      if (active_[r]) start_step = std::min(start_step, pushed_steps_[r]);
    }
  }
  return start_step;
}

absl::StatusOr<PushOutcome> ParameterShard::Push(int worker_rank, int64_t step,
                                                 absl::Span<const float> gradient) {
  absl::MutexLock lock(&mu_);
  PushOutcome outcome;
  PS_RETURN_IF_ERROR(PushLocked(worker_rank, step, nullptr, gradient, &outcome, /*record=*/true));
  return outcome;
}

absl::StatusOr<PushOutcome> ParameterShard::PushRows(int worker_rank, int64_t step, RowIdsView rows,
                                                     absl::Span<const float> gradient) {
  absl::MutexLock lock(&mu_);
  PushOutcome outcome;
  PS_RETURN_IF_ERROR(PushLocked(worker_rank, step, &rows, gradient, &outcome, /*record=*/true));
  return outcome;
}

absl::Status ParameterShard::CheckGradientShape(const RowIdsView* rows,
                                                absl::Span<const float> gradient) const {
  if (options_.embedding == nullptr) {
    if (rows != nullptr && !rows->ids.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard ", options_.shard_id, " holds dense parameters; ids name embedding rows"));
    }
    if (static_cast<int64_t>(gradient.size()) != options_.range.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard ", options_.shard_id, " has ", options_.range.size(),
                       " parameters; the gradient has ", gradient.size()));
    }
    return absl::OkStatus();
  }
  if (rows == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard ", options_.shard_id, " is an embedding shard: a push names its rows' ids"));
  }
  if (absl::Status fits = CheckRowIds(*rows, options_.embedding->shape); !fits.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("embedding shard ", options_.shard_id, ": ", fits.message()));
  }
  const int64_t expected = RowFloats(*rows, options_.embedding->shape.dims);
  if (static_cast<int64_t>(gradient.size()) != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("embedding shard ", options_.shard_id, ": the gradient has ", gradient.size(),
                     " floats; the rows of the ", rows->ids.size(), " ids sent have ", expected));
  }
  return absl::OkStatus();
}

size_t ParameterShard::FirstUnsafeElementLocked(const RowIdsView* rows,
                                                absl::Span<const float> gradient) const {
  if (rows == nullptr) return adam_.FirstUnsafeElement(gradient);
  // The step the rows' update would use: ApplyUpdate counts it first.
  const int64_t step = adam_.step() + 1;
  size_t id_at = 0, float_at = 0;
  for (size_t t = 0; t < tables_.size(); ++t) {
    const size_t count = rows->counts[t];
    const size_t floats = count * tables_[t].dim();
    const size_t element = tables_[t].FirstUnsafeElement(step, rows->ids.subspan(id_at, count),
                                                         gradient.subspan(float_at, floats));
    if (element < floats) return float_at + element;
    id_at += count;
    float_at += floats;
  }
  return gradient.size();
}

absl::Status ParameterShard::CheckGradientValuesLocked(int worker_rank, int64_t step,
                                                       const RowIdsView* rows,
                                                       absl::Span<const float> gradient,
                                                       bool against_state) {
  const auto refuse = [&](GradientRefusal reason, int64_t* counter,
                          std::string message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++counters_.rejected_pushes;
    ++*counter;
    if (options_.refusals != nullptr) options_.refusals->Count(reason);
    // Logged at the 1st, 2nd, 4th, 8th... refusal of a kind: a member pushing bad values
    // in a loop cannot flood the log (the service's refusal log and metrics count all).
    if ((*counter & (*counter - 1)) == 0)
      spdlog::warn("refused a push: {} ({} so far on this shard)", message, *counter);
    return absl::InvalidArgumentError(std::move(message));
  };
  // "shard 3: gradient[i] of worker 1 for step 7 is <value>", an embedding shard's
  // element also as its table's row and place in it.
  const auto element = [&](size_t i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::string name = absl::StrCat("shard ", options_.shard_id, ": gradient[", i, "]");
    size_t float_at = 0, id_at = 0;
    for (size_t t = 0; rows != nullptr && t < tables_.size(); ++t) {
      const size_t dim = tables_[t].dim();
      const size_t floats = rows->counts[t] * dim;
      if (i < float_at + floats) {
        const size_t row = (i - float_at) / dim;
        absl::StrAppend(&name, " (table C", t + 1, ", id ", rows->ids[id_at + row], ", element ",
                        (i - float_at) % dim, ")");
        break;
      }
      float_at += floats;
      id_at += rows->counts[t];
    }
    absl::StrAppend(&name, " of worker ", worker_rank, " for step ", step, " is ", gradient[i]);
    return name;
  };
  if (against_state) {
    if (const size_t i = FirstUnsafeElementLocked(rows, gradient); i < gradient.size()) {
      return refuse(GradientRefusal::kOverflow, &counters_.rejected_overflow,
                    absl::StrCat(element(i),
                                 ": applied now, it would take the optimizer's state (its "
                                 "square, a moment, a sum of squares or the parameter) out of "
                                 "float32's range"));
    }
    return absl::OkStatus();
  }
  if (const size_t i = FirstNonFinite(gradient); i < gradient.size()) {
    return refuse(GradientRefusal::kNonFinite, &counters_.rejected_nonfinite,
                  absl::StrCat(element(i), "; only finite values are accepted"));
  }
  if (options_.max_gradient_norm > 0) {
    // In double: a sum of float squares cannot overflow it.
    double sum_of_squares = 0;
    for (float g : gradient) sum_of_squares += static_cast<double>(g) * g;
    const double norm = std::sqrt(sum_of_squares);
    if (norm > options_.max_gradient_norm) {
      return refuse(
          GradientRefusal::kNorm, &counters_.rejected_norm,
          absl::StrCat("shard ", options_.shard_id, ": the gradient of worker ", worker_rank,
                       " for step ", step, " has an L2 norm of ", norm, " over this shard's ",
                       gradient.size(), " elements, above training.max_gradient_norm ",
                       options_.max_gradient_norm, " (a bound on each shard's part)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParameterShard::PushLocked(int worker_rank, int64_t step, const RowIdsView* rows,
                                        absl::Span<const float> gradient, PushOutcome* outcome,
                                        bool record) {
  if (absl::Status s = CheckWorker(worker_rank); !s.ok()) {
    ++counters_.rejected_pushes;
    return s;
  }
  if (closed_) {
    return absl::UnavailableError(
        absl::StrCat("shard ", options_.shard_id, " is closed: ", closed_reason_));
  }
  if (awaiting_initial_values_) {
    ++counters_.rejected_pushes;
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", options_.shard_id, " has no values yet to apply a gradient to (job.register)"));
  }
  if (!active_[worker_rank]) {
    ++counters_.rejected_pushes;
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", worker_rank, " was declared dead for shard ", options_.shard_id,
                     "; refresh the shard map"));
  }
  if (step < 0) {
    ++counters_.rejected_pushes;
    return absl::InvalidArgumentError(absl::StrCat("push for negative step ", step));
  }
  if (absl::Status shape = CheckGradientShape(rows, gradient); !shape.ok()) {
    ++counters_.rejected_pushes;
    return shape;
  }
  PS_RETURN_IF_ERROR(
      CheckGradientValuesLocked(worker_rank, step, rows, gradient, /*against_state=*/false));
  outcome->applied_updates = adam_.step();
  outcome->log_index = log_index_;
  if (options_.mode == TrainingMode::kSync) {
    if (step < adam_.step() || (step == adam_.step() && pending_received_[worker_rank])) {
      ++counters_.duplicate_pushes;
      outcome->duplicate = true;
      return absl::OkStatus();
    }
    if (step > adam_.step()) {
      ++counters_.rejected_pushes;
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", options_.shard_id, " is at step ", adam_.step(), "; the push of worker ",
          worker_rank, " for step ", step, " is ahead of it"));
    }
    // Against the state the step will be applied to: nothing changes it before the step
    // completes (see ps/optimizer_state_limit.h for why the mean needs no check of its own).
    PS_RETURN_IF_ERROR(
        CheckGradientValuesLocked(worker_rank, step, rows, gradient, /*against_state=*/true));
    // Not a log entry by itself: the step it completes is (see MaybeCompleteSyncStep).
    pending_gradients_[worker_rank].assign(gradient.begin(), gradient.end());
    if (rows != nullptr) {
      pending_rows_[worker_rank].counts.assign(rows->counts.begin(), rows->counts.end());
      pending_rows_[worker_rank].ids.assign(rows->ids.begin(), rows->ids.end());
    }
    pending_received_[worker_rank] = true;
    ++counters_.accepted_pushes;
    MaybeCompleteSyncStep(outcome);
    return absl::OkStatus();
  }
  if (step < pushed_steps_[worker_rank]) {
    ++counters_.duplicate_pushes;
    outcome->duplicate = true;
    return absl::OkStatus();
  }
  if (step - pushed_steps_[worker_rank] >= kMaxAsyncStepLead) {
    // A worker moves on one step at a time (a gap is a push lost to a restore): a step
    // this far ahead would make its next real pushes duplicates, or overflow.
    ++counters_.rejected_pushes;
    return absl::InvalidArgumentError(
        absl::StrCat("push of worker ", worker_rank, " for step ", step, " on shard ",
                     options_.shard_id, ": its next step is ", pushed_steps_[worker_rank],
                     ", and at most ", kMaxAsyncStepLead, " steps ahead are accepted"));
  }
  // Against the state this push is applied to, now, under the same lock.
  PS_RETURN_IF_ERROR(
      CheckGradientValuesLocked(worker_rank, step, rows, gradient, /*against_state=*/true));
  pushed_steps_[worker_rank] = step + 1;
  ++counters_.accepted_pushes;
  ShardMutation entry;
  entry.kind = ShardMutation::Kind::kPush;
  entry.worker_rank = worker_rank;
  entry.step = step;
  if (record && LogEntriesKeptLocked()) {
    entry.gradient.assign(gradient.begin(), gradient.end());
    if (rows != nullptr) {
      entry.rows.counts.assign(rows->counts.begin(), rows->counts.end());
      entry.rows.ids.assign(rows->ids.begin(), rows->ids.end());
    }
  }
  RecordLocked(std::move(entry), record ? outcome : nullptr);
  ApplyUpdate(rows, gradient, outcome);
  return absl::OkStatus();
}

void ParameterShard::RecordLocked(ShardMutation mutation, PushOutcome* outcome) {
  mutation.index = ++log_index_;
  if (outcome == nullptr) return;
  outcome->log_index = log_index_;
  if (log_sink_ != nullptr) {
    log_sink_->Append(std::move(mutation));
  } else if (options_.hand_back_log) {
    outcome->log.push_back(std::move(mutation));
  }
}

void ParameterShard::SetLogSink(std::shared_ptr<ShardLogSink> sink,
                                const std::function<void(int64_t)>& at_index) {
  absl::MutexLock lock(&mu_);
  log_sink_ = std::move(sink);
  if (at_index) at_index(log_index_);
}

void ParameterShard::MaybeCompleteSyncStep(PushOutcome* outcome) {
  int contributors = 0;
  for (int r = 0; r < options_.num_workers; ++r) {
    if (!active_[r]) continue;
    if (!pending_received_[r]) {
      outcome->applied_updates = adam_.step();
      return;
    }
    ++contributors;
  }
  if (contributors == 0) return;
  // Every active worker's gradient is in: their mean, summed in rank order, is one update.
  ShardMutation entry;
  entry.kind = ShardMutation::Kind::kSyncStep;
  std::vector<float>& mean = entry.gradient;
  if (options_.embedding != nullptr) {
    std::vector<const RowIds*> rows;
    std::vector<const std::vector<float>*> gradients;
    for (int r = 0; r < options_.num_workers; ++r) {
      if (!active_[r]) continue;
      rows.push_back(&pending_rows_[r]);
      gradients.push_back(&pending_gradients_[r]);
    }
    MeanSparseGradients(rows, gradients, options_.embedding->shape.dims, contributors, &entry.rows,
                        &mean);
    const RowIdsView view = entry.rows.view();
    ApplyUpdate(&view, mean, outcome);
  } else {
    mean.assign(values_->size(), 0.0f);
    for (int r = 0; r < options_.num_workers; ++r) {
      if (!active_[r]) continue;
      const std::vector<float>& g = pending_gradients_[r];
      for (size_t i = 0; i < mean.size(); ++i) mean[i] += g[i];
    }
    const float scale = 1.0f / static_cast<float>(contributors);
    for (float& x : mean) x *= scale;
    ApplyUpdate(nullptr, mean, outcome);
  }
  std::fill(pending_received_.begin(), pending_received_.end(), false);
  entry.step = adam_.step() - 1;
  RecordLocked(std::move(entry), outcome);
}

absl::StatusOr<int64_t> ParameterShard::AwaitStepApplied(int64_t step, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto applied = [this, step]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closed_ || adam_.step() > step; };
  if (!mu_.AwaitWithDeadline(absl::Condition(&applied), deadline)) {
    return absl::DeadlineExceededError(DescribeWait(step + 1));
  }
  if (adam_.step() > step) return log_index_;
  return absl::UnavailableError(
      absl::StrCat("shard ", options_.shard_id, " is closed: ", closed_reason_));
}

void ParameterShard::ApplyUpdate(const RowIdsView* rows, absl::Span<const float> gradient,
                                 PushOutcome* outcome) {
  // Only a copy of values_ made under mu_ can share it, so a count of 1 stays 1 here.
  if (values_.use_count() > 1) {
    // A reply is still sending this version: the update goes to another buffer.
    std::shared_ptr<std::vector<float>> next;
    if (retired_ != nullptr && retired_.use_count() == 1) {
      std::atomic_thread_fence(std::memory_order_acquire);  // its last reader is done with it
      next = std::move(retired_);
    } else {
      next = std::make_shared<std::vector<float>>(values_->size());
    }
    std::copy(values_->begin(), values_->end(), next->begin());
    retired_ = std::exchange(values_, std::move(next));
  } else {
    std::atomic_thread_fence(std::memory_order_acquire);
  }
  if (rows == nullptr) {
    adam_.Apply(gradient, absl::MakeSpan(*values_));
  } else {
    adam_.Apply({}, {});  // the step count, which the row optimizers' bias correction uses
    size_t id_at = 0, float_at = 0;
    for (size_t t = 0; t < tables_.size(); ++t) {
      const size_t count = rows->counts[t];
      const size_t floats = count * tables_[t].dim();
      // Checked by CheckGradientShape: sizes agree and ids ascend, so this cannot fail.
      absl::Status applied = tables_[t].Apply(adam_.step(), rows->ids.subspan(id_at, count),
                                              gradient.subspan(float_at, floats));
      if (!applied.ok()) spdlog::error("shard {}: {}", options_.shard_id, applied.ToString());
      id_at += count;
      float_at += floats;
    }
  }
  counters_.applied_updates = adam_.step();
  outcome->applied_updates = adam_.step();
  const bool periodic =
      options_.checkpoint_every_steps > 0 && adam_.step() % options_.checkpoint_every_steps == 0;
  if (periodic || scheduled_checkpoints_.erase(adam_.step()) > 0)
    outcome->checkpoint = SnapshotLocked();
}

ActiveWorkersOutcome ParameterShard::SetActiveWorkers(const std::vector<bool>& active) {
  absl::MutexLock lock(&mu_);
  PushOutcome outcome;
  SetActiveWorkersLocked(active, &outcome);
  return ActiveWorkersOutcome{std::move(outcome.checkpoint), std::move(outcome.log)};
}

void ParameterShard::SetActiveWorkersLocked(const std::vector<bool>& active, PushOutcome* outcome) {
  ShardMutation entry;
  entry.kind = ShardMutation::Kind::kActiveWorkers;
  entry.active = active;
  RecordLocked(std::move(entry), outcome);
  active_ = active;
  for (int r = 0; r < options_.num_workers; ++r) {
    // A rejoining ssp/async worker starts from the shard's present, not from step 0.
    if (!active_[r]) pending_received_[r] = false;
  }
  // A backup (no outcome) never completes a step by itself: its primary's log says when.
  if (options_.mode != TrainingMode::kSync || outcome == nullptr) return;
  bool any_pending =
      std::any_of(pending_received_.begin(), pending_received_.end(), [](bool b) { return b; });
  if (any_pending) MaybeCompleteSyncStep(outcome);
}

absl::StatusOr<int64_t> ParameterShard::ApplyLogEntry(const ShardMutation& mutation) {
  absl::MutexLock lock(&mu_);
  if (mutation.index <= log_index_) return log_index_;
  if (mutation.index != log_index_ + 1) {
    return absl::FailedPreconditionError(absl::StrCat("shard ", options_.shard_id,
                                                      " replica is at log index ", log_index_,
                                                      "; entry ", mutation.index, " leaves a gap"));
  }
  switch (mutation.kind) {
    case ShardMutation::Kind::kActiveWorkers:
      if (static_cast<int>(mutation.active.size()) != options_.num_workers) {
        return absl::InvalidArgumentError(absl::StrCat(
            "shard ", options_.shard_id, " log entry ", mutation.index, ": active set of ",
            mutation.active.size(), " workers, not ", options_.num_workers));
      }
      SetActiveWorkersLocked(mutation.active, nullptr);
      return log_index_;
    case ShardMutation::Kind::kSyncStep: {
      const RowIdsView rows = mutation.rows.view();
      const RowIdsView* rows_if_any = options_.embedding != nullptr ? &rows : nullptr;
      if (options_.mode != TrainingMode::kSync || mutation.step != adam_.step() ||
          !CheckGradientShape(rows_if_any, mutation.gradient).ok()) {
        return absl::InternalError(absl::StrCat("shard ", options_.shard_id, " replica (at step ",
                                                adam_.step(),
                                                ") diverged from its primary: log entry ",
                                                mutation.index, " applies step ", mutation.step));
      }
      PushOutcome ignored;  // checkpoints are the primary's to write
      ApplyUpdate(rows_if_any, mutation.gradient, &ignored);
      std::fill(pending_received_.begin(), pending_received_.end(), false);
      ++log_index_;
      return log_index_;
    }
    case ShardMutation::Kind::kInitialValues:
      if (!awaiting_initial_values_ || mutation.gradient.size() != values_->size()) {
        return absl::InternalError(absl::StrCat(
            "shard ", options_.shard_id, " replica diverged from its primary: log entry ",
            mutation.index, " sets initial values on a shard that ",
            awaiting_initial_values_ ? "holds another number of them" : "has values"));
      }
      std::copy(mutation.gradient.begin(), mutation.gradient.end(), values_->begin());
      awaiting_initial_values_ = false;
      ++log_index_;
      return log_index_;
    case ShardMutation::Kind::kPush: {
      if (options_.mode == TrainingMode::kSync) {
        return absl::InternalError(absl::StrCat("shard ", options_.shard_id,
                                                " (sync) got a push as log entry ", mutation.index,
                                                "; sync primaries log completed steps"));
      }
      PushOutcome outcome;
      const RowIdsView rows = mutation.rows.view();
      absl::Status pushed =
          PushLocked(mutation.worker_rank, mutation.step,
                     options_.embedding != nullptr ? &rows : nullptr, mutation.gradient, &outcome,
                     /*record=*/false);
      if (!pushed.ok() || outcome.duplicate) {
        return absl::InternalError(absl::StrCat(
            "shard ", options_.shard_id, " replica diverged from its primary: log entry ",
            mutation.index, " (push of worker ", mutation.worker_rank, " for step ", mutation.step,
            ") was ", pushed.ok() ? std::string("a duplicate here") : pushed.ToString()));
      }
      return log_index_;
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("log entry ", mutation.index, " of an unknown kind"));
}

ReplicaState ParameterShard::ExportReplica() const {
  absl::MutexLock lock(&mu_);
  ReplicaState replica;
  replica.shard = SnapshotLocked();
  replica.log_index = log_index_;
  replica.awaiting_initial_values = awaiting_initial_values_;
  replica.active = active_;
  replica.pushed_steps = pushed_steps_;
  replica.pending_received = pending_received_;
  replica.pending_gradients.resize(options_.num_workers);
  replica.pending_rows.resize(options_.num_workers);
  for (int r = 0; r < options_.num_workers && r < static_cast<int>(pending_gradients_.size());
       ++r) {
    if (!pending_received_[r]) continue;
    replica.pending_gradients[r] = pending_gradients_[r];
    replica.pending_rows[r] = pending_rows_[r];
  }
  if (options_.embedding != nullptr) {
    replica.shard.tables = TablesLocked(/*by_id=*/false);
    replica.sightings.resize(tables_.size());
    for (size_t t = 0; t < tables_.size(); ++t) {
      tables_[t].ForEachPending(
          [&](int64_t id, int32_t count) { replica.sightings[t].emplace_back(id, count); });
    }
  }
  return replica;
}

absl::StatusOr<std::unique_ptr<ParameterShard>> ParameterShard::FromReplica(
    ParameterShardOptions options, ReplicaState replica) {
  const size_t size = options.range.size();
  const size_t workers = options.num_workers;
  if (!(replica.shard.range == options.range) || replica.shard.values.size() != size ||
      replica.shard.first_moment.size() != size || replica.shard.second_moment.size() != size) {
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
  const bool embedding = options.embedding != nullptr;
  if (embedding && (replica.pending_rows.size() != workers ||
                    replica.sightings.size() != options.embedding->tables.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the replica of embedding shard ", options.shard_id, " has pending rows for ",
        replica.pending_rows.size(), " workers and sightings for ", replica.sightings.size(),
        " tables; expected ", workers, " and ", options.embedding->tables.size()));
  }
  // The tables are restored in the order given (least recently updated first), which
  // rebuilds the primary's recency order.
  PS_RETURN_IF_ERROR(CheckTablesFit(options, replica.shard.tables));
  auto shard = std::make_unique<ParameterShard>(std::move(options), std::move(replica.shard));
  absl::MutexLock lock(&shard->mu_);
  for (size_t r = 0; r < workers; ++r) {
    if (!sync || !replica.pending_received[r]) continue;
    const RowIdsView rows = embedding ? replica.pending_rows[r].view() : RowIdsView{};
    absl::Status fits =
        shard->CheckGradientShape(embedding ? &rows : nullptr, replica.pending_gradients[r]);
    if (!fits.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the replica of shard ", shard->options_.shard_id, " has a pending gradient of worker ",
          r, " that does not fit: ", fits.message()));
    }
    if (embedding) shard->pending_rows_[r] = std::move(replica.pending_rows[r]);
  }
  for (size_t t = 0; t < replica.sightings.size(); ++t) {
    for (const auto& [id, count] : replica.sightings[t])
      shard->tables_[t].RestorePending(id, count);
  }
  shard->log_index_ = replica.log_index;
  shard->awaiting_initial_values_ = replica.awaiting_initial_values;
  shard->active_ = std::move(replica.active);
  shard->pushed_steps_ = std::move(replica.pushed_steps);
  shard->pending_received_ = std::move(replica.pending_received);
  if (sync) {
    for (size_t r = 0; r < workers; ++r) {
      if (shard->pending_received_[r])
        shard->pending_gradients_[r] = std::move(replica.pending_gradients[r]);
    }
  }
  return shard;
}

int64_t ParameterShard::log_index() const {
  absl::MutexLock lock(&mu_);
  return log_index_;
}

bool ParameterShard::ScheduleCheckpointAt(int64_t step) {
  absl::MutexLock lock(&mu_);
  if (adam_.step() >= step) return false;
  scheduled_checkpoints_.insert(step);
  return true;
}

ShardState ParameterShard::SnapshotLocked() const {
  ShardState state;
  state.shard_id = options_.shard_id;
  state.range = options_.range;
  state.step = adam_.step();
  state.values = *values_;
  state.first_moment = adam_.first_moment();
  state.second_moment = adam_.second_moment();
  if (options_.embedding != nullptr) state.tables = TablesLocked(/*by_id=*/true);
  return state;
}

std::vector<EmbeddingShardState> ParameterShard::TablesLocked(bool by_id) const {
  std::vector<EmbeddingShardState> states;
  if (options_.embedding == nullptr) return states;
  for (size_t t = 0; t < tables_.size(); ++t) {
    EmbeddingShardState& out = states.emplace_back();
    const EmbeddingTableOptions& table = options_.embedding->tables[t];
    out.table_index = static_cast<int>(t);
    out.dim = table.dim;
    out.state_floats = table.dim * StateFloatsPerElement(table.optimizer.type);
    out.shard_id = options_.embedding->shape.bucket;
    out.shard_count = options_.embedding->shape.bucket_count;
    out.step = adam_.step();
    std::vector<int64_t> ids;
    std::vector<float> rows, state;
    ids.reserve(tables_[t].rows());
    rows.reserve(tables_[t].rows() * out.dim);
    state.reserve(tables_[t].rows() * out.state_floats);
    tables_[t].ForEachRow(
        [&](int64_t id, absl::Span<const float> row, absl::Span<const float> row_state) {
          ids.push_back(id);
          rows.insert(rows.end(), row.begin(), row.end());
          state.insert(state.end(), row_state.begin(), row_state.end());
        });
    if (!by_id) {
      out.ids = std::move(ids);
      out.rows = std::move(rows);
      out.state = std::move(state);
      continue;
    }
    std::vector<size_t> order(ids.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ids[a] < ids[b]; });
    out.ids.reserve(ids.size());
    out.rows.reserve(rows.size());
    out.state.reserve(state.size());
    for (size_t i : order) {
      out.ids.push_back(ids[i]);
      out.rows.insert(out.rows.end(), rows.begin() + i * out.dim, rows.begin() + (i + 1) * out.dim);
      out.state.insert(out.state.end(), state.begin() + i * out.state_floats,
                       state.begin() + (i + 1) * out.state_floats);
    }
  }
  return states;
}

absl::Status ParameterShard::CheckTablesFit(const ParameterShardOptions& options,
                                            const std::vector<EmbeddingShardState>& tables) {
  if (options.embedding == nullptr) {
    if (tables.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", options.shard_id, " holds dense parameters, not table rows"));
  }
  const std::vector<EmbeddingTableOptions>& ours = options.embedding->tables;
  if (tables.size() != ours.size()) {
    return absl::InvalidArgumentError(absl::StrCat("embedding shard ", options.shard_id, ": ",
                                                   tables.size(), " tables given; the model has ",
                                                   ours.size()));
  }
  for (size_t t = 0; t < tables.size(); ++t) {
    const EmbeddingShardState& table = tables[t];
    const int state_floats = ours[t].dim * StateFloatsPerElement(ours[t].optimizer.type);
    if (table.table_index != static_cast<int>(t) || table.dim != ours[t].dim ||
        table.state_floats != state_floats) {
      return absl::InvalidArgumentError(absl::StrCat(
          "embedding shard ", options.shard_id, ": table C", table.table_index + 1, " of dim ",
          table.dim, " with ", table.state_floats, " state floats per row does not fit table C",
          t + 1, " (dim ", ours[t].dim, ", ", state_floats, " state floats)"));
    }
    if (table.rows.size() != table.ids.size() * table.dim ||
        table.state.size() != table.ids.size() * table.state_floats) {
      return absl::InvalidArgumentError(absl::StrCat(
          "embedding shard ", options.shard_id, ": table C", t + 1, " has ", table.ids.size(),
          " ids but ", table.rows.size(), " row floats and ", table.state.size(), " state floats"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParameterShard::RestoreTablesLocked(const std::vector<EmbeddingShardState>& tables) {
  PS_RETURN_IF_ERROR(CheckTablesFit(options_, tables));
  for (size_t t = 0; t < tables.size(); ++t) {
    const EmbeddingShardState& table = tables[t];
    for (size_t i = 0; i < table.ids.size(); ++i) {
      PS_RETURN_IF_ERROR(tables_[t].Restore(
          table.ids[i], absl::MakeConstSpan(table.rows).subspan(i * table.dim, table.dim),
          absl::MakeConstSpan(table.state).subspan(i * table.state_floats, table.state_floats)));
    }
  }
  return absl::OkStatus();
}

absl::Status ParameterShard::PullRowsInto(int worker_rank, int64_t step, absl::Time deadline,
                                          RowIdsView rows, WireDtype encoding,
                                          std::string* values_bytes, PulledValues* info) {
  absl::MutexLock lock(&mu_);
  if (options_.embedding == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard ", options_.shard_id, " holds dense parameters; ids name embedding rows"));
  }
  if (absl::Status fits = CheckRowIds(rows, options_.embedding->shape); !fits.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("embedding shard ", options_.shard_id, ": ", fits.message()));
  }
  PS_ASSIGN_OR_RETURN(int64_t start_step, AwaitPullLocked(worker_rank, step, deadline));
  std::vector<float> values(RowFloats(rows, options_.embedding->shape.dims));
  size_t id_at = 0, float_at = 0;
  for (size_t t = 0; t < tables_.size(); ++t) {
    const size_t count = rows.counts[t];
    const size_t floats = count * tables_[t].dim();
    tables_[t].Pull(rows.ids.subspan(id_at, count),
                    absl::MakeSpan(values).subspan(float_at, floats), nullptr);
    id_at += count;
    float_at += floats;
  }
  AppendEncoded(encoding, values, values_bytes);
  if (info != nullptr) *info = PulledValues{{}, adam_.step(), start_step};
  return absl::OkStatus();
}

absl::Status ParameterShard::ExportRows(int worker_rank, int64_t step, absl::Time deadline,
                                        int table, bool from_start, int64_t after_id,
                                        int64_t max_rows, std::vector<int64_t>* ids,
                                        std::vector<float>* rows, bool* done) {
  absl::MutexLock lock(&mu_);
  if (options_.embedding == nullptr || table < 0 || table >= static_cast<int>(tables_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", options_.shard_id, " holds no rows of table index ", table));
  }
  PS_RETURN_IF_ERROR(AwaitPullLocked(worker_rank, step, deadline).status());
  std::vector<int64_t> after;
  tables_[table].ForEachRow([&](int64_t id, absl::Span<const float>, absl::Span<const float>) {
    if (from_start || id > after_id) after.push_back(id);
  });
  const size_t take = std::min<size_t>(after.size(), std::max<int64_t>(max_rows, 1));
  std::partial_sort(after.begin(), after.begin() + take, after.end());
  *done = take == after.size();
  ids->assign(after.begin(), after.begin() + take);
  const int dim = tables_[table].dim();
  rows->resize(take * dim);
  tables_[table].Pull(*ids, absl::MakeSpan(*rows), nullptr);
  return absl::OkStatus();
}

EmbeddingCounters ParameterShard::embedding_counters() const {
  absl::MutexLock lock(&mu_);
  EmbeddingCounters counters;
  for (const EmbeddingTable& table : tables_) {
    counters.rows += table.rows();
    counters.evicted_rows += table.evicted_rows();
    counters.dropped_gradients += table.dropped_gradients();
    counters.pending_ids += table.pending_ids();
    counters.bytes += table.bytes_per_row() * static_cast<double>(table.rows());
    counters.minimum_bytes += table.minimum_bytes_per_row() * table.rows();
  }
  return counters;
}

ShardState ParameterShard::Snapshot() const {
  absl::MutexLock lock(&mu_);
  return SnapshotLocked();
}

void ParameterShard::Close(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  closed_reason_ = reason;
}

ShardCounters ParameterShard::counters() const {
  absl::MutexLock lock(&mu_);
  return counters_;
}

}  // namespace paramserver
