#include "common/checkpoint/embedding_checkpoint_files.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/status_macros.h"
#include "common/wire/shard_layout.h"
#include "spdlog/spdlog.h"

namespace paramserver {
namespace {

// "emb-<table>-shard-<id>-of-<count>-step-<step>[-after-<previous>].ckpt" -> its numbers.
std::optional<EmbeddingCheckpointFile> ParseName(const std::string& dir, const std::string& name) {
  if (name.rfind("emb-", 0) != 0 || name.size() < 5 || name.substr(name.size() - 5) != ".ckpt")
    return std::nullopt;
  const std::vector<std::string> parts =
      absl::StrSplit(name.substr(0, name.size() - 5), '-');  // emb T shard K of N step S
  if ((parts.size() != 8 && parts.size() != 10) || parts[2] != "shard" || parts[4] != "of" ||
      parts[6] != "step")
    return std::nullopt;
  EmbeddingCheckpointFile file;
  file.path = absl::StrCat(dir, "/", name);
  if (!absl::SimpleAtoi(parts[1], &file.table_index) ||
      !absl::SimpleAtoi(parts[3], &file.shard_id) ||
      !absl::SimpleAtoi(parts[5], &file.shard_count) || !absl::SimpleAtoi(parts[7], &file.step) ||
      file.shard_count < 1 || file.shard_id < 0 || file.shard_id >= file.shard_count) {
    return std::nullopt;
  }
  if (parts.size() == 10 &&
      (parts[8] != "after" || !absl::SimpleAtoi(parts[9], &file.previous_step) ||
       file.previous_step < 0 || file.previous_step >= file.step)) {
    return std::nullopt;
  }
  return file;
}

// Whether `a` is read rather than `b`, both of one table, cut, shard and step (a full
// file and a delta, or deltas of two owners): the full one, else the longer delta's.
bool ReadRather(const EmbeddingCheckpointFile& a, const EmbeddingCheckpointFile& b) {
  if ((a.previous_step < 0) != (b.previous_step < 0)) return a.previous_step < 0;
  return a.previous_step < b.previous_step;
}

// The file of (table, shard, count, step) in `listing` that is read, or null.
const EmbeddingCheckpointFile* FileAt(const std::vector<EmbeddingCheckpointFile>& listing,
                                      int table, int shard, int count, int64_t step) {
  const EmbeddingCheckpointFile* chosen = nullptr;
  for (const EmbeddingCheckpointFile& file : listing) {
    if (file.table_index != table || file.shard_id != shard || file.shard_count != count ||
        file.step != step)
      continue;
    if (chosen == nullptr || ReadRather(file, *chosen)) chosen = &file;
  }
  return chosen;
}

absl::StatusOr<EmbeddingShardState> ReadFile(FileSystem& fs, const EmbeddingCheckpointFile& file) {
  absl::StatusOr<std::string> bytes = fs.ReadFile(file.path);
  if (!bytes.ok()) return bytes.status();
  PS_ASSIGN_OR_RETURN(EmbeddingShardState state, ParseEmbeddingCheckpoint(*bytes, file.path));
  if (state.table_index != file.table_index || state.shard_id != file.shard_id ||
      state.shard_count != file.shard_count || state.step != file.step) {
    return absl::DataLossError(absl::StrCat(file.path, ": its header names table ",
                                            state.table_index, " shard ", state.shard_id, " of ",
                                            state.shard_count, " at step ", state.step));
  }
  return state;
}

// `file`'s rows as of its step: a full file's, or a delta applied to the rows of the file it
// changes (found in `listing`), resolved the same way.
absl::StatusOr<EmbeddingShardState> ReadResolved(
    FileSystem& fs, const std::vector<EmbeddingCheckpointFile>& listing,
    const EmbeddingCheckpointFile& file, int depth = 0) {
  PS_ASSIGN_OR_RETURN(EmbeddingShardState state, ReadFile(fs, file));
  if (state.previous_step != file.previous_step) {
    return absl::DataLossError(
        absl::StrCat(file.path, ": its header says it changes step ", state.previous_step));
  }
  if (!state.is_delta()) return state;
  if (depth >= kMaxEmbeddingDeltaChain) {
    return absl::DataLossError(absl::StrCat(file.path, ": more than ", kMaxEmbeddingDeltaChain,
                                            " deltas back to a full checkpoint"));
  }
  const EmbeddingCheckpointFile* previous =
      FileAt(listing, file.table_index, file.shard_id, file.shard_count, state.previous_step);
  if (previous == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(file.path, " changes the checkpoint at step ", state.previous_step,
                     ", whose file (emb-", file.table_index, "-shard-", file.shard_id, "-of-",
                     file.shard_count, "-step-", state.previous_step, "...) is missing"));
  }
  PS_ASSIGN_OR_RETURN(EmbeddingShardState base, ReadResolved(fs, listing, *previous, depth + 1));
  return ApplyEmbeddingDelta(base, state, file.path);
}

// Sorts a table's rows by id (rows gathered from several files interleave).
void SortById(EmbeddingShardState* state) {
  std::vector<size_t> order(state->ids.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return state->ids[a] < state->ids[b]; });
  EmbeddingShardState sorted = *state;
  sorted.ids.clear();
  sorted.rows.clear();
  sorted.state.clear();
  for (size_t i : order) {
    sorted.ids.push_back(state->ids[i]);
    sorted.rows.insert(sorted.rows.end(), state->rows.begin() + i * state->dim,
                       state->rows.begin() + (i + 1) * state->dim);
    sorted.state.insert(sorted.state.end(), state->state.begin() + i * state->state_floats,
                        state->state.begin() + (i + 1) * state->state_floats);
  }
  *state = std::move(sorted);
}

}  // namespace

std::vector<EmbeddingCheckpointFile> ListEmbeddingCheckpoints(FileSystem& fs,
                                                              const std::string& dir) {
  std::vector<EmbeddingCheckpointFile> files;
  absl::StatusOr<std::vector<std::string>> names = fs.ListDir(dir);
  if (!names.ok()) return files;
  for (const std::string& name : *names) {
    if (std::optional<EmbeddingCheckpointFile> file = ParseName(dir, name)) files.push_back(*file);
  }
  std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) {
    return std::make_tuple(-a.step, a.table_index, a.shard_count, a.shard_id) <
           std::make_tuple(-b.step, b.table_index, b.shard_count, b.shard_id);
  });
  return files;
}

absl::Status WriteEmbeddingCheckpoints(FileSystem& fs, const std::string& dir,
                                       const std::vector<EmbeddingShardState>& tables,
                                       int64_t epoch) {
  PS_RETURN_IF_ERROR(CreateDirRecursively(fs, dir));
  for (const EmbeddingShardState& table : tables) {
    PS_ASSIGN_OR_RETURN(std::string bytes, EncodeEmbeddingCheckpoint(table, epoch));
    PS_RETURN_IF_ERROR(WriteFileAtomically(fs, EmbeddingCheckpointPath(dir, table), bytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<EmbeddingShardState>> LoadEmbeddingBucketAtStep(FileSystem& fs,
                                                                           const std::string& dir,
                                                                           int tables, int bucket,
                                                                           int bucket_count,
                                                                           int64_t step) {
  // table -> shard count -> the files of that cut (one per shard: FileAt's).
  const std::vector<EmbeddingCheckpointFile> listing = ListEmbeddingCheckpoints(fs, dir);
  std::map<int, std::map<int, std::vector<EmbeddingCheckpointFile>>> cuts;
  for (const EmbeddingCheckpointFile& file : listing) {
    if (file.step == step && file.table_index < tables &&
        FileAt(listing, file.table_index, file.shard_id, file.shard_count, step) == &file)
      cuts[file.table_index][file.shard_count].push_back(file);
  }
  std::vector<EmbeddingShardState> result;
  for (int t = 0; t < tables; ++t) {
    // A complete cut: every shard of `count` present. The one matching ours is cheapest.
    const std::vector<EmbeddingCheckpointFile>* chosen = nullptr;
    for (const auto& [count, files] : cuts[t]) {
      std::set<int> shards;
      for (const EmbeddingCheckpointFile& file : files) shards.insert(file.shard_id);
      if (static_cast<int>(shards.size()) != count) continue;
      if (chosen == nullptr || count == bucket_count) chosen = &files;
    }
    if (chosen == nullptr) {
      return absl::NotFoundError(absl::StrCat("no complete checkpoint of embedding table C", t + 1,
                                              " in ", dir, " at step ", step));
    }
    EmbeddingShardState& out = result.emplace_back();
    out.table_index = t;
    out.shard_id = bucket;
    out.shard_count = bucket_count;
    out.step = step;
    bool first = true;
    const bool same_cut = chosen->front().shard_count == bucket_count;
    for (const EmbeddingCheckpointFile& file : *chosen) {
      if (same_cut && file.shard_id != bucket) continue;
      PS_ASSIGN_OR_RETURN(EmbeddingShardState state, ReadResolved(fs, listing, file));
      if (first) {
        out.dim = state.dim;
        out.state_floats = state.state_floats;
        out.optimizer = state.optimizer;
        out.epoch = state.epoch;
        first = false;
      } else if (state.dim != out.dim || state.state_floats != out.state_floats ||
                 state.optimizer != out.optimizer) {
        return absl::DataLossError(
            absl::StrCat(file.path, ": rows of dim ", state.dim, " with ",
                         state.optimizer.empty() ? "unnamed" : state.optimizer,
                         " state where the other files of table C", t + 1, " have dim ", out.dim,
                         " with ", out.optimizer.empty() ? "unnamed" : out.optimizer, " state"));
      }
      out.epoch = std::max(out.epoch, state.epoch);
      if (same_cut) {  // the one file of this bucket: its rows as they are, not copied
        out.ids = std::move(state.ids);
        out.rows = std::move(state.rows);
        out.state = std::move(state.state);
        continue;
      }
      for (size_t i = 0; i < state.ids.size(); ++i) {
        if (EmbeddingShardOf(t, state.ids[i], bucket_count) != bucket) continue;
        out.ids.push_back(state.ids[i]);
        out.rows.insert(out.rows.end(), state.rows.begin() + i * state.dim,
                        state.rows.begin() + (i + 1) * state.dim);
        out.state.insert(out.state.end(), state.state.begin() + i * state.state_floats,
                         state.state.begin() + (i + 1) * state.state_floats);
      }
    }
    if (!same_cut) SortById(&out);
  }
  return result;
}

absl::Status CheckEmbeddingCheckpointAtStep(FileSystem& fs, const std::string& dir, int tables,
                                            int64_t step) {
  // Reading bucket 0 of 1 reads (and verifies) every file of a complete cut.
  return LoadEmbeddingBucketAtStep(fs, dir, tables, 0, 1, step).status();
}

absl::StatusOr<std::vector<EmbeddingShardState>> LoadNewestEmbeddingBucket(FileSystem& fs,
                                                                           const std::string& dir,
                                                                           int tables, int bucket,
                                                                           int bucket_count) {
  std::map<int64_t, std::vector<EmbeddingCheckpointFile>> by_step;
  const std::vector<EmbeddingCheckpointFile> listing = ListEmbeddingCheckpoints(fs, dir);
  for (const EmbeddingCheckpointFile& file : listing) {
    if (file.shard_id == bucket && file.shard_count == bucket_count && file.table_index < tables &&
        FileAt(listing, file.table_index, bucket, bucket_count, file.step) == &file)
      by_step[file.step].push_back(file);
  }
  std::optional<std::vector<EmbeddingShardState>> newest;
  for (const auto& [step, files] : by_step) {
    if (static_cast<int>(files.size()) != tables) continue;
    std::vector<EmbeddingShardState> states;
    absl::Status read = absl::OkStatus();
    for (const EmbeddingCheckpointFile& file : files) {
      absl::StatusOr<EmbeddingShardState> state = ReadResolved(fs, listing, file);
      if (!state.ok()) {
        read = state.status();
        break;
      }
      states.push_back(*std::move(state));
    }
    if (!read.ok()) {
      spdlog::warn("skipping the checkpoint of embedding shard {} of {} at step {}: {}", bucket,
                   bucket_count, step, read.ToString());
      continue;
    }
    std::sort(states.begin(), states.end(),
              [](const auto& a, const auto& b) { return a.table_index < b.table_index; });
    // An epoch's files may be of one step only if one epoch wrote them: the newest epoch
    // of its tables stands for the set.
    auto epoch_of = [](const std::vector<EmbeddingShardState>& set) {
      int64_t epoch = 0;
      for (const EmbeddingShardState& s : set) epoch = std::max(epoch, s.epoch);
      return epoch;
    };
    if (!newest.has_value() || std::make_pair(epoch_of(states), step) >
                                   std::make_pair(epoch_of(*newest), newest->front().step)) {
      newest = std::move(states);
    }
  }
  if (!newest.has_value()) {
    return absl::NotFoundError(absl::StrCat("no usable checkpoint of embedding shard ", bucket,
                                            " of ", bucket_count, " in ", dir));
  }
  return *std::move(newest);
}

int RemoveOldEmbeddingCheckpoints(FileSystem& fs, const std::string& dir, int bucket,
                                  int bucket_count, int keep, int64_t retain_from) {
  if (retain_from < 0) return 0;
  std::vector<EmbeddingCheckpointFile> files;  // this bucket's, newest first
  for (const EmbeddingCheckpointFile& file : ListEmbeddingCheckpoints(fs, dir)) {
    if (file.shard_id == bucket && file.shard_count == bucket_count) files.push_back(file);
  }
  // A step counts toward `keep` only if every file of it resolves by name back to a full
  // file: deltas whose base was lost are no restore target, and must not push the last
  // readable steps out.
  const auto resolvable = [&](const EmbeddingCheckpointFile& file) {
    const EmbeddingCheckpointFile* at = &file;
    for (int depth = 0; at != nullptr && at->previous_step >= 0; ++depth) {
      if (depth >= kMaxEmbeddingDeltaChain) return false;
      at = FileAt(files, at->table_index, bucket, bucket_count, at->previous_step);
    }
    return at != nullptr;
  };
  std::set<int64_t> unreadable;
  for (const EmbeddingCheckpointFile& file : files) {
    if (FileAt(files, file.table_index, bucket, bucket_count, file.step) == &file &&
        !resolvable(file))
      unreadable.insert(file.step);
  }
  std::set<int64_t> kept_steps;
  int readable_kept = 0;
  for (const EmbeddingCheckpointFile& file : files) {
    if (kept_steps.count(file.step) > 0) continue;
    const bool readable = unreadable.count(file.step) == 0;
    if ((readable && readable_kept < keep) || file.step >= retain_from) {
      kept_steps.insert(file.step);
      readable_kept += readable;
    }
  }
  // The steps the kept deltas change, back to full files: kept too. Newest first, so a
  // step added here is visited after the delta that needs it.
  std::set<std::string> kept_paths;
  for (const EmbeddingCheckpointFile& file : files) {
    if (kept_steps.count(file.step) == 0) continue;
    kept_paths.insert(file.path);
    if (file.previous_step >= 0) kept_steps.insert(file.previous_step);
  }
  int removed = 0;
  for (const EmbeddingCheckpointFile& file : files) {
    if (kept_paths.count(file.path) > 0) continue;
    if (fs.DeleteFile(file.path).ok()) ++removed;
  }
  return removed;
}

}  // namespace paramserver
