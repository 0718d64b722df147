// Shard checkpoint files: one shard's full state (weights, the optimizer's state, update
// count) in `dir/shard-<id>-step-<updates>.ckpt`, written atomically with a checksum.
// Servers write them; servers restoring a shard and the scheduler planning a restore
// read them.
//
// Layout (little-endian): "PSCKPT03", int32 shard_id, int64 begin, int64 end, int64 step
// (updates applied), int64 epoch, int64 skipped_steps, uint8 name length and the optimizer state's
// name (at most kMaxOptimizerNameBytes bytes: its type and slots, "adam(exp_avg,exp_avg_sq)"),
// uint8 slot count (at most kMaxOptimizerSlots), then end-begin float32 values, then each slot's
// end-begin floats, then the CRC-32 (zlib) of every byte before it. "PSCKPT01" files (written
// before the optimizer was named) are read as "adam(exp_avg,exp_avg_sq)": the same layout without
// the name and the count; "PSCKPT02" files are PSCKPT03's without skipped_steps (0).
#ifndef PARAMSERVER_COMMON_CHECKPOINT_SHARD_CHECKPOINT_H_
#define PARAMSERVER_COMMON_CHECKPOINT_SHARD_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/checkpoint/embedding_checkpoint.h"
#include "common/files/file_system.h"
#include "common/wire/shard_layout.h"

namespace paramserver {

inline constexpr size_t kMaxOptimizerNameBytes = 128;
inline constexpr size_t kMaxOptimizerSlots = 8;

struct ShardState {
  int shard_id = 0;
  ParameterRange range;
  int64_t step = 0;  // updates applied (in sync mode: steps completed)
  // Of `step`, the sync steps a loss scaler skipped (no update); the optimizer has made
  // step - skipped_steps updates. 0 <= skipped_steps <= step.
  int64_t skipped_steps = 0;
  int64_t epoch = 0;  // the shard-map epoch it was written at
  std::vector<float> values;
  // The dense optimizer's state (ps/dense_update_rule.h): its name, the type and its
  // slots ("adam(exp_avg,exp_avg_sq)", DenseRuleStateName), and its per-parameter slots,
  // each of range.size() floats.
  std::string optimizer;
  std::vector<std::vector<float>> slots;
  // An embedding shard (range empty): its rows of every table, one entry per table in
  // table order (written as one embedding checkpoint file each).
  std::vector<EmbeddingShardState> tables;
};

// SortRowsById for each of state's embedding tables (a dense shard's state: no change).
void SortRowsById(ShardState* state);

struct CheckpointFileName {
  std::string path;
  int shard_id = 0;
  int64_t step = 0;
};

// "<dir>/shard-<id>-step-<step>.ckpt".
std::string ShardCheckpointPath(const std::string& dir, int shard_id, int64_t step);

// Writes `state` atomically (WriteFileAtomically), so a crash or an I/O error at any point
// leaves either the old files or the complete new one. Creates `dir` if needed.
// UNAVAILABLE naming the path on an I/O error.
absl::Status WriteShardCheckpoint(FileSystem& fs, const std::string& dir, const ShardState& state);

// Reads and verifies one file. DATA_LOSS naming the path for a bad magic number, a
// truncated file, inconsistent sizes or a checksum mismatch; NOT_FOUND if absent.
absl::StatusOr<ShardState> ReadShardCheckpoint(FileSystem& fs, const std::string& path);
// The same for a file's bytes, read from `source` (named in errors).
absl::StatusOr<ShardState> ParseShardCheckpoint(const std::string& bytes,
                                                const std::string& source);

// The checkpoint files in `dir` by name (not verified), newest step first. Temporary
// files of interrupted writes are not listed.
std::vector<CheckpointFileName> ListShardCheckpoints(FileSystem& fs, const std::string& dir);

// The newest step for which verified files cover [0, total_parameters) exactly and, with
// embedding_tables > 0, hold every row of tables 0..embedding_tables-1 (a complete cut,
// common/checkpoint/embedding_checkpoint_files.h); -1 if none.
int64_t NewestCompleteCheckpointStep(FileSystem& fs, const std::string& dir,
                                     int64_t total_parameters, int embedding_tables = 0);

// Why NewestCompleteCheckpointStep found none: "it holds no checkpoint files", or what is
// wrong at each of the newest `steps` steps (a file missing, corrupt, or of another
// model, each naming the file or the range), newest first, "; "-separated.
std::string DescribeWhyNoCompleteCheckpoint(FileSystem& fs, const std::string& dir,
                                            int64_t total_parameters, int embedding_tables,
                                            int steps = 3);

// The state of `range` as of `step`, assembled from the verified files of that step
// whatever shards they were cut into. NOT_FOUND naming the gap if they do not cover it.
// With `model_parameters` >= 0 (the model's dense parameters), a file holding any past
// them is another model's: INVALID_ARGUMENT naming it.
absl::StatusOr<ShardState> LoadRangeAtStep(FileSystem& fs, const std::string& dir,
                                           ParameterRange range, int64_t step,
                                           int64_t model_parameters = -1);

// The newest verified checkpoint of shard `shard_id` that holds exactly `range`, by
// (epoch written, step). NOT_FOUND if there is none.
absl::StatusOr<ShardState> LoadNewestShardCheckpoint(FileSystem& fs, const std::string& dir,
                                                     int shard_id, ParameterRange range);

// Deletes the checkpoint files of shard `shard_id` that are older than `retain_from`
// and not among its newest `keep`. retain_from < 0 deletes nothing.
int RemoveOldShardCheckpoints(FileSystem& fs, const std::string& dir, int shard_id, int keep,
                              int64_t retain_from);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_CHECKPOINT_SHARD_CHECKPOINT_H_
