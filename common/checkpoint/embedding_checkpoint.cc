#include "common/checkpoint/embedding_checkpoint.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/checkpoint/file_bytes.h"
#include "common/wire/shard_layout.h"
#include "common/wire/tensor_codec.h"

namespace paramserver {
namespace {

// PSEMB003 adds the optimizer's name after skipped_steps; PSEMB002 adds skipped_steps after
// the row count. PSEMB002 (the optimizer unknown) and PSEMB001 (none skipped) are still read.
constexpr char kDeltaMagic[] = "PSEMB004";
constexpr char kMagic[] = "PSEMB003";
constexpr char kUnnamedMagic[] = "PSEMB002";
constexpr char kUnskippedMagic[] = "PSEMB001";
constexpr size_t kMagicSize = 8;
constexpr size_t kUnskippedHeaderSize = kMagicSize + 5 * 4 + 3 * 8;

// Why `state`'s ids, sizes or name are not a shard's, or "" if they are.
std::string Problem(const EmbeddingShardState& state) {
  if (state.dim < 1 || state.state_floats < 0 || state.shard_count < 1 || state.shard_id < 0 ||
      state.shard_id >= state.shard_count || state.table_index < 0) {
    return "bad dimensions or shard numbers";
  }
  if (state.optimizer.size() > kMaxEmbeddingOptimizerName) {
    return absl::StrCat("an optimizer name of ", state.optimizer.size(), " bytes");
  }
  const size_t n = state.ids.size();
  if (state.rows.size() != n * state.dim || state.state.size() != n * state.state_floats) {
    return "row data does not match the ids";
  }
  if (!state.next_more_recent.empty()) return "rows still to be put in order of recency";
  if (state.previous_step < -1 || state.previous_step >= state.step) {
    return absl::StrCat("a delta of step ", state.previous_step, " at step ", state.step);
  }
  if (!state.is_delta() && !state.removed_ids.empty()) return "a full checkpoint with removed ids";
  for (size_t i = 0; i < state.removed_ids.size(); ++i) {
    const int64_t id = state.removed_ids[i];
    if (i > 0 && id <= state.removed_ids[i - 1]) {
      return absl::StrCat("removed id ", id, " does not follow ", state.removed_ids[i - 1]);
    }
    if (EmbeddingShardOf(state.table_index, id, state.shard_count) != state.shard_id) {
      return absl::StrCat("removed id ", id, " belongs to another shard");
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (i > 0 && state.ids[i] <= state.ids[i - 1]) {
      return absl::StrCat("id ", state.ids[i], " does not follow ", state.ids[i - 1]);
    }
    if (EmbeddingShardOf(state.table_index, state.ids[i], state.shard_count) != state.shard_id) {
      return absl::StrCat("id ", state.ids[i], " belongs to another shard");
    }
  }
  return "";
}

}  // namespace

std::string EmbeddingCheckpointPath(const std::string& dir, const EmbeddingShardState& state) {
  return absl::StrCat(dir, "/emb-", state.table_index, "-shard-", state.shard_id, "-of-",
                      state.shard_count, "-step-", state.step,
                      state.is_delta() ? absl::StrCat("-after-", state.previous_step) : "",
                      ".ckpt");
}

namespace {

// Puts the row now at position from(at) at position `at`, for each at, gathered into new
// buffers: reads from many places at once, where moving the rows in place would follow
// the permutation's cycles one dependent read at a time (measured 2.3 s against 1.4 s at
// 4 x 10^6 rows). REQUIRES: `from` is a permutation of the positions.
template <typename From>
void GatherRows(EmbeddingShardState* state, From from) {
  const size_t n = state->ids.size();
  const size_t dim = static_cast<size_t>(state->dim);
  const size_t state_floats = static_cast<size_t>(state->state_floats);
  std::vector<int64_t> ids(n);
  std::vector<float> rows(state->rows.size()), row_state(state->state.size());
  for (size_t at = 0; at < n; ++at) {
    const size_t row = from(at);
    ids[at] = state->ids[row];
    std::copy_n(state->rows.data() + row * dim, dim, rows.data() + at * dim);
    std::copy_n(state->state.data() + row * state_floats, state_floats,
                row_state.data() + at * state_floats);
  }
  state->ids = std::move(ids);
  state->rows = std::move(rows);
  state->state = std::move(row_state);
}

}  // namespace

void SortRowsById(EmbeddingShardState* state) {
  const std::vector<int64_t>& ids = state->ids;
  if (std::is_sorted(ids.begin(), ids.end())) return;
  std::vector<std::pair<int64_t, size_t>> order(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) order[i] = {ids[i], i};
  std::sort(order.begin(), order.end());
  GatherRows(state, [&order](size_t at) { return order[at].second; });
}

absl::Status OrderRowsByRecency(EmbeddingShardState* state) {
  if (state->next_more_recent.empty()) return absl::OkStatus();
  const size_t n = state->ids.size();
  const std::vector<uint32_t>& next = state->next_more_recent;
  if (next.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("the recency links of table C",
                                                   state->table_index + 1, ": ", next.size(),
                                                   " links for ", n, " rows"));
  }
  std::vector<uint32_t> order;
  order.reserve(n);
  std::vector<bool> visited(n, false);
  for (uint32_t at = state->least_recent; at != kNoMoreRecentRow; at = next[at]) {
    if (at >= n || visited[at]) {
      return absl::InvalidArgumentError(
          absl::StrCat("the recency links of table C", state->table_index + 1,
                       " do not lead through every row once: row position ", at, " after ",
                       order.size(), " rows"));
    }
    visited[at] = true;
    order.push_back(at);
  }
  if (order.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("the recency links of table C",
                                                   state->table_index + 1, " reach ", order.size(),
                                                   " of its ", n, " rows"));
  }
  GatherRows(state, [&order](size_t at) { return order[at]; });
  state->next_more_recent = {};
  state->least_recent = 0;
  return absl::OkStatus();
}

absl::StatusOr<std::string> EncodeEmbeddingCheckpoint(const EmbeddingShardState& state) {
  return EncodeEmbeddingCheckpoint(state, state.epoch);
}

absl::StatusOr<std::string> EncodeEmbeddingCheckpoint(const EmbeddingShardState& state,
                                                      int64_t epoch) {
  if (const std::string problem = Problem(state); !problem.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("embedding shard ", state.shard_id, " of table ",
                                                   state.table_index, ": ", problem));
  }
  // Sized once: a 10^8-row shard's file is gigabytes, and growing it by doubling copied
  // it about twice over.
  const size_t row_bytes = 8 + 4 * (static_cast<size_t>(state.dim) + state.state_floats);
  std::string bytes;
  bytes.reserve(kUnskippedHeaderSize + 8 + 4 + state.optimizer.size() +
                (state.is_delta() ? 16 + 8 * state.removed_ids.size() : 0) +
                state.ids.size() * row_bytes + 4);
  bytes.append(state.is_delta() ? kDeltaMagic : kMagic, kMagicSize);
  for (int32_t field :
       {state.table_index, state.dim, state.state_floats, state.shard_id, state.shard_count}) {
    AppendLittleEndian<int32_t>(field, &bytes);
  }
  AppendLittleEndian<int64_t>(state.step, &bytes);
  AppendLittleEndian<int64_t>(epoch, &bytes);
  AppendLittleEndian<int64_t>(static_cast<int64_t>(state.ids.size()), &bytes);
  AppendLittleEndian<int64_t>(state.skipped_steps, &bytes);
  AppendLittleEndian<int32_t>(static_cast<int32_t>(state.optimizer.size()), &bytes);
  bytes += state.optimizer;
  if (state.is_delta()) {
    AppendLittleEndian<int64_t>(state.previous_step, &bytes);
    AppendLittleEndian<int64_t>(static_cast<int64_t>(state.removed_ids.size()), &bytes);
    for (int64_t id : state.removed_ids) AppendLittleEndian<int64_t>(id, &bytes);
  }
  for (size_t i = 0; i < state.ids.size(); ++i) {
    AppendLittleEndian<int64_t>(state.ids[i], &bytes);
    AppendFloatsLittleEndian(absl::MakeConstSpan(state.rows.data() + i * state.dim, state.dim),
                             &bytes);
    AppendFloatsLittleEndian(
        absl::MakeConstSpan(state.state.data() + i * state.state_floats, state.state_floats),
        &bytes);
  }
  AppendLittleEndian<uint32_t>(Crc32Of(bytes.data(), bytes.size()), &bytes);
  return bytes;
}

absl::StatusOr<EmbeddingShardState> ParseEmbeddingCheckpoint(absl::string_view bytes,
                                                             absl::string_view source) {
  const auto corrupt = [&](const std::string& problem) {
    return absl::DataLossError(absl::StrCat(source, ": corrupt embedding checkpoint: ", problem));
  };
  const auto magic_is = [&](const char* magic) {
    return bytes.size() >= kMagicSize && std::memcmp(bytes.data(), magic, kMagicSize) == 0;
  };
  const bool delta = magic_is(kDeltaMagic);
  const bool with_name = delta || magic_is(kMagic);
  const bool with_skips = with_name || magic_is(kUnnamedMagic);
  size_t header_size = kUnskippedHeaderSize + (with_skips ? 8 : 0) + (with_name ? 4 : 0);
  if (bytes.size() < header_size + 4 || !(with_skips || magic_is(kUnskippedMagic))) {
    return corrupt("not an embedding checkpoint (bad magic or too short)");
  }
  EmbeddingShardState state;
  state.table_index = ReadLittleEndian<int32_t>(bytes, kMagicSize);
  state.dim = ReadLittleEndian<int32_t>(bytes, kMagicSize + 4);
  state.state_floats = ReadLittleEndian<int32_t>(bytes, kMagicSize + 8);
  state.shard_id = ReadLittleEndian<int32_t>(bytes, kMagicSize + 12);
  state.shard_count = ReadLittleEndian<int32_t>(bytes, kMagicSize + 16);
  state.step = ReadLittleEndian<int64_t>(bytes, kMagicSize + 20);
  state.epoch = ReadLittleEndian<int64_t>(bytes, kMagicSize + 28);
  const int64_t count = ReadLittleEndian<int64_t>(bytes, kMagicSize + 36);
  if (with_skips) state.skipped_steps = ReadLittleEndian<int64_t>(bytes, kMagicSize + 44);
  if (with_name) {
    const int32_t name_bytes = ReadLittleEndian<int32_t>(bytes, kMagicSize + 52);
    if (name_bytes < 0 || static_cast<size_t>(name_bytes) > kMaxEmbeddingOptimizerName ||
        bytes.size() < header_size + name_bytes + 4) {
      return corrupt(absl::StrCat("an optimizer name of ", name_bytes, " bytes"));
    }
    state.optimizer = std::string(bytes.substr(header_size, name_bytes));
    header_size += name_bytes;
  }
  if (delta) {
    if (bytes.size() < header_size + 16 + 4) return corrupt("a delta's header is cut short");
    state.previous_step = ReadLittleEndian<int64_t>(bytes, header_size);
    const int64_t removed = ReadLittleEndian<int64_t>(bytes, header_size + 8);
    header_size += 16;
    if (removed < 0 || static_cast<uint64_t>(removed) > (bytes.size() - header_size - 4) / 8) {
      return corrupt(
          absl::StrCat(removed, " removed ids do not fit the file's ", bytes.size(), " bytes"));
    }
    state.removed_ids.resize(static_cast<size_t>(removed));
    for (int64_t i = 0; i < removed; ++i) {
      state.removed_ids[i] = ReadLittleEndian<int64_t>(bytes, header_size);
      header_size += 8;
    }
    if (state.previous_step < 0) return corrupt("a delta of a negative step");
  }
  if (state.dim < 1 || state.dim > (1 << 16) || state.state_floats < 0 ||
      state.state_floats > (1 << 18) || count < 0) {
    return corrupt("bad dimensions");
  }
  if (state.skipped_steps < 0 || state.skipped_steps > state.step) {
    return corrupt(absl::StrCat(state.skipped_steps, " skipped of ", state.step, " steps"));
  }
  const uint64_t row_bytes = 8 + 4 * (uint64_t(state.dim) + uint64_t(state.state_floats));
  const uint64_t body = bytes.size() - header_size - 4;
  if (uint64_t(count) > body / row_bytes || uint64_t(count) * row_bytes != body) {
    return corrupt(absl::StrCat(count, " rows do not fit the file's ", bytes.size(), " bytes"));
  }
  if (ReadLittleEndian<uint32_t>(bytes, bytes.size() - 4) !=
      Crc32Of(bytes.data(), bytes.size() - 4)) {
    return corrupt("checksum mismatch");
  }
  state.ids.resize(count);
  state.rows.resize(count * state.dim);
  state.state.resize(count * state.state_floats);
  size_t at = header_size;
  for (int64_t i = 0; i < count; ++i) {
    state.ids[i] = ReadLittleEndian<int64_t>(bytes, at);
    at += 8;
    DecodeFloatsLittleEndian(bytes.substr(at, 4 * state.dim), state.rows.data() + i * state.dim);
    at += 4 * state.dim;
    DecodeFloatsLittleEndian(bytes.substr(at, 4 * state.state_floats),
                             state.state.data() + i * state.state_floats);
    at += 4 * state.state_floats;
  }
  if (const std::string problem = Problem(state); !problem.empty()) return corrupt(problem);
  return state;
}

absl::StatusOr<EmbeddingShardState> ApplyEmbeddingDelta(const EmbeddingShardState& base,
                                                        const EmbeddingShardState& delta,
                                                        absl::string_view source) {
  if (base.is_delta() || base.step != delta.previous_step ||
      base.table_index != delta.table_index || base.shard_id != delta.shard_id ||
      base.shard_count != delta.shard_count || base.dim != delta.dim ||
      base.state_floats != delta.state_floats || base.optimizer != delta.optimizer) {
    return absl::DataLossError(
        absl::StrCat(source, ": a delta of table ", delta.table_index, " shard ", delta.shard_id,
                     " of ", delta.shard_count, " changing step ", delta.previous_step, " (dim ",
                     delta.dim, ", ", delta.optimizer, "), applied to step ", base.step,
                     " of table ", base.table_index, " shard ", base.shard_id, " of ",
                     base.shard_count, " (dim ", base.dim, ", ", base.optimizer, ")"));
  }
  EmbeddingShardState out = delta;
  out.previous_step = -1;
  out.removed_ids.clear();
  out.ids.clear();
  out.rows.clear();
  out.state.clear();
  const size_t dim = static_cast<size_t>(base.dim);
  const size_t state_floats = static_cast<size_t>(base.state_floats);
  const auto take = [&](const EmbeddingShardState& from, size_t i) {
    out.ids.push_back(from.ids[i]);
    out.rows.insert(out.rows.end(), from.rows.begin() + i * dim, from.rows.begin() + (i + 1) * dim);
    out.state.insert(out.state.end(), from.state.begin() + i * state_floats,
                     from.state.begin() + (i + 1) * state_floats);
  };
  // A merge of three ascending lists: the base's rows, less the removed, with the changed.
  size_t b = 0, c = 0, r = 0;
  while (b < base.ids.size() || c < delta.ids.size()) {
    const bool from_base =
        c == delta.ids.size() || (b < base.ids.size() && base.ids[b] < delta.ids[c]);
    if (!from_base) {
      if (b < base.ids.size() && base.ids[b] == delta.ids[c]) ++b;  // replaced
      take(delta, c++);
      continue;
    }
    while (r < delta.removed_ids.size() && delta.removed_ids[r] < base.ids[b]) ++r;
    if (r < delta.removed_ids.size() && delta.removed_ids[r] == base.ids[b]) {
      ++b;
      continue;
    }
    take(base, b++);
  }
  return out;
}

std::vector<EmbeddingShardState> RehashEmbeddingShards(
    const std::vector<EmbeddingShardState>& shards, int shard_count) {
  std::vector<EmbeddingShardState> result(shard_count);
  if (shards.empty()) return result;
  const EmbeddingShardState& first = shards.front();
  // Every row once, by id, then dealt to its new shard (ascending ids stay ascending).
  std::vector<std::pair<int64_t, std::pair<size_t, size_t>>> all;  // id -> (shard, row)
  for (size_t s = 0; s < shards.size(); ++s) {
    for (size_t i = 0; i < shards[s].ids.size(); ++i) all.push_back({shards[s].ids[i], {s, i}});
  }
  std::sort(all.begin(), all.end());
  for (int id = 0; id < shard_count; ++id) {
    EmbeddingShardState& shard = result[id];
    shard.table_index = first.table_index;
    shard.dim = first.dim;
    shard.state_floats = first.state_floats;
    shard.shard_id = id;
    shard.shard_count = shard_count;
    shard.step = first.step;
    shard.skipped_steps = first.skipped_steps;
    shard.epoch = first.epoch;
    shard.optimizer = first.optimizer;
  }
  for (const auto& [row_id, where] : all) {
    const EmbeddingShardState& from = shards[where.first];
    EmbeddingShardState& to = result[EmbeddingShardOf(first.table_index, row_id, shard_count)];
    to.ids.push_back(row_id);
    to.rows.insert(to.rows.end(), from.rows.begin() + where.second * from.dim,
                   from.rows.begin() + (where.second + 1) * from.dim);
    to.state.insert(to.state.end(), from.state.begin() + where.second * from.state_floats,
                    from.state.begin() + (where.second + 1) * from.state_floats);
  }
  return result;
}

}  // namespace paramserver
