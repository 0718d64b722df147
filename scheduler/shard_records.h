// What the primaries report of their shards (update counts, newest checkpoint step,
// embedding figures), and what follows from it: the checkpoints every shard must keep,
// and a step a checkpoint can be scheduled at.
#ifndef PARAMSERVER_SCHEDULER_SHARD_RECORDS_H_
#define PARAMSERVER_SCHEDULER_SHARD_RECORDS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "absl/time/time.h"
#include "proto/scheduler.pb.h"
#include "scheduler/recovery_planner.h"

namespace paramserver {

// Thread-compatible: the registry's lock guards it.
class ShardRecords {
 public:
  // `async_tables` (training.embedding_mode async): the embedding shards' update counts
  // are pushes, not steps: StepAfter reads the dense shards alone.
  explicit ShardRecords(bool async_tables = false) : async_tables_(async_tables) {}

  // Server `server`'s heartbeat reports `request.shards()` of `map` (which it serves):
  // only shards the map gives it as primary are recorded (a report of any other id is
  // neither recorded nor allocated for).
  void Record(const std::string& server, const HeartbeatRequest& request, const ShardMap& map,
              absl::Time now);

  // The oldest checkpoint step any shard still needs (the newest step every shard has
  // checkpointed), which servers may delete checkpoints before; -1 while some shard of
  // `map` has reported none.
  int64_t RetainFrom(const ShardMap& map) const;
  // A step every shard reaches about `lead` after `now` but has not yet, from the
  // reported update counts and their rate since the first report.
  int64_t StepAfter(absl::Time now, absl::Duration lead) const;

  const std::map<int, ShardRecord>& records() const { return records_; }

 private:
  const bool async_tables_;
  std::map<int, ShardRecord> records_;  // by shard id
  std::set<int> counting_pushes_;       // hybrid tables' ids: not in StepAfter
  // The first report, to estimate the update rate.
  std::optional<std::pair<absl::Time, int64_t>> first_report_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_SCHEDULER_SHARD_RECORDS_H_
