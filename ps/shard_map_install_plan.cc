#include "ps/shard_map_install_plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace paramserver {
namespace {

ParameterRange RangeOf(const ShardAssignment& assignment) {
  return {assignment.begin(), assignment.end()};
}

// Whether the held shard is the one `assignment` places (same range, or same bucket).
bool SameShard(const HeldShard& held, const ShardAssignment& assignment) {
  if (assignment.kind() == SHARD_KIND_EMBEDDING_ROWS) {
    return held.embedding_bucket == assignment.embedding_bucket() &&
           held.embedding_buckets == assignment.embedding_buckets();
  }
  return held.embedding_buckets == 0 && held.range == RangeOf(assignment);
}

bool BacksUp(const ShardAssignment& assignment, const std::string& node_name) {
  return std::any_of(assignment.backups().begin(), assignment.backups().end(),
                     [&](const ShardReplica& backup) { return backup.server_name() == node_name; });
}

absl::StatusOr<ShardSource> SourceOf(const ShardAssignment& assignment, const HeldShard* held,
                                     const ShardInstallContext& context) {
  const ParameterRange range = RangeOf(assignment);
  if (assignment.kind() == SHARD_KIND_EMBEDDING_ROWS) {
    if (context.embedding_tables == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("shard ", assignment.shard_id(),
                       " holds embedding rows, but this server's model has no embedding tables: "
                       "do the scheduler and this server use the same config?"));
    }
    if (assignment.embedding_buckets() < 1 || assignment.embedding_bucket() < 0 ||
        assignment.embedding_bucket() >= assignment.embedding_buckets() || range.begin != 0 ||
        range.end != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the scheduler assigned embedding shard ", assignment.shard_id(), " bucket ",
          assignment.embedding_bucket(), " of ", assignment.embedding_buckets(), " with range [",
          range.begin, ", ", range.end, "): not a bucket of the tables"));
    }
  } else if (assignment.kind() != SHARD_KIND_DENSE_RANGE) {
    return absl::FailedPreconditionError(absl::StrCat("shard ", assignment.shard_id(),
                                                      " is of kind ", assignment.kind(),
                                                      ", which this server does not know"));
  } else if (range.begin < 0 || range.end > context.total_parameters || range.begin >= range.end) {
    return absl::FailedPreconditionError(
        absl::StrCat("the scheduler assigned shard ", assignment.shard_id(), " = [", range.begin,
                     ", ", range.end, "), outside this model's ", context.total_parameters,
                     " parameters: do the scheduler and this server use the same config?"));
  }
  switch (assignment.restore()) {
    case SHARD_RESTORE_NONE:
      return held != nullptr && SameShard(*held, assignment) ? ShardSource::kKeepHeld
                                                             : ShardSource::kInitialValues;
    case SHARD_RESTORE_AT_STEP:
    case SHARD_RESTORE_HANDOFF:
    default:
      if (!context.checkpoints_enabled) {
        return absl::FailedPreconditionError(
            absl::StrCat("shard ", assignment.shard_id(),
                         " must be restored from a checkpoint, but checkpoint.dir is not set"));
      }
      if (assignment.restore() == SHARD_RESTORE_AT_STEP) return ShardSource::kRestoreAtStep;
      if (assignment.restore() == SHARD_RESTORE_HANDOFF) return ShardSource::kRestoreHandoff;
      return ShardSource::kRestoreNewest;
  }
}

}  // namespace

absl::StatusOr<ShardInstallPlan> PlanShardMapInstall(const std::map<int, HeldShard>& held,
                                                     const ShardMap& map,
                                                     const ShardInstallContext& context) {
  ShardInstallPlan plan;
  plan.epoch = map.epoch();
  // The rejoin check covers the whole map before anything else is decided.
  if (context.rejoining) {
    for (const ShardAssignment& assignment : map.shards()) {
      if (assignment.server_name() == context.node_name &&
          assignment.restore() == SHARD_RESTORE_NONE) {
        return absl::FailedPreconditionError(absl::StrCat("epoch ", map.epoch(), " gives us shard ",
                                                          assignment.shard_id(),
                                                          " with no state to restore"));
      }
    }
  }
  std::map<int, bool> kept;      // held shard id -> kept as the same object
  std::map<int, bool> to_serve;  // shard ids served or copied under the map
  for (const ShardAssignment& assignment : map.shards()) {
    const int id = assignment.shard_id();
    auto it = held.find(id);
    const HeldShard* was = it != held.end() ? &it->second : nullptr;
    if (assignment.server_name() == context.node_name) {
      ShardInstallPlan::Primary primary;
      primary.assignment = &assignment;
      absl::StatusOr<ShardSource> source = SourceOf(assignment, was, context);
      if (!source.ok()) return source.status();
      primary.source = *source;
      const bool same_object = primary.source == ShardSource::kKeepHeld;
      primary.keep_replicator =
          assignment.backups_size() > 0 && same_object && was->primary && was->has_replicator;
      if (same_object) kept[id] = true;
      to_serve[id] = true;
      plan.primaries.push_back(primary);
      continue;
    }
    if (!BacksUp(assignment, context.node_name)) continue;
    to_serve[id] = true;
    const bool same_state =
        was != nullptr && assignment.restore() == SHARD_RESTORE_NONE && SameShard(*was, assignment);
    // Keep a copy only if it follows the same primary's log, which goes on unchanged.
    if (same_state && !was->primary && was->primary_name == assignment.server_name()) {
      plan.kept_backups.push_back(id);
      kept[id] = true;
    } else if (same_state && was->primary && was->has_replicator) {
      // Its primary here, with backups: one of them takes over from this state.
      plan.handovers.push_back(&assignment);
      kept[id] = true;
    } else {
      plan.backups_to_copy.push_back(&assignment);
    }
  }
  for (const auto& [id, was] : held) {
    const bool primary_keeps_replicator =
        std::any_of(plan.primaries.begin(), plan.primaries.end(), [id = id](const auto& primary) {
          return primary.assignment->shard_id() == id && primary.keep_replicator;
        });
    if (was.has_replicator && !primary_keeps_replicator) plan.retired_replicators.push_back(id);
    if (kept.count(id) > 0) {
      plan.held[id] = HeldShardFate::kKeep;
    } else if (to_serve.count(id) == 0 && was.primary && context.checkpoints_enabled) {
      plan.held[id] = HeldShardFate::kHandOff;  // moved to another server: it resumes from this
    } else {
      plan.held[id] = HeldShardFate::kClose;
    }
  }
  return plan;
}

}  // namespace paramserver
