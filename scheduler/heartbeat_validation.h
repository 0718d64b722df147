// What the scheduler accepts in a heartbeat before it keeps or shows any of it: every
// figure finite and in its range, so that a node cannot put NaN, an accuracy of 42 or
// an infinite rate on the status page, in the metrics or in the job's result.
#ifndef PARAMSERVER_SCHEDULER_HEARTBEAT_VALIDATION_H_
#define PARAMSERVER_SCHEDULER_HEARTBEAT_VALIDATION_H_

#include "absl/status/status.h"
#include "proto/scheduler.pb.h"

namespace paramserver {

// Most shards one heartbeat may report, and the longest checkpoint error it may carry.
inline constexpr int kMaxHeartbeatShards = 1 << 16;
// worker_next_steps: at most one per worker rank, each 0 to 2^53.
inline constexpr int kMaxHeartbeatWorkers = 1 << 16;
inline constexpr int64_t kMaxHeartbeatStep = int64_t{1} << 53;
inline constexpr size_t kMaxCheckpointErrorBytes = 4096;

// OK if every numeric field of `heartbeat` is in range: rates, losses and byte counts
// finite and >= 0 (a loss may be any finite number: a script's may be negative),
// accuracy and AUC in [0, 1], steps, epochs and counts >= 0 (a checkpoint step and a
// failing-since step may also be -1: none), shard ids >= 0; at most kMaxHeartbeatShards
// shards, and a checkpoint error or map conflict of at most kMaxCheckpointErrorBytes. Otherwise
// INVALID_ARGUMENT naming the first bad field and its value, e.g.
// "heartbeat from worker-1: progress.loss is nan (must be finite)". Pure.
absl::Status ValidateHeartbeat(const HeartbeatRequest& heartbeat);

}  // namespace paramserver

#endif  // PARAMSERVER_SCHEDULER_HEARTBEAT_VALIDATION_H_
