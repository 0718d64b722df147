// What the worker daemon drives, whichever model it trains: a loop of steps it can
// start, watch and stop.
#ifndef PARAMSERVER_WORKER_TRAINING_LOOP_H_
#define PARAMSERVER_WORKER_TRAINING_LOOP_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "proto/scheduler.pb.h"

namespace paramserver {

struct TrainingSummary {
  int64_t steps = 0;      // the step reached
  int64_t steps_run = 0;  // the steps this run completed (fewer after a resume)
  int64_t samples = 0;
  double seconds = 0;
  double last_loss = 0;
  // Where the time went, summed over every step (recovery excluded): pulling the
  // parameters (waiting for other workers included), computing the gradient (batch
  // gathering and the backend), and pushing until every shard acknowledged.
  double pull_seconds = 0;
  double compute_seconds = 0;
  double push_seconds = 0;
  // Push buckets that left during backpropagation (training.push_bucket_kb).
  int64_t early_push_buckets = 0;
  // Each step's wall time, from the end of the one before (recovery included): the
  // median (within 2%) and the longest, with its step. What a map change (a shard
  // moving, a server lost) costs a step shows as the longest against the median.
  double median_step_seconds = 0;
  double longest_step_seconds = 0;
  int64_t longest_step = -1;
};

// Thread-safe: Run on one thread; progress() and Stop() from any other.
class TrainingLoop {
 public:
  virtual ~TrainingLoop() = default;
  // Runs every step from the start step; see each implementation for what it retries.
  // CANCELLED after Stop().
  virtual absl::StatusOr<TrainingSummary> Run() = 0;
  virtual NodeProgress progress() const = 0;
  virtual int64_t total_steps() const = 0;
  // Makes Run() return at the next step.
  virtual void Stop() = 0;
};

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_TRAINING_LOOP_H_
