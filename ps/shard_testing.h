// Test helpers shared by the shard and replication tests (testonly).
#ifndef PARAMSERVER_PS_SHARD_TESTING_H_
#define PARAMSERVER_PS_SHARD_TESTING_H_

#include "catch2/catch.hpp"
#include "ps/parameter_shard.h"

namespace paramserver {

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
