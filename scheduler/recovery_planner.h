// How the shard map changes when a server joins, dies or is drained: pure functions of
// the next map (epoch already advanced) and the facts the registry holds, beside
// PlaceShards and RemoveServer, so that tests need neither a registry nor gRPC. The
// registry carries a plan out (ClusterRegistry::Publish). A new kind of shard (row-keyed
// embedding shards) gets its placement rules here.
#ifndef PARAMSERVER_SCHEDULER_RECOVERY_PLANNER_H_
#define PARAMSERVER_SCHEDULER_RECOVERY_PLANNER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/config/cluster_spec.h"
#include "proto/scheduler.pb.h"
#include "scheduler/shard_placement.h"

namespace paramserver {

// What the servers last reported of one shard.
struct ShardRecord {
  int64_t applied_updates = 0;
  int64_t checkpoint_step = -1;
  int64_t skipped_steps = 0;      // as its primary reported them
  int64_t late_pushes = 0;        // as its primary reported them
  EmbeddingShardStats embedding;  // an embedding shard's, as its primary reported them
};

// A map to publish, the servers that must install it before the others (they hand shards
// off), and one line for the log.
struct PlannedMapChange {
  ShardMap map;
  std::vector<std::string> losing_servers;
  std::string summary;
};

// The job's facts a recovery plan depends on.
struct RecoveryContext {
  TrainingMode mode = TrainingMode::kSync;
  // training.embedding_mode async (with mode sync): the embedding shards are async ones,
  // each restoring its own newest checkpoint, while the dense shards roll back together.
  bool async_tables = false;
  int replication = 1;       // copies of each shard wanted (primary included)
  bool checkpoints = false;  // checkpoint.dir is set
  // The sync rollback target: the newest step every sync shard has checkpointed (-1:
  // none).
  int64_t rollback_step = -1;
  const std::map<int, ShardRecord>* shards = nullptr;  // by shard id; may be null
  // (server, shard) backups still copying the shard (their server serves the map and
  // has not reported the copy done): never promoted. May be null.
  const std::set<std::pair<std::string, int>>* copying = nullptr;
  // Live servers not heard from lately (RemoveServer's `failing`): passed over where
  // another server can take a role. May be null.
  const std::set<std::string>* failing = nullptr;
};

// Whether some shard's primary is not among `live` (every server had died, and the
// shards wait on a dead slot for a server to join).
bool HasDeadPrimary(const ShardMap& map, const std::vector<ServerEndpoint>& live);

// Server `joined` (re)joined; `live` are the live servers, `joined` among them.
// Replicated (replication >= 2): it becomes a backup, topping up shards short of copies
// and taking its fair share of backup roles (primaries stay). Otherwise shards move to it
// through handoff checkpoints until it holds its fair share of primaries; their old
// servers are the losing servers (context.replication decides which). Either way, shards
// whose primary is not live (every server had died, and no one took them) go to it and
// restore from disk: in sync mode with a rollback step, every shard restores that step
// and the workers rewind to it (one consistent model, as after a loss; no handoffs, no
// losing servers); otherwise each restores its newest checkpoint.
PlannedMapChange PlanServerJoin(ShardMap next, const ServerEndpoint& joined,
                                const std::vector<ServerEndpoint>& live,
                                const RecoveryContext& context);

// Server `dead` is gone; `live` are the others. See ClusterRegistry::DeclareDead for the
// rules. DATA_LOSS when a shard is left with no copy and checkpoint.dir is not set (also
// when no server is left): nothing can bring its state back. FAILED_PRECONDITION when no
// server is left (one may yet join and restore the checkpoints), or in sync mode no
// complete rollback step was found (one that (re)joins reads it again).
absl::StatusOr<PlannedMapChange> PlanServerLoss(ShardMap next, const std::string& dead,
                                                const std::vector<ServerEndpoint>& live,
                                                const RecoveryContext& context);

// Server `drained` leaves with no loss: like a loss, but shards with no backup move
// through handoff checkpoints it writes (it is the losing server). FAILED_PRECONDITION for
// the last server, or for shards without a backup when there are no checkpoints.
absl::StatusOr<PlannedMapChange> PlanDrain(ShardMap next, const std::string& drained,
                                           const std::vector<ServerEndpoint>& live,
                                           const RecoveryContext& context);

// Replicated jobs (replication >= 2), once a server has joined as a backup: moves
// primaries to servers with fewer, each by swapping a shard's primary with one of its
// backups (the backup becomes the primary, the primary its backup), until no live
// server holds two more primaries of a kind (dense ranges, embedding buckets) than
// another. A backup is promoted only if `ready_backups` lists the shard for it (it
// reported the copy done and follows the primary's log at the map's epoch), so no
// acknowledged update is lost and none is applied twice: a swap is a promotion with
// the old primary alive and fenced. The old primaries are the losing servers: each
// installs the map first, handing its shards over (its last log entries applied on the
// new primary, it follows the new primary's log without a copy). Each shard moves at
// most once per plan. nullopt when nothing is to move.
std::optional<PlannedMapChange> PlanPrimaryBalance(
    ShardMap next, const std::vector<ServerEndpoint>& live,
    const std::map<std::string, std::set<int>>& ready_backups);

}  // namespace paramserver

#endif  // PARAMSERVER_SCHEDULER_RECOVERY_PLANNER_H_
