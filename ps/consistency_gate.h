// A shard's consistency rule (training.mode): which pushes are new, which repeat one
// already taken, and when a pull may see the values.
//  - sync: step t is one update with the mean of every active worker's step-t gradient
//    (with backup workers k, of the first max(1, active - k) to arrive; a later push of
//    step t is late: dropped); a pull for step t waits until t updates were applied.
//  - async: every push is one update as it arrives; pulls never wait.
//  - ssp: as async, but a pull for step s waits until every active worker pushed at
//    least s - staleness steps.
#ifndef PARAMSERVER_PS_CONSISTENCY_GATE_H_
#define PARAMSERVER_PS_CONSISTENCY_GATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/cluster_spec.h"

namespace paramserver {

// Thread-compatible: the shard's lock guards it. `applied_updates` arguments are the
// shard's update count (in sync mode, the step it collects pushes for).
class ConsistencyGate {
 public:
  // How far past a worker's next step an async/ssp push may be (a gap is pushes lost to
  // a shard restored from an older checkpoint).
  static constexpr int64_t kMaxAsyncStepLead = int64_t{1} << 20;

  // Every worker active, none pushed. `applied_updates`: of a shard resumed from a
  // checkpoint, whose async/ssp workers have each pushed about applied_updates /
  // num_workers steps (sync: each every step before it). `backup_workers`: sync only
  // (training.sync.backup_workers). REQUIRES: num_workers >= 1, backup_workers >= 0.
  ConsistencyGate(int shard_id, TrainingMode mode, int num_workers, int staleness,
                  int64_t applied_updates, int backup_workers = 0);

  TrainingMode mode() const { return mode_; }
  int num_workers() const { return num_workers_; }

  // INVALID_ARGUMENT for a rank outside 0..num_workers-1.
  absl::Status CheckWorker(int worker_rank) const;
  // FAILED_PRECONDITION for an inactive worker, INVALID_ARGUMENT for a negative step.
  // REQUIRES: CheckWorker(worker_rank) ok.
  absl::Status CheckMayPush(int worker_rank, int64_t step) const;

  // kLate: sync, a push of a step that completed without it (with backup workers; it
  // changes nothing, as a repeat does).
  enum class Verdict { kNew, kRepeat, kLate };
  // Whether worker_rank's push for `step` is new, repeats one taken, or is late (neither
  // changes anything).
  // FAILED_PRECONDITION for a sync push ahead of the shard's step; INVALID_ARGUMENT for an
  // async/ssp step kMaxAsyncStepLead or more past the worker's next one.
  // REQUIRES: CheckMayPush ok.
  absl::StatusOr<Verdict> Judge(int worker_rank, int64_t step, int64_t applied_updates) const;
  // Takes a push judged kNew: sync, the rank's gradient for the step is in; async/ssp,
  // the rank's next step is step + 1.
  void Take(int worker_rank, int64_t step);

  // Sync: the ranks whose pushes make the step being collected, ascending: every active
  // rank once each has pushed it (with backup workers k: the active ranks that pushed
  // it, once they are at least max(1, active - k)); empty while more are needed (or
  // none is active).
  std::vector<int> CompleteStepContributors() const;
  // Sync: the step is applied; collect the next.
  void EndStep();
  // Sync: whether some worker's gradient for the step being collected is in.
  bool AnyPending() const;
  bool received(int worker_rank) const { return received_[worker_rank]; }

  // Whether a pull for `step` may see the values now.
  bool PullMayProceed(int64_t step, int64_t applied_updates) const;
  // Which workers a pull for `step` waits for, and for what ("shard 3 is at step 5 and a
  // pull for step 6 waits for the step-5 pushes of workers [1]").
  std::string DescribeWait(int64_t step, int64_t applied_updates) const;
  // Where `worker_rank` starts: sync, the shard's step; async/ssp, the slowest active
  // worker's next step, counting the rank's own (a worker taking a dead one's rank
  // goes on where it left off).
  int64_t StartStep(int worker_rank, int64_t applied_updates) const;

  // Sync, a replica applying its primary's steps (whose entries name no pushes): every
  // rank counts as having pushed each step before `applied_updates`, so that after a
  // promotion a repeated push is not taken for a late one.
  void AssumePushedBefore(int64_t applied_updates);

  // The workers whose pushes count. An inactive worker's pending sync gradient is
  // dropped. REQUIRES: active.size() == num_workers.
  void SetActive(std::vector<bool> active);

  // The per-worker state, for a replica, and restoring it. REQUIRES (Restore): each
  // vector has num_workers entries.
  const std::vector<bool>& active() const { return active_; }
  const std::vector<int64_t>& pushed_steps() const { return pushed_steps_; }
  const std::vector<bool>& received() const { return received_; }
  void Restore(std::vector<bool> active, std::vector<int64_t> pushed_steps,
               std::vector<bool> received);

 private:
  const int shard_id_;
  const TrainingMode mode_;
  const int num_workers_;
  const int staleness_;
  const int backup_workers_;
  std::vector<bool> active_;
  // async/ssp: each worker's next step (the steps it pushed). sync: the step after the
  // last one whose push of the worker was taken (or that it is assumed to have pushed):
  // a push of an earlier step repeats one, of a later completed step is late.
  std::vector<int64_t> pushed_steps_;
  // sync: whose gradient for the step being collected is in.
  std::vector<bool> received_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_PS_CONSISTENCY_GATE_H_
