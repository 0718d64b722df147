#include "ps/embedding_storage.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "ps/sparse_optimizer.h"

namespace paramserver {
namespace {

// Calls visit(t, ids, floats) for each table's part of `rows` and of a gradient of them.
template <typename Visit>
void ForEachTablePart(RowIdsView rows, const std::vector<EmbeddingTable>& tables,
                      const Visit& visit) {
  size_t id_at = 0, float_at = 0;
  for (size_t t = 0; t < tables.size(); ++t) {
    const size_t count = rows.counts[t];
    const size_t floats = count * tables[t].dim();
    if (!visit(t, rows.ids.subspan(id_at, count), float_at, floats)) return;
    id_at += count;
    float_at += floats;
  }
}

}  // namespace

EmbeddingStorage::EmbeddingStorage(int shard_id,
                                   std::shared_ptr<const EmbeddingShardOptions> options)
    : shard_id_(shard_id), options_(std::move(options)) {
  tables_.reserve(options_->tables.size());
  for (const EmbeddingTableOptions& table : options_->tables) tables_.emplace_back(table);
}

absl::Status EmbeddingStorage::CheckTablesFit(int shard_id, const EmbeddingShardOptions& options,
                                              const std::vector<EmbeddingShardState>& tables) {
  const std::vector<EmbeddingTableOptions>& ours = options.tables;
  if (tables.size() != ours.size()) {
    return absl::InvalidArgumentError(absl::StrCat("embedding shard ", shard_id, ": ",
                                                   tables.size(), " tables given; the model has ",
                                                   ours.size()));
  }
  for (size_t t = 0; t < tables.size(); ++t) {
    const EmbeddingShardState& table = tables[t];
    const int state_floats = StateFloatsPerRow(ours[t].optimizer.type, ours[t].dim);
    if (table.table_index != static_cast<int>(t) || table.dim != ours[t].dim ||
        table.state_floats != state_floats) {
      return absl::InvalidArgumentError(absl::StrCat(
          "embedding shard ", shard_id, ": table C", table.table_index + 1, " of dim ", table.dim,
          " with ", table.state_floats, " state floats per row does not fit table C", t + 1,
          " (dim ", ours[t].dim, ", ", state_floats, " state floats)"));
    }
    // Two optimizers may keep as many floats (adam's moments, ftrl's n and z): the name
    // says whose they are, where it was recorded.
    const absl::string_view optimizer = EmbeddingOptimizerName(ours[t].optimizer.type);
    if (!table.optimizer.empty() && table.optimizer != optimizer) {
      return absl::InvalidArgumentError(
          absl::StrCat("embedding shard ", shard_id, ": table C", t + 1, "'s rows hold ",
                       table.optimizer, " state; the table's optimizer is ", optimizer));
    }
    if (table.rows.size() != table.ids.size() * table.dim ||
        table.state.size() != table.ids.size() * table.state_floats) {
      return absl::InvalidArgumentError(absl::StrCat(
          "embedding shard ", shard_id, ": table C", t + 1, " has ", table.ids.size(), " ids but ",
          table.rows.size(), " row floats and ", table.state.size(), " state floats"));
    }
  }
  return absl::OkStatus();
}

absl::Status EmbeddingStorage::Restore(const std::vector<EmbeddingShardState>& tables) {
  PS_RETURN_IF_ERROR(CheckTablesFit(shard_id_, *options_, tables));
  for (size_t t = 0; t < tables.size(); ++t) {
    const EmbeddingShardState& table = tables[t];
    PS_RETURN_IF_ERROR(tables_[t].RestoreRows(table.ids, table.rows, table.state));
  }
  return absl::OkStatus();
}

TableSightings EmbeddingStorage::Sightings() const {
  TableSightings sightings(tables_.size());
  for (size_t t = 0; t < tables_.size(); ++t) {
    tables_[t].ForEachPending(
        [&](int64_t id, int32_t count) { sightings[t].emplace_back(id, count); });
  }
  return sightings;
}

void EmbeddingStorage::RestoreSightings(const TableSightings& sightings) {
  for (size_t t = 0; t < sightings.size() && t < tables_.size(); ++t) {
    for (const auto& [id, count] : sightings[t]) tables_[t].RestorePending(id, count);
  }
}

absl::Status EmbeddingStorage::CheckGradientShape(const CheckedRowIds& rows,
                                                  absl::Span<const float> gradient) const {
  if (!rows.CheckedFor(options_->shape)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", shard_id_, " is an embedding shard: a push names its rows' ids",
                     rows.empty() ? "" : " (these were not checked for it)"));
  }
  const int64_t expected = RowFloats(rows.view(), options_->shape.dims);
  if (static_cast<int64_t>(gradient.size()) != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "embedding shard ", shard_id_, ": the gradient has ", gradient.size(),
        " floats; the rows of the ", rows.view().ids.size(), " ids sent have ", expected));
  }
  return absl::OkStatus();
}

size_t EmbeddingStorage::FirstUnsafeElement(int64_t step, RowIdsView rows,
                                            const StepHyperparameters&,
                                            absl::Span<const float> gradient) {
  size_t unsafe = gradient.size();
  ForEachTablePart(
      rows, tables_, [&](size_t t, absl::Span<const int64_t> ids, size_t float_at, size_t floats) {
        const size_t element =
            tables_[t].FirstUnsafeElement(step, ids, gradient.subspan(float_at, floats));
        if (element < floats) unsafe = float_at + element;
        return element >= floats;
      });
  return unsafe;
}

std::string EmbeddingStorage::DescribeElement(RowIdsView rows, size_t i) const {
  std::string where;
  ForEachTablePart(rows, tables_,
                   [&](size_t t, absl::Span<const int64_t> ids, size_t float_at, size_t floats) {
                     if (i >= float_at + floats) return true;
                     const size_t dim = tables_[t].dim();
                     where = absl::StrCat(" (table C", t + 1, ", id ", ids[(i - float_at) / dim],
                                          ", element ", (i - float_at) % dim, ")");
                     return false;
                   });
  return where;
}

absl::Status EmbeddingStorage::PrepareFor(const StepHyperparameters& settings) {
  if (settings.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "embedding shard ", shard_id_,
      " was sent a step's param_groups settings: its tables train "
      "with training.embedding_optimizer, and a script's optimizer sets dense parameters only"));
}

absl::Status EmbeddingStorage::Apply(int64_t step, RowIdsView rows, const StepHyperparameters&,
                                     absl::Span<const float> gradient) {
  absl::Status applied;
  ForEachTablePart(rows, tables_,
                   [&](size_t t, absl::Span<const int64_t> ids, size_t float_at, size_t floats) {
                     applied = tables_[t].Apply(step, ids, gradient.subspan(float_at, floats));
                     return applied.ok();
                   });
  if (applied.ok()) return applied;
  return absl::InternalError(absl::StrCat("embedding shard ", shard_id_, ": update ", step,
                                          " failed part way: ", applied.message()));
}

void EmbeddingStorage::Mean(const std::vector<const CheckedRowIds*>& rows,
                            const std::vector<absl::Span<const float>>& gradients,
                            CheckedRowIds* mean_rows, std::vector<float>* mean) const {
  MeanSparseGradients(rows, gradients, options_->shape, static_cast<int>(gradients.size()),
                      mean_rows, mean);
}

void EmbeddingStorage::AppendValues(RowIdsView rows, WireDtype encoding, std::string* bytes) const {
  std::vector<float> values(RowFloats(rows, options_->shape.dims));
  ForEachTablePart(
      rows, tables_, [&](size_t t, absl::Span<const int64_t> ids, size_t float_at, size_t floats) {
        tables_[t].Pull(ids, absl::MakeSpan(values).subspan(float_at, floats), nullptr);
        return true;
      });
  AppendEncoded(encoding, values, bytes);
}

void EmbeddingStorage::Save(int64_t step, RowOrder order, ShardState* state) const {
  SaveRows(step, order, /*previous_step=*/-1, state);
}

void EmbeddingStorage::SaveChanges(int64_t step, int64_t previous_step, ShardState* state) const {
  SaveRows(step, RowOrder::kAsStored, previous_step, state);
}

void EmbeddingStorage::ClearChanges() {
  for (EmbeddingTable& table : tables_) table.ClearChanges();
}

bool EmbeddingStorage::ChangesComplete() const {
  for (const EmbeddingTable& table : tables_) {
    if (!table.changes_complete()) return false;
  }
  return true;
}

void EmbeddingStorage::SaveRows(int64_t step, RowOrder order, int64_t previous_step,
                                ShardState* state) const {
  state->step = step;
  std::vector<EmbeddingShardState>& states = state->tables;
  states.clear();
  for (size_t t = 0; t < tables_.size(); ++t) {
    EmbeddingShardState& out = states.emplace_back();
    const EmbeddingTableOptions& table = options_->tables[t];
    out.table_index = static_cast<int>(t);
    out.dim = table.dim;
    out.state_floats = StateFloatsPerRow(table.optimizer.type, table.dim);
    out.optimizer = std::string(EmbeddingOptimizerName(table.optimizer.type));
    out.shard_id = options_->shape.bucket;
    out.shard_count = options_->shape.bucket_count;
    out.step = step;
    out.previous_step = previous_step;
    // This runs under the shard's lock: one copy of the rows, nothing sorted here. A
    // 10^8-row shard moves gigabytes.
    const auto append = [&out](int64_t id, absl::Span<const float> row,
                               absl::Span<const float> row_state) {
      out.ids.push_back(id);
      out.rows.insert(out.rows.end(), row.begin(), row.end());
      out.state.insert(out.state.end(), row_state.begin(), row_state.end());
    };
    if (previous_step >= 0) {
      tables_[t].ForEachChangedRow(append);
      out.removed_ids = tables_[t].RemovedSinceClear();
    } else {
      // Every order starts from the copy as stored, a sequential read of the slabs; the
      // LRU list's order comes from its links, copied as stored too (walking the list
      // itself reads every row's place in memory one after another: 2 s at 10^7 rows).
      tables_[t].AppendRowsAsStored(&out.ids, &out.rows, &out.state);
      if (order != RowOrder::kAsStored) {
        static_assert(EmbeddingTable::kNoMoreRecent == kNoMoreRecentRow);
        tables_[t].CopyRecencyLinks(&out.next_more_recent, &out.least_recent);
      }
    }
  }
}

absl::Status EmbeddingStorage::CheckTableIndex(int table) const {
  if (table < 0 || table >= static_cast<int>(tables_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", shard_id_, " holds no rows of table index ", table));
  }
  return absl::OkStatus();
}

absl::Status EmbeddingStorage::AppendRowIds(int table, bool from_start, int64_t after_id,
                                            std::vector<int64_t>* ids) const {
  PS_RETURN_IF_ERROR(CheckTableIndex(table));
  const size_t at = ids->size();
  tables_[table].AppendIds(ids);
  if (!from_start) {
    ids->erase(std::remove_if(ids->begin() + at, ids->end(),
                              [after_id](int64_t id) { return id <= after_id; }),
               ids->end());
  }
  return absl::OkStatus();
}

absl::Status EmbeddingStorage::CopyHeldRows(int table, absl::Span<const int64_t> ids,
                                            std::vector<int64_t>* held_ids,
                                            std::vector<float>* rows) const {
  PS_RETURN_IF_ERROR(CheckTableIndex(table));
  tables_[table].CopyHeldRows(ids, held_ids, rows);
  return absl::OkStatus();
}

EmbeddingCounters EmbeddingStorage::counters() const {
  EmbeddingCounters counters;
  for (const EmbeddingTable& table : tables_) {
    counters.rows += table.rows();
    counters.evicted_rows += table.evicted_rows();
    counters.dropped_gradients += table.dropped_gradients();
    counters.pending_ids += table.pending_ids();
    counters.bytes += table.bytes_per_row() * static_cast<double>(table.rows());
    counters.minimum_bytes += table.minimum_bytes_per_row() * table.rows();
  }
  return counters;
}

}  // namespace paramserver
