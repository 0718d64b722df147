// How a shard of a table's rows is saved (which shard holds a row: EmbeddingShardOf in
// common/wire/shard_layout.h, the key space).
//
// The file ("PSEMB003"), little-endian: magic, int32 table_index, dim, state floats per
// row, shard_id, shard_count; int64 step, epoch, row count, skipped_steps (a "PSEMB001"
// file has none: 0); int32 n and the n bytes of the rows' optimizer's name (a
// "PSEMB002" or older file has none: unknown); then per row, ids ascending:
// int64 id, dim floats, then its optimizer state floats; then the CRC-32 (zlib) of every
// byte before it. Rows sorted by id make the bytes a function of the rows alone.
//
// A delta file ("PSEMB004", checkpoint.embedding_deltas) holds only what changed since
// the shard's checkpoint at previous_step: after the optimizer's name, int64
// previous_step, int64 removed count and the removed (evicted) ids ascending; then the
// rows changed or made since, as above. The shard's rows at `step` are those at
// previous_step (a full file, or a delta resolved the same way) less the removed ids,
// with the changed rows put in (ApplyEmbeddingDelta).
#ifndef PARAMSERVER_COMMON_CHECKPOINT_EMBEDDING_CHECKPOINT_H_
#define PARAMSERVER_COMMON_CHECKPOINT_EMBEDDING_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace paramserver {

inline constexpr size_t kMaxEmbeddingOptimizerName = 64;

// One embedding shard of one table: its rows, ascending by id, and their state.
struct EmbeddingShardState {
  int table_index = 0;
  int dim = 0;
  int state_floats = 0;  // per row
  int shard_id = 0;
  int shard_count = 1;
  int64_t step = 0;
  int64_t skipped_steps = 0;  // of step: as ShardState's
  int64_t epoch = 0;
  // The rows' optimizer ("adam", "ftrl": EmbeddingOptimizerName), whose state `state`
  // holds; at most kMaxEmbeddingOptimizerName bytes. Empty: unknown (an older file).
  std::string optimizer;
  std::vector<int64_t> ids;
  std::vector<float> rows;   // ids.size() x dim
  std::vector<float> state;  // ids.size() x state_floats
  // A delta's: the step of the checkpoint it changes (< step), and the ids evicted since,
  // ascending, each of the shard. -1 (and none removed): a full checkpoint.
  int64_t previous_step = -1;
  std::vector<int64_t> removed_ids;
  // Never in a checkpoint file (the encoder refuses a state with them): a server's copy
  // of its rows for a new replica, taken as stored (the fastest copy, under the shard's
  // lock), with the order it must have, the least recently updated first, as links: the
  // position of the least recent row, and for each position the row updated next
  // (kNoMoreRecentRow after the most recent). They travel to the new backup (a replica's
  // recency_links), whose OrderRowsByRecency puts the rows in that order and empties them.
  std::vector<uint32_t> next_more_recent;
  uint32_t least_recent = 0;
  bool is_delta() const { return previous_step >= 0; }
};

inline constexpr uint32_t kNoMoreRecentRow = 0xffffffffu;

// "<dir>/emb-<table>-shard-<id>-of-<count>-step-<step>.ckpt", a delta's
// "<dir>/emb-<table>-shard-<id>-of-<count>-step-<step>-after-<previous_step>.ckpt".
std::string EmbeddingCheckpointPath(const std::string& dir, const EmbeddingShardState& state);

// Puts state's rows in ascending id order, each with its row and state floats, as the
// encoder requires: a shard's snapshot copies them in storage order under its lock, and
// whoever writes it sorts them after (ps/checkpoint_writer). Linear when they already
// are; otherwise a sort of (id, position), then the rows and their state gathered into
// new buffers (a second copy of them while it sorts).
void SortRowsById(EmbeddingShardState* state);

// Puts state's rows in the order its links give (least recently updated first), gathered
// into new buffers, and empties the links; no change without links. A walk of the links
// (one dependent read a row, over 4 bytes a row) and the gather, done where no lock is
// held: by a new backup, on the state its primary copied as stored. INVALID_ARGUMENT
// (the rows unchanged) unless the links are one per row and lead from least_recent
// through every row once (a peer's links are checked here). REQUIRES: rows and state
// hold ids.size() x dim and x state_floats floats.
absl::Status OrderRowsByRecency(EmbeddingShardState* state);

// INVALID_ARGUMENT (nothing encoded) unless the ids ascend strictly, every id belongs to
// the shard, and the sizes agree.
absl::StatusOr<std::string> EncodeEmbeddingCheckpoint(const EmbeddingShardState& state);
// The same, with `epoch` written in place of state.epoch (no copy of the rows to stamp it).
absl::StatusOr<std::string> EncodeEmbeddingCheckpoint(const EmbeddingShardState& state,
                                                      int64_t epoch);

// DATA_LOSS naming `source` for a bad magic number, a truncated file, inconsistent sizes,
// ids out of order or on the wrong shard, or a checksum mismatch. Sizes are checked
// before anything is allocated for them.
absl::StatusOr<EmbeddingShardState> ParseEmbeddingCheckpoint(absl::string_view bytes,
                                                             absl::string_view source);

// `delta`'s changes applied to `base`, the same table and shard's rows at
// delta.previous_step (full: resolved): the rows at delta.step, a full state. DATA_LOSS
// naming `source` (the delta's file) when base is not the one the delta changes.
absl::StatusOr<EmbeddingShardState> ApplyEmbeddingDelta(const EmbeddingShardState& base,
                                                        const EmbeddingShardState& delta,
                                                        absl::string_view source);

// The same rows cut into `shard_count` shards (a restore onto a different number of
// embedding shards or servers). REQUIRES: `shards` are of one table, dim and state size.
std::vector<EmbeddingShardState> RehashEmbeddingShards(
    const std::vector<EmbeddingShardState>& shards, int shard_count);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_CHECKPOINT_EMBEDDING_CHECKPOINT_H_
