// ShardHost's sources of a shard's first state: the model a spec trains (the MLP's
// initial values, the tables, init_from's rows) and an embedding shard's tables, from
// init_from or the checkpoints.
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/embedding_checkpoint_files.h"
#include "common/checkpoint/safetensors.h"
#include "common/files/s3_file_system.h"
#include "common/model/mlp_parameters.h"
#include "common/model/optimizer_groups.h"
#include "common/wire/shard_layout.h"
#include "ps/shard_host.h"

namespace paramserver {

absl::StatusOr<HostedModel> HostedModelFromSpec(const ClusterSpec& spec) {
  const ModelSection& model = spec.model;
  HostedModel hosted;
  const MlpLayout layout(model.layers);
  if (model.type != ModelType::kTorch && !spec.training.optimizer.groups.empty()) {
    PS_ASSIGN_OR_RETURN(hosted.optimizer_segments,
                        OptimizerSegments(spec.training.optimizer, layout.model()));
  }
  if (model.type == ModelType::kTorch) {
    // Declared by the script at run time: see ShardHost::AdoptDeclaredModel.
  } else if (model.init_from.empty()) {
    hosted.initial_parameters = InitializeMlpParameters(layout, model.init_seed);
  } else {
    PS_ASSIGN_OR_RETURN(hosted.initial_parameters,
                        LoadDenseParameters(layout.model(), model.init_from));
    if (model.type == ModelType::kCtr) {
      PS_ASSIGN_OR_RETURN(std::vector<NamedTensor> tensors, ReadSafetensorsFile(model.init_from));
      PS_ASSIGN_OR_RETURN(hosted.initial_rows,
                          EmbeddingRowsFromTensors(tensors, CtrTableDims(model), model.init_from));
    }
  }
  hosted.dense_parameters = static_cast<int64_t>(hosted.initial_parameters.size());
  if (model.type != ModelType::kCtr) return hosted;
  const std::vector<CtrTableSpec> tables = CtrTables(model);
  for (int t = 0; t < static_cast<int>(tables.size()); ++t) {
    hosted.embedding_tables.push_back(
        EmbeddingTableOptionsFor(spec, t, tables[t].dim, tables[t].settings));
  }
  return hosted;
}

absl::StatusOr<ShardState> ShardHost::LoadEmbeddingShard(const ShardAssignment& assignment,
                                                         ShardSource source) const {
  const int tables = static_cast<int>(model_.embedding_tables.size());
  const int bucket = assignment.embedding_bucket();
  const int buckets = assignment.embedding_buckets();
  ShardState state;
  state.shard_id = assignment.shard_id();
  switch (source) {
    case ShardSource::kInitialValues:
      for (int t = 0; t < tables; ++t) {
        const int dim = model_.embedding_tables[t].dim;
        const EmbeddingOptimizerOptions& optimizer = model_.embedding_tables[t].optimizer;
        const int state_floats = StateFloatsPerRow(optimizer.type, dim);
        EmbeddingShardState& table = state.tables.emplace_back();
        table.table_index = t;
        table.dim = dim;
        table.state_floats = state_floats;
        table.optimizer = std::string(EmbeddingOptimizerName(optimizer.type));
        table.shard_id = bucket;
        table.shard_count = buckets;
        if (t >= static_cast<int>(model_.initial_rows.size())) continue;
        const TableRows& given = model_.initial_rows[t];
        for (size_t i = 0; i < given.ids.size(); ++i) {
          if (EmbeddingShardOf(t, given.ids[i], buckets) != bucket) continue;
          table.ids.push_back(given.ids[i]);
          table.rows.insert(table.rows.end(), given.rows.begin() + i * dim,
                            given.rows.begin() + (i + 1) * dim);
        }
        table.state.assign(table.ids.size() * state_floats, 0.0f);
        for (size_t i = 0; i < table.ids.size(); ++i) {
          InitializeRowState(optimizer, dim,
                             absl::MakeSpan(table.state.data() + i * state_floats, state_floats));
        }
      }
      return state;
    case ShardSource::kRestoreAtStep: {
      PS_ASSIGN_OR_RETURN(state.tables,
                          LoadEmbeddingBucketAtStep(FileSystemFor(parts_.checkpoints->dir()),
                                                    parts_.checkpoints->dir(), tables, bucket,
                                                    buckets, assignment.restore_step()));
      break;
    }
    default:
      PS_ASSIGN_OR_RETURN(state.tables, LoadNewestEmbeddingBucket(
                                            FileSystemFor(parts_.checkpoints->dir()),
                                            parts_.checkpoints->dir(), tables, bucket, buckets));
      break;
  }
  for (const EmbeddingShardState& table : state.tables) {
    const bool known = table.table_index >= 0 && table.table_index < tables;
    const int dim = known ? model_.embedding_tables[table.table_index].dim : -1;
    const int state_floats =
        known ? StateFloatsPerRow(model_.embedding_tables[table.table_index].optimizer.type, dim)
              : -1;
    if (table.dim != dim || table.state_floats != state_floats) {
      return absl::FailedPreconditionError(absl::StrCat(
          "embedding shard ", assignment.shard_id(), ": the checkpoint's table C",
          table.table_index + 1, " has rows of dim ", table.dim, " with ", table.state_floats,
          " optimizer floats; this model's have dim ", dim, " and ", state_floats,
          " (another dim or row optimizer: model.embedding_dim, model.tables, "
          "training.embedding_optimizer)"));
    }
    const std::string optimizer(
        EmbeddingOptimizerName(model_.embedding_tables[table.table_index].optimizer.type));
    if (!table.optimizer.empty() && table.optimizer != optimizer) {
      return absl::FailedPreconditionError(absl::StrCat(
          "embedding shard ", assignment.shard_id(), ": the checkpoint's table C",
          table.table_index + 1, " holds ", table.optimizer, " state; this model's table C",
          table.table_index + 1, " trains with ", optimizer,
          " (model.tables, training.embedding_optimizer): resume with the optimizer it was "
          "saved with"));
    }
    state.step = table.step;
    state.skipped_steps = table.skipped_steps;
    state.epoch = std::max(state.epoch, table.epoch);
  }
  return state;
}

}  // namespace paramserver
