// data.sharding: dynamic, the worker's side: asks the scheduler for the next lease of
// the training set (LeaseDataRequest in proto/scheduler.proto) and turns it into the
// example indices of its batches. The built-in models' StepLoop and a torch script's
// job.batches() both use it.
#ifndef PARAMSERVER_WORKER_DATA_LEASER_H_
#define PARAMSERVER_WORKER_DATA_LEASER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/scheduler.pb.h"

namespace paramserver {

// The scheduler's LeaseData call, the node name filled in (SchedulerClient::LeaseData).
using LeaseDataCall = std::function<absl::StatusOr<LeaseDataResponse>(const LeaseDataRequest&)>;

// One lease's batches: examples[k * batch_size, (k + 1) * batch_size) is the batch
// trained at step lease.first_step() + k.
struct LeasedChunk {
  DataLease lease;
  std::vector<int64_t> examples;  // indices into the training set
  int64_t batches = 0;
};

// Thread-compatible: one training thread calls Next.
class DataLeaser {
 public:
  // `example_count` examples in batches of `batch_size`; each epoch's order as
  // EpochExampleOrder(all examples, epoch, seed, shuffle) gives it.
  DataLeaser(LeaseDataCall call, int64_t example_count, int batch_size, uint64_t seed,
             bool shuffle);

  // The next lease, for a worker whose every step before `next_step` every shard has
  // acknowledged; nullopt once every epoch is trained. Waits while the scheduler says
  // to (LEASE_WAIT), logging what for every few seconds; a scheduler that does not
  // answer is retried until `unavailable_timeout` has passed without an answer.
  // CANCELLED once *stop is set; the scheduler's refusals as they come.
  absl::StatusOr<std::optional<LeasedChunk>> Next(int64_t next_step, const std::atomic<bool>* stop,
                                                  absl::Duration unavailable_timeout);

 private:
  // The order of `epoch`, computed once per epoch (leases mostly come in epoch order).
  const std::vector<int64_t>& OrderOf(int epoch);

  const LeaseDataCall call_;
  const int64_t example_count_;
  const int batch_size_;
  const uint64_t seed_;
  const bool shuffle_;
  int order_epoch_ = -1;
  std::vector<int64_t> order_;
  uint64_t last_lease_id_ = 0;  // the lease each request acknowledges (0: none yet)
};

// Test-only witnesses (the exactly-once tests): with PS_TEST_TRAINED_IDS_LOG set, each
// batch whose push every shard acknowledged is appended to that file as one line,
// "epoch id id ...", in one write; with PS_TEST_STOP_AFTER_BATCHES=n as well, the
// process stops itself (SIGSTOP) right after the n-th line, for a test to kill -9 it
// at a known point mid-lease. Unset (every real run): nothing is written.
void NoteTrainedBatch(int epoch, const int64_t* examples, int64_t count);

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_DATA_LEASER_H_
