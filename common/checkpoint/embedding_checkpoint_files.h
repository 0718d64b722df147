// Embedding shards' checkpoint files in a checkpoint folder: one file per table per
// shard per step (common/checkpoint/embedding_checkpoint.h has the format), next to the dense
// shards' "shard-*" files and kept by the same rules.
//
// A table's rows at a step are complete when the files of that step hold every shard of
// some cut of the key space (all `count` of "emb-<table>-shard-<k>-of-<count>"); they are
// read whatever count they were cut into and rehashed onto the shard asking for them, so
// a job restores onto any number of servers or embedding shards. A delta file
// ("...-step-<step>-after-<previous>.ckpt") is read with the files it changes, back to a
// full one (ApplyEmbeddingDelta): a step is complete only if every chain is; retention
// keeps the files a kept step's chain needs.
#ifndef PARAMSERVER_COMMON_CHECKPOINT_EMBEDDING_CHECKPOINT_FILES_H_
#define PARAMSERVER_COMMON_CHECKPOINT_EMBEDDING_CHECKPOINT_FILES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/checkpoint/embedding_checkpoint.h"
#include "common/files/file_system.h"

namespace paramserver {

struct EmbeddingCheckpointFile {
  std::string path;
  int table_index = 0;
  int shard_id = 0;
  int shard_count = 1;
  int64_t step = 0;
  int64_t previous_step = -1;  // a delta's: the step it changes (-1: a full file)
};

// The longest chain of deltas a file is read through (checkpoint.embedding_deltas is at
// most this).
inline constexpr int kMaxEmbeddingDeltaChain = 1000;

// The embedding checkpoint files in `dir` by name (not verified), newest step first.
std::vector<EmbeddingCheckpointFile> ListEmbeddingCheckpoints(FileSystem& fs,
                                                              const std::string& dir);

// Writes each table's file atomically (WriteFileAtomically), with `epoch` in its header.
// UNAVAILABLE naming the path on an I/O error; INVALID_ARGUMENT for a state that does
// not encode.
absl::Status WriteEmbeddingCheckpoints(FileSystem& fs, const std::string& dir,
                                       const std::vector<EmbeddingShardState>& tables,
                                       int64_t epoch);

// The rows of bucket `bucket` of `bucket_count` of tables 0..tables-1 as of `step`, each
// table ascending by id, read from that step's files whatever count they were cut into,
// a delta through its chain. NOT_FOUND naming the table when its files at that step are
// incomplete, or naming the file a delta changes when that one is missing; DATA_LOSS for
// a corrupt file.
absl::StatusOr<std::vector<EmbeddingShardState>> LoadEmbeddingBucketAtStep(
    FileSystem& fs, const std::string& dir, int tables, int bucket, int bucket_count, int64_t step);

// OK when every one of `tables` tables has a complete, verified set of files at `step`;
// LoadEmbeddingBucketAtStep's error otherwise. With tables == 0, OK.
absl::Status CheckEmbeddingCheckpointAtStep(FileSystem& fs, const std::string& dir, int tables,
                                            int64_t step);

// The newest state of bucket `bucket` of `bucket_count` written as such (a shard's own
// periodic or handoff checkpoint), by (epoch, step), with every table's file present
// and verified. NOT_FOUND if there is none.
absl::StatusOr<std::vector<EmbeddingShardState>> LoadNewestEmbeddingBucket(FileSystem& fs,
                                                                           const std::string& dir,
                                                                           int tables, int bucket,
                                                                           int bucket_count);

// Deletes the files of bucket `bucket` of `bucket_count` older than `retain_from` and
// not among its newest `keep` readable steps (each file's chain present, by name),
// except those a kept delta's chain reads. retain_from < 0 deletes nothing. Returns how
// many.
int RemoveOldEmbeddingCheckpoints(FileSystem& fs, const std::string& dir, int bucket,
                                  int bucket_count, int keep, int64_t retain_from);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_CHECKPOINT_EMBEDDING_CHECKPOINT_FILES_H_
