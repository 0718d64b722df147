#include "ps/parameter_shard.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"

namespace paramserver {

ParameterShard::ParameterShard(ParameterShardOptions options, std::vector<float> initial_values)
    : options_(std::move(options)),
      values_(std::move(initial_values)),
      adam_(options_.adam, options_.range.size()),
      pending_gradients_(options_.mode == TrainingMode::kSync ? options_.num_workers : 0),
      pending_received_(options_.num_workers, false),
      pushed_steps_(options_.num_workers, 0) {}

absl::Status ParameterShard::CheckWorker(int worker_rank) const {
  if (worker_rank < 0 || worker_rank >= options_.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("unknown worker rank ", worker_rank,
                                                   ": the cluster has ", options_.num_workers,
                                                   " workers (ranks 0..", options_.num_workers - 1, ")"));
  }
  return absl::OkStatus();
}

bool ParameterShard::PullMayProceed(int64_t step) const {
  if (closed_) return true;
  switch (options_.mode) {
    case TrainingMode::kSync:
      return adam_.step() >= step;
    case TrainingMode::kSsp:
      return *std::min_element(pushed_steps_.begin(), pushed_steps_.end()) >=
             step - options_.staleness;
    case TrainingMode::kAsync:
      return true;
  }
  return true;
}

std::string ParameterShard::DescribeWait(int64_t step) const {
  std::vector<int> missing;
  if (options_.mode == TrainingMode::kSync) {
    for (int r = 0; r < options_.num_workers; ++r) {
      if (!pending_received_[r]) missing.push_back(r);
    }
    return absl::StrCat("shard ", options_.shard_id, " is at step ", adam_.step(),
                        " and a pull for step ", step, " waits for the step-", adam_.step(),
                        " pushes of workers [", absl::StrJoin(missing, ", "), "]");
  }
  const int64_t needed = step - options_.staleness;
  for (int r = 0; r < options_.num_workers; ++r) {
    if (pushed_steps_[r] < needed) missing.push_back(r);
  }
  return absl::StrCat("shard ", options_.shard_id, ": a pull for step ", step, " (staleness ",
                      options_.staleness, ") waits for workers [", absl::StrJoin(missing, ", "),
                      "] to push step ", needed - 1);
}

absl::StatusOr<PulledValues> ParameterShard::Pull(int worker_rank, int64_t step, absl::Time deadline) {
  if (absl::Status s = CheckWorker(worker_rank); !s.ok()) return s;
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("pull for negative step ", step));
  absl::MutexLock lock(&mu_);
  auto may_proceed = [this, step]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return PullMayProceed(step); };
  if (!mu_.AwaitWithDeadline(absl::Condition(&may_proceed), deadline)) {
    return absl::DeadlineExceededError(DescribeWait(step));
  }
  if (closed_) {
    return absl::UnavailableError(absl::StrCat("shard ", options_.shard_id, " is shutting down"));
  }
  return PulledValues{values_, adam_.step()};
}

absl::StatusOr<PushOutcome> ParameterShard::Push(int worker_rank, int64_t step,
                                                 absl::Span<const float> gradient) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckWorker(worker_rank); !s.ok()) {
    ++counters_.rejected_pushes;
    return s;
  }
  if (step < 0) {
    ++counters_.rejected_pushes;
    return absl::InvalidArgumentError(absl::StrCat("push for negative step ", step));
  }
  if (gradient.size() != values_.size()) {
    ++counters_.rejected_pushes;
    return absl::InvalidArgumentError(absl::StrCat("shard ", options_.shard_id, " has ", values_.size(),
                                                   " parameters; the gradient has ", gradient.size()));
  }
  for (size_t i = 0; i < gradient.size(); ++i) {
    if (!std::isfinite(gradient[i])) {
      ++counters_.rejected_pushes;
      ++counters_.rejected_nonfinite;
      spdlog::warn("rejected push from worker {} for step {} on shard {}: gradient[{}] = {} ({} "
                   "non-finite pushes rejected so far)",
                   worker_rank, step, options_.shard_id, i, gradient[i], counters_.rejected_nonfinite);
      return absl::InvalidArgumentError(absl::StrCat("shard ", options_.shard_id, ": gradient[", i,
                                                     "] of worker ", worker_rank, " for step ", step,
                                                     " is ", gradient[i], "; only finite values are accepted"));
    }
  }
  if (options_.mode == TrainingMode::kSync) {
    if (step < adam_.step() || (step == adam_.step() && pending_received_[worker_rank])) {
      ++counters_.duplicate_pushes;
      return PushOutcome{true, adam_.step()};
    }
    if (step > adam_.step()) {
      ++counters_.rejected_pushes;
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", options_.shard_id, " is at step ", adam_.step(), "; the push of worker ",
          worker_rank, " for step ", step, " is ahead of it"));
    }
    return AcceptSyncPush(worker_rank, gradient);
  }
  if (step < pushed_steps_[worker_rank]) {
    ++counters_.duplicate_pushes;
    return PushOutcome{true, adam_.step()};
  }
  pushed_steps_[worker_rank] = step + 1;
  ++counters_.accepted_pushes;
  ApplyUpdate(gradient);
  return PushOutcome{false, adam_.step()};
}

PushOutcome ParameterShard::AcceptSyncPush(int worker_rank, absl::Span<const float> gradient) {
  pending_gradients_[worker_rank].assign(gradient.begin(), gradient.end());
  pending_received_[worker_rank] = true;
  ++pending_count_;
  ++counters_.accepted_pushes;
  if (pending_count_ < options_.num_workers) return PushOutcome{false, adam_.step()};
  // Every worker's gradient is in: their mean, summed in rank order, is one update.
  std::vector<float> mean(values_.size(), 0.0f);
  for (const std::vector<float>& g : pending_gradients_) {
    for (size_t i = 0; i < mean.size(); ++i) mean[i] += g[i];
  }
  const float scale = 1.0f / static_cast<float>(options_.num_workers);
  for (float& x : mean) x *= scale;
  ApplyUpdate(mean);
  std::fill(pending_received_.begin(), pending_received_.end(), false);
  pending_count_ = 0;
  return PushOutcome{false, adam_.step()};
}

void ParameterShard::ApplyUpdate(absl::Span<const float> gradient) {
  adam_.Apply(gradient, absl::MakeSpan(values_));
  counters_.applied_updates = adam_.step();
}

void ParameterShard::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

ShardCounters ParameterShard::counters() const {
  absl::MutexLock lock(&mu_);
  return counters_;
}

}  // namespace paramserver
