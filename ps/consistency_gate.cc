#include "ps/consistency_gate.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace paramserver {

ConsistencyGate::ConsistencyGate(int shard_id, TrainingMode mode, int num_workers, int staleness,
                                 int64_t applied_updates, int backup_workers)
    : shard_id_(shard_id),
      mode_(mode),
      num_workers_(num_workers),
      staleness_(staleness),
      backup_workers_(backup_workers),
      active_(num_workers, true),
      // In async/ssp mode every push of every worker is one update: after `step` updates
      // each of the W workers has pushed about step / W steps. In sync mode each pushed
      // every step before.
      pushed_steps_(num_workers,
                    mode == TrainingMode::kSync ? applied_updates : applied_updates / num_workers),
      received_(num_workers, false) {}

absl::Status ConsistencyGate::CheckWorker(int worker_rank) const {
  if (worker_rank < 0 || worker_rank >= num_workers_) {
    return absl::InvalidArgumentError(absl::StrCat("unknown worker rank ", worker_rank,
                                                   ": the cluster has ", num_workers_,
                                                   " workers (ranks 0..", num_workers_ - 1, ")"));
  }
  return absl::OkStatus();
}

absl::Status ConsistencyGate::CheckMayPush(int worker_rank, int64_t step) const {
  if (!active_[worker_rank]) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", worker_rank,
                                                      " was declared dead for shard ", shard_id_,
                                                      "; refresh the shard map"));
  }
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("push for negative step ", step));
  return absl::OkStatus();
}

absl::StatusOr<ConsistencyGate::Verdict> ConsistencyGate::Judge(int worker_rank, int64_t step,
                                                                int64_t applied_updates) const {
  if (mode_ == TrainingMode::kSync) {
    if (step < applied_updates) {
      // Without backup workers every step waits for every active worker: a push of an
      // applied step repeats one taken, or is of a rank inactive then (a repeat, as ever).
      return backup_workers_ == 0 || step < pushed_steps_[worker_rank] ? Verdict::kRepeat
                                                                       : Verdict::kLate;
    }
    if (step == applied_updates && received_[worker_rank]) return Verdict::kRepeat;
    if (step > applied_updates) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", shard_id_, " is at step ", applied_updates, "; the push of worker ",
          worker_rank, " for step ", step, " is ahead of it"));
    }
    return Verdict::kNew;
  }
  if (step < pushed_steps_[worker_rank]) return Verdict::kRepeat;
  if (step - pushed_steps_[worker_rank] >= kMaxAsyncStepLead) {
    // A worker moves on one step at a time (a gap is a push lost to a restore): a step
    // this far ahead would make its next real pushes duplicates, or overflow.
    return absl::InvalidArgumentError(
        absl::StrCat("push of worker ", worker_rank, " for step ", step, " on shard ", shard_id_,
                     ": its next step is ", pushed_steps_[worker_rank], ", and at most ",
                     kMaxAsyncStepLead, " steps ahead are accepted"));
  }
  return Verdict::kNew;
}

void ConsistencyGate::Take(int worker_rank, int64_t step) {
  if (mode_ == TrainingMode::kSync) received_[worker_rank] = true;
  pushed_steps_[worker_rank] = step + 1;
}

std::vector<int> ConsistencyGate::CompleteStepContributors() const {
  std::vector<int> contributors;
  int active = 0;
  for (int r = 0; r < num_workers_; ++r) {
    if (!active_[r]) continue;
    ++active;
    if (received_[r]) {
      contributors.push_back(r);
    } else if (backup_workers_ == 0) {
      return {};
    }
  }
  const int needed = std::max(1, active - backup_workers_);
  if (static_cast<int>(contributors.size()) < needed) return {};
  return contributors;
}

void ConsistencyGate::EndStep() { std::fill(received_.begin(), received_.end(), false); }

bool ConsistencyGate::AnyPending() const {
  return std::any_of(received_.begin(), received_.end(), [](bool b) { return b; });
}

bool ConsistencyGate::PullMayProceed(int64_t step, int64_t applied_updates) const {
  switch (mode_) {
    case TrainingMode::kSync:
      return applied_updates >= step;
    case TrainingMode::kSsp: {
      int64_t slowest = step;
      for (int r = 0; r < num_workers_; ++r) {
        if (active_[r]) slowest = std::min(slowest, pushed_steps_[r]);
      }
      return slowest >= step - staleness_;
    }
    case TrainingMode::kAsync:
      return true;
  }
  return true;
}

std::string ConsistencyGate::DescribeWait(int64_t step, int64_t applied_updates) const {
  std::vector<int> missing;
  if (mode_ == TrainingMode::kSync) {
    for (int r = 0; r < num_workers_; ++r) {
      if (active_[r] && !received_[r]) missing.push_back(r);
    }
    int active = 0;
    for (int r = 0; r < num_workers_; ++r) active += active_[r] ? 1 : 0;
    const int more =
        std::max(1, active - backup_workers_) - (active - static_cast<int>(missing.size()));
    return absl::StrCat("shard ", shard_id_, " is at step ", applied_updates,
                        " and a pull for step ", step, " waits for the step-", applied_updates,
                        " pushes of ",
                        backup_workers_ > 0 ? absl::StrCat(std::max(more, 0), " more of ") : "",
                        "workers [", absl::StrJoin(missing, ", "), "]");
  }
  const int64_t needed = step - staleness_;
  for (int r = 0; r < num_workers_; ++r) {
    if (active_[r] && pushed_steps_[r] < needed) missing.push_back(r);
  }
  return absl::StrCat("shard ", shard_id_, ": a pull for step ", step, " (staleness ", staleness_,
                      ") waits for workers [", absl::StrJoin(missing, ", "), "] to push step ",
                      needed - 1);
}

int64_t ConsistencyGate::StartStep(int worker_rank, int64_t applied_updates) const {
  if (mode_ == TrainingMode::kSync) return applied_updates;
  int64_t start_step = pushed_steps_[worker_rank];
  for (int r = 0; r < num_workers_; ++r) {
    if (active_[r]) start_step = std::min(start_step, pushed_steps_[r]);
  }
  return start_step;
}

void ConsistencyGate::AssumePushedBefore(int64_t applied_updates) {
  for (int64_t& next : pushed_steps_) next = std::max(next, applied_updates);
}

void ConsistencyGate::SetActive(std::vector<bool> active) {
  active_ = std::move(active);
  for (int r = 0; r < num_workers_; ++r) {
    // A rejoining worker's old gradient for the step must not count.
    if (!active_[r]) received_[r] = false;
  }
}

void ConsistencyGate::Restore(std::vector<bool> active, std::vector<int64_t> pushed_steps,
                              std::vector<bool> received) {
  active_ = std::move(active);
  pushed_steps_ = std::move(pushed_steps);
  received_ = std::move(received);
}

}  // namespace paramserver
