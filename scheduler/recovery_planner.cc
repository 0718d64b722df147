#include "scheduler/recovery_planner.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace paramserver {
namespace {

bool Contains(const std::vector<int>& ids, int id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// The set a RecoveryContext points at, or an empty one where it points at none.
template <typename Set>
const Set& OrNone(const Set* set) {
  static const Set kNone;
  return set != nullptr ? *set : kNone;
}

// Whether `shard` takes each push as it comes (async, ssp, a hybrid job's tables) rather
// than in sync steps: on its own, it restores its newest checkpoint and the rest go on.
bool TrainsAlone(const RecoveryContext& context, const ShardAssignment& shard) {
  return context.mode != TrainingMode::kSync ||
         (context.async_tables && shard.kind() == SHARD_KIND_EMBEDDING_ROWS);
}

// Whether one of `ids` is a sync shard, whose loss rolls every sync shard back.
bool AnySyncShard(const ShardMap& map, const std::vector<int>& ids,
                  const RecoveryContext& context) {
  return std::any_of(map.shards().begin(), map.shards().end(), [&](const ShardAssignment& shard) {
    return Contains(ids, shard.shard_id()) && !TrainsAlone(context, shard);
  });
}

// Every sync shard restores the rollback step and the workers rewind to it; the shards
// training alone keep their state (those restoring keep their restore).
void RollBackSyncShards(ShardMap* map, const RecoveryContext& context) {
  for (ShardAssignment& assignment : *map->mutable_shards()) {
    if (TrainsAlone(context, assignment)) continue;
    assignment.set_restore(SHARD_RESTORE_AT_STEP);
    assignment.set_restore_step(context.rollback_step);
  }
  map->set_rewind_epoch(map->epoch());
  map->set_rewind_step(context.rollback_step);
}

bool IsLive(const std::vector<ServerEndpoint>& live, const std::string& name) {
  return std::any_of(live.begin(), live.end(),
                     [&](const ServerEndpoint& server) { return server.name == name; });
}

// Where shards go when `joined` (re)joins (PlanServerJoin, before any rollback).
PlannedMapChange PlanServerJoinPlacement(ShardMap map, const ServerEndpoint& joined,
                                         const std::vector<ServerEndpoint>& live,
                                         const RecoveryContext& context) {
  const int replication = context.replication;
  if (replication >= 2) {
    // Replicated: the joined server copies shards as a backup (no checkpoint needed);
    // primaries stay where they are.
    std::vector<int> copied = TopUpBackups(&map, live, replication);
    for (int id : GiveBackupsTo(&map, joined.name, live)) copied.push_back(id);
    for (ShardAssignment& assignment : *map.mutable_shards()) {
      // Left on this slot when no server was alive to take it: its newest checkpoint.
      if (assignment.server_name() == joined.name) assignment.set_restore(SHARD_RESTORE_NEWEST);
    }
    std::string summary =
        absl::StrCat(joined.name, " (re)joined at ", joined.address, "; it backs up shards [",
                     absl::StrJoin(copied, ", "), "], copied from their primaries");
    return {std::move(map), {}, std::move(summary)};
  }
  std::map<std::string, std::vector<ShardAssignment*>> held;
  for (const ServerEndpoint& server : live) held[server.name];
  std::vector<int> taken_over;
  for (ShardAssignment& assignment : *map.mutable_shards()) {
    if (assignment.server_name() == joined.name) {
      // Left on this slot when no server was alive to take it: its newest checkpoint.
      assignment.set_restore(SHARD_RESTORE_NEWEST);
      taken_over.push_back(assignment.shard_id());
    }
    held[assignment.server_name()].push_back(&assignment);
  }
  const size_t fair = map.shards_size() / held.size();
  std::vector<std::string> losing;
  std::vector<int> moved;
  while (held[joined.name].size() < fair) {
    auto donor = std::max_element(held.begin(), held.end(), [](const auto& a, const auto& b) {
      return a.second.size() < b.second.size() ||
             (a.second.size() == b.second.size() && a.first > b.first);
    });
    ShardAssignment* assignment = donor->second.back();
    donor->second.pop_back();
    if (std::find(losing.begin(), losing.end(), donor->first) == losing.end())
      losing.push_back(donor->first);
    assignment->set_server_name(joined.name);
    assignment->set_restore(SHARD_RESTORE_HANDOFF);
    held[joined.name].push_back(assignment);
    moved.push_back(assignment->shard_id());
  }
  std::string summary = absl::StrCat(
      joined.name, " (re)joined at ", joined.address, "; shards [", absl::StrJoin(moved, ", "),
      "] move to it with their optimizer state",
      taken_over.empty() ? ""
                         : absl::StrCat("; it restores [", absl::StrJoin(taken_over, ", "), "]"));
  return {std::move(map), std::move(losing), std::move(summary)};
}

// In sync mode, when `left` shards (whose primary had died with no live server to take
// them) restore from disk and one is a sync shard: every sync shard restores the common
// rollback step instead of its own newest checkpoint, and the workers rewind to it, as
// after a loss (PlanServerLoss). A hybrid job's left tables restore their newest. No
// sync shard moves by handoff then; only a hybrid job's tables may, whose donors still
// install the map first.
void MaybeRollBackEveryShard(PlannedMapChange* planned, const std::vector<int>& left,
                             const RecoveryContext& context) {
  if (left.empty() || context.mode != TrainingMode::kSync || context.rollback_step < 0 ||
      !AnySyncShard(planned->map, left, context)) {
    return;
  }
  RollBackSyncShards(&planned->map, context);
  // A hybrid job's table moved by a handoff still needs its donor to install first.
  const bool handoffs = std::any_of(
      planned->map.shards().begin(), planned->map.shards().end(),
      [](const ShardAssignment& shard) { return shard.restore() == SHARD_RESTORE_HANDOFF; });
  if (!handoffs) planned->losing_servers.clear();
  absl::StrAppend(&planned->summary, "; shards [", absl::StrJoin(left, ", "),
                  "] had no live copy: every ", context.async_tables ? "dense " : "",
                  "shard rolls back to its checkpoint at step ", context.rollback_step,
                  " and the workers rewind");
}

}  // namespace

bool HasDeadPrimary(const ShardMap& map, const std::vector<ServerEndpoint>& live) {
  return std::any_of(map.shards().begin(), map.shards().end(), [&](const ShardAssignment& shard) {
    return !IsLive(live, shard.server_name());
  });
}

PlannedMapChange PlanServerJoin(ShardMap map, const ServerEndpoint& joined,
                                const std::vector<ServerEndpoint>& live,
                                const RecoveryContext& context) {
  // Shards left on a dead server's slot (every server had died) go to the joined one,
  // from disk, whichever slot it took (without checkpoints only its own slot's).
  std::vector<int> left;
  for (ShardAssignment& assignment : *map.mutable_shards()) {
    const bool dead_slot = !IsLive(live, assignment.server_name());
    if (assignment.server_name() != joined.name && !(dead_slot && context.checkpoints)) continue;
    assignment.set_server_name(joined.name);
    google::protobuf::RepeatedPtrField<ShardReplica>* backups = assignment.mutable_backups();
    backups->erase(std::remove_if(backups->begin(), backups->end(),
                                  [&](const ShardReplica& backup) {
                                    return backup.server_name() == joined.name ||
                                           !IsLive(live, backup.server_name());
                                  }),
                   backups->end());
    left.push_back(assignment.shard_id());
  }
  PlannedMapChange planned = PlanServerJoinPlacement(std::move(map), joined, live, context);
  MaybeRollBackEveryShard(&planned, left, context);
  return planned;
}

absl::StatusOr<PlannedMapChange> PlanServerLoss(ShardMap map, const std::string& dead,
                                                const std::vector<ServerEndpoint>& live,
                                                const RecoveryContext& context) {
  if (live.empty()) {
    if (!context.checkpoints) {
      // Every copy of every shard is gone, and no checkpoint can bring one back.
      return absl::DataLossError(absl::StrCat("no server is left to take the shards of ", dead,
                                              ", and they cannot be restored: checkpoint.dir "
                                              "is not set (it would have kept them)"));
    }
    return absl::FailedPreconditionError(absl::StrCat("no server is left to take the shards of ",
                                                      dead, "; waiting for a server to register"));
  }
  const ServerRemoval removal = RemoveServer(&map, dead, live, context.replication,
                                             OrNone(context.copying), OrNone(context.failing));
  std::string summary = absl::StrCat(dead, " lost; ", removal.summary);
  if (removal.orphaned.empty()) {
    // Every shard still has a copy that holds every acknowledged update: no rollback.
    return PlannedMapChange{std::move(map), {}, std::move(summary)};
  }
  const std::vector<int>& orphans = removal.orphaned;
  if (!context.checkpoints) {
    return absl::DataLossError(
        absl::StrCat("shards [", absl::StrJoin(orphans, ", "), "] of ", dead,
                     " had no other copy and cannot be restored: checkpoint.dir is "
                     "not set (cluster.replication >= 2 or checkpoint.dir would have kept them)"));
  }
  const std::map<int, ShardRecord> no_records;
  const std::map<int, ShardRecord>& records =
      context.shards != nullptr ? *context.shards : no_records;
  if (AnySyncShard(map, orphans, context)) {
    // Roll every sync shard back to the newest step all of them have on disk, so the
    // model stays one consistent state, and let the workers replay from there.
    if (context.rollback_step < 0) {
      // Not DATA_LOSS: the newest complete step may only have been unreadable for now (a
      // listing or a read that failed); a server that (re)joins reads it again.
      return absl::FailedPreconditionError(
          absl::StrCat("no complete checkpoint to roll back to; ", dead, " cannot be replaced"));
    }
    int64_t newest_applied = 0;
    for (const ShardAssignment& assignment : map.shards()) {
      auto found = records.find(assignment.shard_id());
      if (found != records.end() && !TrainsAlone(context, assignment))
        newest_applied = std::max(newest_applied, found->second.applied_updates);
    }
    RollBackSyncShards(&map, context);
    absl::StrAppend(&summary, "; every ", context.async_tables ? "dense " : "",
                    "shard rolls back to its checkpoint at step ", context.rollback_step,
                    " (about ", std::max<int64_t>(0, newest_applied - context.rollback_step),
                    " steps to replay) and the workers rewind");
  }
  // A shard training alone restores its own newest checkpoint; the others go on.
  for (ShardAssignment& assignment : *map.mutable_shards()) {
    if (!Contains(orphans, assignment.shard_id()) || !TrainsAlone(context, assignment)) continue;
    assignment.set_restore(SHARD_RESTORE_NEWEST);
    auto found = records.find(assignment.shard_id());
    const ShardRecord record = found != records.end() ? found->second : ShardRecord{};
    absl::StrAppend(
        &summary, "; shard ", assignment.shard_id(), " restores its checkpoint at update ",
        record.checkpoint_step, ", rolling back about ",
        std::max<int64_t>(0, record.applied_updates - record.checkpoint_step), " updates");
  }
  return PlannedMapChange{std::move(map), {}, std::move(summary)};
}

absl::StatusOr<PlannedMapChange> PlanDrain(ShardMap map, const std::string& drained,
                                           const std::vector<ServerEndpoint>& live,
                                           const RecoveryContext& context) {
  if (live.empty())
    return absl::FailedPreconditionError(absl::StrCat(drained, " is the last live server"));
  const ServerRemoval removal = RemoveServer(&map, drained, live, context.replication,
                                             OrNone(context.copying), OrNone(context.failing));
  if (!removal.orphaned.empty() && !context.checkpoints) {
    return absl::FailedPreconditionError(
        absl::StrCat("draining ", drained, " moves shards [", absl::StrJoin(removal.orphaned, ", "),
                     "], which have no backup, through handoff checkpoints: "
                     "set checkpoint.dir or cluster.replication >= 2"));
  }
  for (ShardAssignment& assignment : *map.mutable_shards()) {
    if (Contains(removal.orphaned, assignment.shard_id()))
      assignment.set_restore(SHARD_RESTORE_HANDOFF);
  }
  return PlannedMapChange{
      std::move(map),
      {drained},
      absl::StrCat(drained, " drained; shards move with their state: ", removal.summary)};
}

std::optional<PlannedMapChange> PlanPrimaryBalance(
    ShardMap map, const std::vector<ServerEndpoint>& live,
    const std::map<std::string, std::set<int>>& ready_backups) {
  std::set<int> moved;  // shard ids, each at most once
  std::vector<std::string> gained;
  std::vector<std::string> handing_over;  // the old primaries: they install the map first
  for (const bool embedding : {false, true}) {
    std::map<std::string, int> primaries;
    for (const ServerEndpoint& server : live) primaries[server.name] = 0;
    for (const ShardAssignment& assignment : map.shards()) {
      if ((assignment.kind() == SHARD_KIND_EMBEDDING_ROWS) != embedding) continue;
      auto it = primaries.find(assignment.server_name());
      if (it != primaries.end()) ++it->second;
    }
    while (true) {
      // The swap that narrows the widest gap: the most loaded primary's shard, to its
      // least loaded ready backup (ties: the lower shard id, the first backup).
      ShardAssignment* best_shard = nullptr;
      ShardReplica* best_backup = nullptr;
      int best_gap = 1;
      for (ShardAssignment& assignment : *map.mutable_shards()) {
        if ((assignment.kind() == SHARD_KIND_EMBEDDING_ROWS) != embedding) continue;
        if (moved.count(assignment.shard_id()) > 0) continue;
        auto primary = primaries.find(assignment.server_name());
        if (primary == primaries.end()) continue;
        for (ShardReplica& backup : *assignment.mutable_backups()) {
          auto target = primaries.find(backup.server_name());
          auto ready = ready_backups.find(backup.server_name());
          if (target == primaries.end() || ready == ready_backups.end() ||
              ready->second.count(assignment.shard_id()) == 0) {
            continue;
          }
          const int gap = primary->second - target->second;
          if (gap > best_gap) {
            best_gap = gap;
            best_shard = &assignment;
            best_backup = &backup;
          }
        }
      }
      if (best_shard == nullptr) break;
      const std::string old_primary = best_shard->server_name();
      const std::string old_address = best_shard->server_address();
      --primaries[old_primary];
      ++primaries[best_backup->server_name()];
      best_shard->set_server_name(best_backup->server_name());
      best_shard->set_server_address(best_backup->server_address());
      best_backup->set_server_name(old_primary);
      best_backup->set_server_address(old_address);
      moved.insert(best_shard->shard_id());
      if (std::find(gained.begin(), gained.end(), best_shard->server_name()) == gained.end())
        gained.push_back(best_shard->server_name());
      if (std::find(handing_over.begin(), handing_over.end(), old_primary) == handing_over.end())
        handing_over.push_back(old_primary);
    }
  }
  if (moved.empty()) return std::nullopt;
  std::string summary = absl::StrCat(
      "primaries rebalanced: shards [", absl::StrJoin(moved, ", "), "] switch to their backups on ",
      absl::StrJoin(gained, ", "),
      " (caught up; the old primaries hand them over and back them up), losing nothing");
  return PlannedMapChange{std::move(map), std::move(handing_over), std::move(summary)};
}

}  // namespace paramserver
