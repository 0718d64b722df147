// What a parameter server does when a new shard map arrives, decided by a pure function
// (no I/O, no gRPC, no locks) that tests drive directly; ShardHost::ApplyShardMap
// carries the plan out. Dense ranges and embedding shards (one hash
// bucket of every table) are planned alike; a shard's identity is its range, or its
// bucket of how many.
#ifndef PARAMSERVER_PS_SHARD_MAP_INSTALL_PLAN_H_
#define PARAMSERVER_PS_SHARD_MAP_INSTALL_PLAN_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/wire/shard_layout.h"
#include "proto/scheduler.pb.h"

namespace paramserver {

// What the server holds of one shard before the map: all the planner needs to know.
struct HeldShard {
  ParameterRange range;
  bool primary = true;
  std::string primary_name;     // the primary whose log a backup follows
  bool has_replicator = false;  // a primary with backups
  // An embedding shard's bucket of how many (-1, 0 for a dense range).
  int embedding_bucket = -1;
  int embedding_buckets = 0;
};

// Where a shard this server is primary of under the new map comes from.
enum class ShardSource {
  kKeepHeld,        // the shard object it holds (as primary or as a promoted backup)
  kInitialValues,   // fresh, from the model's initial values (and a step-0 checkpoint)
  kRestoreAtStep,   // from the checkpoints of the assignment's restore_step
  kRestoreNewest,   // from its newest checkpoint (a restarted job)
  kRestoreHandoff,  // from the checkpoint its previous owner writes at this epoch
};

// What becomes of a shard held before the map.
enum class HeldShardFate {
  kKeep,     // served on, as the same object (the plan keeps it as primary or backup)
  kHandOff,  // a primary moved to another server: close, write a handoff checkpoint
  kClose,    // replaced or dropped: close
};

struct ShardInstallPlan {
  struct Primary {
    const ShardAssignment* assignment = nullptr;  // points into the planned map
    ShardSource source = ShardSource::kInitialValues;
    // With backups: keep the held replicator (the same shard object went on being
    // primary), or make a new one. Without backups: no replicator.
    bool keep_replicator = false;
  };
  int64_t epoch = 0;
  std::vector<Primary> primaries;                       // by shard id
  std::vector<int> kept_backups;                        // follow the same primary's log, unchanged
  std::vector<const ShardAssignment*> backups_to_copy;  // copy the state from their primary
  // Primaries handed to one of their backups, this server their backup now: hand over
  // (close it to calls, wait until the new primary has received its every log entry),
  // then follow the new primary's log as the same object; copy it if that fails.
  std::vector<const ShardAssignment*> handovers;
  std::map<int, HeldShardFate> held;     // every held shard's fate
  std::vector<int> retired_replicators;  // held replicators to close, by shard id
};

struct ShardInstallContext {
  std::string node_name;             // this server
  int64_t total_parameters = 0;      // of the model: assigned ranges must lie inside
  int embedding_tables = 0;          // of the model: none, and embedding shards are refused
  bool checkpoints_enabled = false;  // checkpoint.dir is set
  // This server serves no map yet but was a member before (it was declared dead and
  // rejoined): it may take on only shards restored from checkpoints.
  bool rejoining = false;
};

// The plan for installing `map` on the server described by `context`, holding `held`
// (by shard id). FAILED_PRECONDITION naming the shard when the map cannot be served here:
// embedding rows for a model without tables, a range or bucket outside the model, a
// restore without checkpoint.dir, or a fresh shard given to a rejoining server.
absl::StatusOr<ShardInstallPlan> PlanShardMapInstall(const std::map<int, HeldShard>& held,
                                                     const ShardMap& map,
                                                     const ShardInstallContext& context);

}  // namespace paramserver

#endif  // PARAMSERVER_PS_SHARD_MAP_INSTALL_PLAN_H_
