// ClusterRegistry's durable state: what the scheduler saves, checks when it reads it
// back, and takes a running job over from.
#include <set>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/model_declaration.h"
#include "scheduler/cluster_registry.h"

namespace paramserver {

SchedulerState ClusterRegistry::ExportState() const {
  absl::MutexLock lock(&mu_);
  SchedulerState state;
  roster_.Export(&state);
  if (shard_map_.has_value()) *state.mutable_shard_map() = *shard_map_;
  if (!model_declared_by_.empty()) {
    *state.mutable_declared_model() = declared_model_;
    state.set_model_declared_by(model_declared_by_);
  }
  progress_.Export(&state);
  *state.mutable_data_leases() = data_leases_.Export();
  return state;
}

int64_t ClusterRegistry::state_version() const {
  absl::MutexLock lock(&mu_);
  return state_version_;
}

absl::Status ClusterRegistry::CheckSavedState(const SchedulerState& state) const {
  // The file is the scheduler's own (0600), but a disk error, a hand edit or another
  // job's file must not index out of range: every number is checked before use.
  std::set<std::string> names;
  PS_RETURN_IF_ERROR(roster_.CheckSaved(state, &names));
  ModelLayout layout = options_.layout;
  if (!state.model_declared_by().empty()) {
    absl::StatusOr<ModelLayout> declared = LayoutOfDeclaration(state.declared_model());
    if (!options_.model_declared_by_workers || !declared.ok()) {
      return absl::DataLossError(absl::StrCat("the saved state holds a declared model, which ",
                                              options_.model_declared_by_workers
                                                  ? declared.status().message()
                                                  : "this spec's model type does not take"));
    }
    layout = *std::move(declared);
  } else if (options_.model_declared_by_workers && state.has_shard_map()) {
    return absl::DataLossError("the saved shard map has no declared model (model.type torch)");
  }
  if (state.has_shard_map()) {
    for (const ShardAssignment& assignment : state.shard_map().shards()) {
      const bool rows = assignment.kind() == SHARD_KIND_EMBEDDING_ROWS;
      if (rows && (layout.embedding_tables().empty() ||
                   assignment.embedding_buckets() != options_.cluster.embedding_shards ||
                   assignment.embedding_bucket() < 0 ||
                   assignment.embedding_bucket() >= assignment.embedding_buckets())) {
        return absl::DataLossError(absl::StrCat(
            "shard ", assignment.shard_id(), " holds embedding bucket ",
            assignment.embedding_bucket(), " of ", assignment.embedding_buckets(),
            "; this model has ", layout.embedding_tables().size(),
            " tables in cluster.embedding_shards = ", options_.cluster.embedding_shards));
      }
      if (!rows && assignment.kind() != SHARD_KIND_DENSE_RANGE) {
        return absl::DataLossError(absl::StrCat("shard ", assignment.shard_id(), " is of kind ",
                                                ShardKind_Name(assignment.kind()),
                                                ", which this scheduler does not place"));
      }
      if (!rows && (assignment.begin() < 0 || assignment.end() <= assignment.begin() ||
                    assignment.end() > layout.dense_parameters())) {
        return absl::DataLossError(absl::StrCat("shard ", assignment.shard_id(), " covers [",
                                                assignment.begin(), ", ", assignment.end(),
                                                "), outside this model's ",
                                                layout.dense_parameters(), " parameters"));
      }
      if (names.count(assignment.server_name()) == 0) {
        return absl::DataLossError(absl::StrCat("shard ", assignment.shard_id(), " is held by '",
                                                assignment.server_name(),
                                                "', which is not among the saved nodes"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ClusterRegistry::ImportState(const SchedulerState& state, absl::Time now) {
  {
    absl::MutexLock lock(&mu_);
    PS_RETURN_IF_ERROR(ImportStateLocked(state, now));
  }
  // The scheduler taken over from may have died before it recorded the model beside the
  // checkpoints: record it again (the same bytes), without the lock.
  if (!state.model_declared_by().empty() && options_.on_model_declared)
    options_.on_model_declared(state.declared_model());
  return absl::OkStatus();
}

absl::Status ClusterRegistry::ImportStateLocked(const SchedulerState& state, absl::Time now) {
  PS_RETURN_IF_ERROR(CheckSavedState(state));
  // The last check that can fail: nothing is taken over before it passed.
  if (state.has_data_leases()) PS_RETURN_IF_ERROR(data_leases_.Import(state.data_leases()));
  roster_.Import(state, now);
  if (state.has_shard_map()) {
    // Signed anew with this process's key: the servers learn it from their next
    // heartbeat reply, and the content (hence the digest they hold) is unchanged.
    ShardMap map = state.shard_map();
    map_signing_key_->Sign(&map);
    SetShardMapLocked(std::move(map));
  }
  if (!state.model_declared_by().empty()) {
    declared_model_ = state.declared_model();
    model_declared_by_ = state.model_declared_by();
    layout_ = *LayoutOfDeclaration(declared_model_);  // CheckSavedState checked it
  }
  progress_.MarkAdvance(now);
  progress_.Import(state);
  return absl::OkStatus();
}

}  // namespace paramserver
