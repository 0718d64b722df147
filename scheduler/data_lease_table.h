// data.sharding: dynamic: which pieces of each epoch's examples are trained, leased or
// waiting for a worker (LeaseDataRequest in proto/scheduler.proto). Pure bookkeeping,
// no RPC and no clock: the registry feeds it workers' requests, fences and the servers'
// reports of how far each worker's pushes went, under its lock.
//
// The promise: every position of every epoch's order (up to the last full batch) is
// trained once. A live worker's request acknowledges its lease through the step it
// names. A fenced worker (declared dead, or left) cannot push any more once every live
// server serves the map that fenced it; the servers' reports then say through which step
// its pushes were applied (the highest any shard applied), and the rest of its lease is
// handed to the next worker that asks. Until then its rank gets no new lease, so a
// process that takes the slot cannot push steps the report would count.
#ifndef PARAMSERVER_SCHEDULER_DATA_LEASE_TABLE_H_
#define PARAMSERVER_SCHEDULER_DATA_LEASE_TABLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/scheduler.pb.h"

namespace paramserver {

// What one live server last reported: the map it serves and, per worker rank, the step
// after the last push of that rank any of its shards applied.
struct ServerPushReport {
  std::string server;
  int64_t serving_epoch = 0;
  std::vector<int64_t> worker_next_steps;
};

// Thread-compatible.
class DataLeaseTable {
 public:
  // `epochs` (training.epochs) passes over the data, leased `chunk_batches` batches at
  // a time, to ranks 0 .. workers - 1.
  DataLeaseTable(int epochs, int chunk_batches, int workers);

  // Worker `rank` (alive) asks for its next lease (LeaseDataRequest's contract).
  // INVALID_ARGUMENT for figures out of range (a set smaller than one batch, a negative
  // step); FAILED_PRECONDITION for a set or batch size other than the job's.
  absl::StatusOr<LeaseDataResponse> Lease(int rank, const LeaseDataRequest& request);

  // Worker `rank`'s process can push no more once servers serve map `fence_epoch`:
  // the rank and its lease wait for the servers' reports (Settle), whether it held a
  // lease or not (its next process must start past every step it pushed).
  void Fence(int rank, int64_t fence_epoch);

  // Settles every fenced rank for which every server in `live_servers` serves its
  // fence epoch or later: its lease is trained through the highest step they report for
  // it, the rest handed back, and its next lease starts past that step. Returns a line
  // per settled lease, for the log.
  std::vector<std::string> Settle(const std::vector<ServerPushReport>& live_servers);

  // Grows by one with every change of the table (what a saved state must follow).
  int64_t changes() const { return changes_; }

  // True once every epoch is trained (every worker is told LEASE_DONE).
  bool done() const;
  // True while a fenced lease waits for the servers' reports.
  bool settling() const;

  DataLeaseTableState Export() const { return state_; }
  // DATA_LOSS for a state this table cannot hold (pieces outside the set, overlapping,
  // not whole batches; another epoch count or worker rank).
  absl::Status Import(const DataLeaseTableState& state);

 private:
  int64_t usable_examples() const;  // the positions of an epoch in whole batches
  // Marks `trained` positions of piece `index` trained and hands the rest back (or
  // removes it when all are).
  void Acknowledge(int index, int64_t trained_batches);
  // The lowest piece waiting for a worker, or the next chunk past the frontier; -1 (and
  // nothing changed) when there is none.
  int TakeWaitingPiece();

  DataLeaseTableState state_;
  int64_t changes_ = 0;
};

}  // namespace paramserver

#endif  // PARAMSERVER_SCHEDULER_DATA_LEASE_TABLE_H_
