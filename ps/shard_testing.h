// Test helpers shared by the shard and replication tests (testonly).
#ifndef PARAMSERVER_PS_SHARD_TESTING_H_
#define PARAMSERVER_PS_SHARD_TESTING_H_

#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "ps/parameter_shard.h"

namespace paramserver {

// Waits (30 s at most) until `backup` has applied every log entry it received: a backup
// acknowledges on receipt, and its appliers apply soon after.
inline void AwaitApplied(const ParameterShard& backup) {
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (backup.has_unapplied() && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
  CHECK_FALSE(backup.has_unapplied());
}

// A backup fed the primary's log (and nothing else) ends bit-identical to it: the same
// update count, values, optimizer state, table rows with their state, and log position.
inline void ExpectSameState(const ParameterShard& a, const ParameterShard& b) {
  const ShardState x = a.Snapshot();
  const ShardState y = b.Snapshot();
  CHECK(x.step == y.step);
  CHECK(x.skipped_steps == y.skipped_steps);
  CHECK(x.values == y.values);
  CHECK(x.optimizer == y.optimizer);
  CHECK(x.slots == y.slots);
  REQUIRE(x.tables.size() == y.tables.size());
  for (size_t t = 0; t < x.tables.size(); ++t) {
    CHECK(x.tables[t].ids == y.tables[t].ids);
    CHECK(x.tables[t].rows == y.tables[t].rows);
    CHECK(x.tables[t].state == y.tables[t].state);
  }
  CHECK(a.log_index() == b.log_index());
}

}  // namespace paramserver

#endif  // PARAMSERVER_PS_SHARD_TESTING_H_
