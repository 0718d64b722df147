// A training loop's record of its completed steps: the summary, the progress the
// heartbeats carry, the periodic log line and the curves (loss, samples/s). Shared by
// the mlp and the ctr training loops.
#ifndef PARAMSERVER_WORKER_STEP_RECORDER_H_
#define PARAMSERVER_WORKER_STEP_RECORDER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/scheduler.pb.h"
#include "worker/training_loop.h"

namespace paramserver {

// (tag, step, value): a point of a training curve.
using ScalarSink = std::function<void(const std::string& tag, int64_t step, double value)>;

// Thread-safe: Record and Update on the training thread, progress() from any.
class StepRecorder {
 public:
  // `on_scalar` (may be empty) receives "loss" (the mean since the last log line) and
  // "samples_per_sec" at each log line: every `log_interval`, and at the last step.
  StepRecorder(int64_t start_step, int64_t total_steps, int batch_size, absl::Duration log_interval,
               ScalarSink on_scalar);

  // Step `step` of `epoch` completed with `loss` over `samples` examples (-1: a full
  // batch); `start` is when training began. `timed`: the step's time counts toward the
  // summary's median and longest step (not the first step run, which connects, nor one
  // after an epoch's evaluation, which it includes). Returns the step's time: since the
  // last step's end (or `start`).
  absl::Duration Record(int64_t step, int epoch, float loss, absl::Time start,
                        TrainingSummary* summary, int64_t samples = -1, bool timed = true)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Changes the progress under its lock (an evaluation's figures).
  void Update(const std::function<void(NodeProgress*)>& change) ABSL_LOCKS_EXCLUDED(mu_);
  NodeProgress progress() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const int64_t total_steps_;
  const int batch_size_;
  const absl::Duration log_interval_;
  const ScalarSink on_scalar_;
  // Step times on a log scale (bucket k: [1us x 1.02^k, 1us x 1.02^(k+1))), for the
  // median, and the last step's end.
  std::vector<int64_t> step_time_buckets_;
  int64_t timed_steps_ = 0;
  absl::Time last_step_end_ = absl::InfinitePast();
  absl::Time last_log_ = absl::InfinitePast();
  int64_t steps_since_log_ = 0;
  double loss_since_log_ = 0;
  mutable absl::Mutex mu_;
  NodeProgress progress_ ABSL_GUARDED_BY(mu_);
};

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_STEP_RECORDER_H_
