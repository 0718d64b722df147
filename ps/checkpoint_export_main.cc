// ps_checkpoint_export: turns the shard checkpoints of a job into one safetensors
// weights file (PyTorch's names and layout), the same file output.weights holds: the
// MLP's fc<i>.weight/bias and, for a ctr model, every table's C<k>.ids (sorted) and
// C<k>.weight. A hybrid job's (training.embedding_mode async) tables are checkpointed at
// their own update counts: each bucket's newest checkpoint goes with the dense step.
//   ps_checkpoint_export --config job.yaml [--step N] --out weights.safetensors
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/checkpoint/embedding_checkpoint_files.h"
#include "common/checkpoint/safetensors.h"
#include "common/checkpoint/shard_checkpoint.h"
#include "common/config/cluster_spec.h"
#include "common/config/command_line.h"
#include "common/model/embedding_init.h"
#include "common/model/mlp_parameters.h"

ABSL_FLAG(std::string, config, "", "the job's cluster spec (for the model and checkpoint.dir)");
ABSL_FLAG(std::string, dir, "", "the checkpoint folder (default: checkpoint.dir of the config)");
ABSL_FLAG(int64_t, step, -1, "the step to export (default: the newest complete checkpoint)");
ABSL_FLAG(std::string, out, "", "the safetensors file to write");

constexpr char kUsage[] =
    "writes a job's shard checkpoints as one safetensors weights file "
    "(the file output.weights holds).\nusage: ps_checkpoint_export --config FILE [--dir DIR] "
    "[--step N] --out FILE";

namespace {

// Tables 0..tables-1, each the rows of every bucket's newest checkpoint of the job's
// `buckets` (unsorted). NOT_FOUND naming the bucket that has none.
absl::StatusOr<std::vector<paramserver::EmbeddingShardState>> LoadNewestOfEveryBucket(
    const std::string& dir, int tables, int buckets) {
  std::vector<paramserver::EmbeddingShardState> merged;
  for (int bucket = 0; bucket < buckets; ++bucket) {
    absl::StatusOr<std::vector<paramserver::EmbeddingShardState>> newest =
        paramserver::LoadNewestEmbeddingBucket(paramserver::LocalFileSystem(), dir, tables, bucket,
                                               buckets);
    if (!newest.ok()) {
      return absl::Status(newest.status().code(),
                          absl::StrCat("bucket ", bucket, " of ", buckets, " (cluster.",
                                       "embedding_shards): ", newest.status().message()));
    }
    if (merged.empty()) {
      merged = *std::move(newest);
      continue;
    }
    for (size_t t = 0; t < merged.size() && t < newest->size(); ++t) {
      paramserver::EmbeddingShardState& into = merged[t];
      const paramserver::EmbeddingShardState& from = (*newest)[t];
      into.ids.insert(into.ids.end(), from.ids.begin(), from.ids.end());
      into.rows.insert(into.rows.end(), from.rows.begin(), from.rows.end());
    }
  }
  return merged;
}

}  // namespace

int main(int argc, char** argv) {
  paramserver::ParseCommandLineWithHelp(argc, argv, kUsage);
  absl::StatusOr<paramserver::ClusterSpec> spec =
      paramserver::LoadClusterSpec(absl::GetFlag(FLAGS_config));
  if (!spec.ok()) {
    std::fprintf(stderr, "ps_checkpoint_export: %s\n",
                 std::string(spec.status().message()).c_str());
    return 2;
  }
  const std::string dir =
      absl::GetFlag(FLAGS_dir).empty() ? spec->checkpoint.dir : absl::GetFlag(FLAGS_dir);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (dir.empty() || out.empty()) {
    std::fprintf(
        stderr,
        "ps_checkpoint_export: needs --out and a checkpoint folder (--dir or checkpoint.dir)\n");
    return 2;
  }
  const paramserver::MlpLayout layout(spec->model.layers);
  const bool ctr = spec->model.type == paramserver::ModelType::kCtr;
  const int tables = ctr ? spec->model.categorical_features : 0;
  const bool async_tables = spec->training.async_tables;
  int64_t step = absl::GetFlag(FLAGS_step);
  if (step < 0)
    step = paramserver::NewestCompleteCheckpointStep(
        paramserver::LocalFileSystem(), dir, layout.total_parameters(), async_tables ? 0 : tables);
  if (step < 0) {
    std::fprintf(stderr, "ps_checkpoint_export: %s holds no complete checkpoint of this model\n",
                 dir.c_str());
    return 1;
  }
  absl::StatusOr<paramserver::ShardState> state =
      paramserver::LoadRangeAtStep(paramserver::LocalFileSystem(), dir,
                                   {0, layout.total_parameters()}, step, layout.total_parameters());
  if (!state.ok()) {
    std::fprintf(stderr, "ps_checkpoint_export: %s\n", state.status().ToString().c_str());
    return 1;
  }
  std::vector<paramserver::NamedTensor> tensors;
  for (const paramserver::TensorSlot& slot : layout.model().dense_tensors()) {
    tensors.push_back({slot.name, slot.shape,
                       std::vector<float>(state->values.begin() + slot.offset,
                                          state->values.begin() + slot.offset + slot.size())});
  }
  if (ctr) {
    // Every row of every table: bucket 0 of 1 reads each table's whole cut (async tables:
    // each bucket's newest, table by table).
    absl::StatusOr<std::vector<paramserver::EmbeddingShardState>> rows =
        async_tables ? LoadNewestOfEveryBucket(dir, tables, spec->cluster.embedding_shards)
                     : paramserver::LoadEmbeddingBucketAtStep(paramserver::LocalFileSystem(), dir,
                                                              tables, 0, 1, step);
    if (!rows.ok()) {
      std::fprintf(stderr, "ps_checkpoint_export: %s\n", rows.status().ToString().c_str());
      return 1;
    }
    const std::vector<int> dims = paramserver::CtrTableDims(spec->model);
    std::vector<paramserver::TableRows> by_table;
    for (paramserver::EmbeddingShardState& table : *rows) {
      if (table.table_index < 0 || table.table_index >= static_cast<int>(dims.size()) ||
          table.dim != dims[table.table_index]) {
        std::fprintf(stderr,
                     "ps_checkpoint_export: %s: table C%d's rows are %d wide in the checkpoint; "
                     "the spec's table is %d wide (model.embedding_dim, model.tables)\n",
                     dir.c_str(), table.table_index + 1, table.dim,
                     table.table_index >= 0 && table.table_index < static_cast<int>(dims.size())
                         ? dims[table.table_index]
                         : 0);
        return 1;
      }
      by_table.push_back({std::move(table.ids), std::move(table.rows)});
      paramserver::SortTableRows(table.dim, &by_table.back());
    }
    for (paramserver::NamedTensor& tensor :
         paramserver::TensorsOfTables(by_table, paramserver::CtrTableDims(spec->model)))
      tensors.push_back(std::move(tensor));
  }
  absl::Status saved = paramserver::WriteSafetensorsFile(out, tensors);
  if (!saved.ok()) {
    std::fprintf(stderr, "ps_checkpoint_export: %s\n", saved.ToString().c_str());
    return 1;
  }
  std::printf("wrote the weights at step %lld to %s\n", static_cast<long long>(step), out.c_str());
  return 0;
}
