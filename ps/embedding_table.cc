#include "ps/embedding_table.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/deterministic_random.h"
#include "common/base/status_macros.h"
#include "ps/memory_prefetch.h"

namespace paramserver {

EmbeddingTableOptions EmbeddingTableOptionsFor(const ClusterSpec& spec, int table_index, int dim,
                                               const EmbeddingTableSettings& settings) {
  EmbeddingTableOptions table;
  table.dim = dim;
  table.optimizer = settings.optimizer.value_or(spec.training.embedding_optimizer);
  table.init_seed = spec.model.init_seed;
  table.table_index = table_index;
  table.max_rows = settings.max_rows.value_or(spec.model.max_rows);
  table.min_count = settings.min_count.value_or(spec.model.min_count);
  table.track_removals = spec.checkpoint.embedding_deltas > 0;
  return table;
}

namespace {

// What every element of row `id` draws from.
uint64_t RowDrawBase(uint64_t seed, int table_index, int64_t id) {
  return SplitMix64(SplitMix64(SplitMix64(seed) ^ static_cast<uint64_t>(table_index)) ^
                    static_cast<uint64_t>(id));
}

float ElementDraw(uint64_t base, int element) {
  const uint64_t a = SplitMix64(base ^ (2 * static_cast<uint64_t>(element)));
  const uint64_t b = SplitMix64(base ^ (2 * static_cast<uint64_t>(element) + 1));
  return static_cast<float>(StandardNormal(a, b));
}

}  // namespace

float InitialEmbeddingValue(uint64_t seed, int table_index, int64_t id, int element) {
  return ElementDraw(RowDrawBase(seed, table_index, id), element);
}

void InitialEmbeddingRow(uint64_t seed, int table_index, int64_t id, absl::Span<float> row) {
  const uint64_t base = RowDrawBase(seed, table_index, id);
  for (size_t e = 0; e < row.size(); ++e) row[e] = ElementDraw(base, static_cast<int>(e));
}

EmbeddingTable::EmbeddingTable(EmbeddingTableOptions options)
    : options_(std::move(options)),
      slot_floats_(options_.dim + StateFloatsPerRow(options_.optimizer.type, options_.dim)),
      state_floats_(StateFloatsPerRow(options_.optimizer.type, options_.dim)),
      stride_floats_(kIdFloats + slot_floats_),
      keeps_recency_(options_.max_rows > 0) {}

const float* EmbeddingTable::SlotStart(uint32_t slot) const {
  return slabs_[slot / kSlabSlots].get() + static_cast<int64_t>(slot % kSlabSlots) * stride_floats_;
}

int64_t EmbeddingTable::IdAt(uint32_t slot) const {
  int64_t id;
  std::memcpy(&id, SlotStart(slot), sizeof(id));
  return id;
}

uint32_t EmbeddingTable::FindSlot(int64_t id) const { return index_.Find(id, SlotIds()); }

void EmbeddingTable::Unlink(uint32_t slot) {
  if (!keeps_recency_) return;
  const uint32_t before = links_[slot].prev, after = links_[slot].next;
  (before == kNone ? head_ : links_[before].next) = after;
  (after == kNone ? tail_ : links_[after].prev) = before;
  links_[slot] = Links{};
}

void EmbeddingTable::Touch(uint32_t slot) {
  if (!keeps_recency_ || tail_ == slot) return;
  if (links_[slot].prev != kNone || head_ == slot) Unlink(slot);
  links_[slot] = Links{tail_, kNone};
  (tail_ == kNone ? head_ : links_[tail_].next) = slot;
  tail_ = slot;
}

void EmbeddingTable::PrefetchLinks(uint32_t slot) const {
  if (keeps_recency_) __builtin_prefetch(&links_[slot], 1, 3);
}

void EmbeddingTable::PrefetchNeighbours(uint32_t slot) const {
  if (!keeps_recency_) return;
  const Links links = links_[slot];
  if (links.prev != kNone) __builtin_prefetch(&links_[links.prev], 1, 3);
  if (links.next != kNone) __builtin_prefetch(&links_[links.next], 1, 3);
}

uint32_t EmbeddingTable::NewSlot(int64_t id) {
  uint32_t slot;
  if (keeps_recency_ && rows() >= options_.max_rows && head_ != kNone) {
    // The least recently used row's slot is the new row's: no slot is ever free.
    const uint32_t victim = head_;
    const int64_t victim_id = IdAt(victim);
    Unlink(victim);
    index_.Erase(victim_id, victim);
    if (options_.track_removals && !removals_overflowed_) {
      removed_.push_back(victim_id);
      if (static_cast<int64_t>(removed_.size()) > std::max<int64_t>(1 << 16, options_.max_rows)) {
        removed_.clear();
        removed_.shrink_to_fit();
        removals_overflowed_ = true;
      }
    }
    ++evicted_;
    slot = victim;
  } else {
    slot = slots();
    if (slot % kSlabSlots == 0) {
      const size_t bytes = static_cast<size_t>(kSlabSlots) * stride_floats_ * sizeof(float);
      slabs_.emplace_back(static_cast<float*>(::operator new[](bytes, std::align_val_t(64))));
    }
    if (keeps_recency_) links_.push_back(Links{});
    changed_.push_back(false);
  }
  std::memcpy(const_cast<float*>(SlotStart(slot)), &id, sizeof(id));
  changed_[slot] = true;
  index_.Insert(id, slot);
  Touch(slot);
  return slot;
}

bool EmbeddingTable::Admitted(int64_t id) const {
  if (options_.min_count <= 1) return true;
  auto found = sightings_.find(id);
  return (found == sightings_.end() ? 0 : found->second) + 1 >= options_.min_count;
}

template <typename Visit>
void EmbeddingTable::ForEachSlot(absl::Span<const int64_t> ids, size_t row_bytes,
                                 const Visit& visit) const {
  index_.LookUpAhead(
      ids, SlotIds(),
      [&](uint32_t slot) {
        PrefetchForRead(SlotStart(slot), sizeof(float) * kIdFloats + row_bytes);
      },
      visit);
}

void EmbeddingTable::Pull(absl::Span<const int64_t> ids, absl::Span<float> rows,
                          std::vector<bool>* present) const {
  const int dim = options_.dim;
  if (present != nullptr) present->assign(ids.size(), true);
  ForEachSlot(ids, sizeof(float) * dim, [&](size_t i, uint32_t slot) {
    float* out = rows.data() + i * dim;
    if (slot != kNone) {
      std::memcpy(out, SlotData(slot), sizeof(float) * dim);
    } else if (Admitted(ids[i])) {
      InitialEmbeddingRow(options_.init_seed, options_.table_index, ids[i],
                          absl::MakeSpan(out, dim));
    } else {
      std::fill(out, out + dim, 0.0f);
      if (present != nullptr) (*present)[i] = false;
    }
    return true;
  });
}

absl::Status EmbeddingTable::Apply(int64_t step, absl::Span<const int64_t> ids,
                                   absl::Span<const float> gradients) {
  const int dim = options_.dim;
  if (gradients.size() != ids.size() * dim) {
    return absl::InvalidArgumentError(absl::StrCat("embedding push: ", ids.size(), " ids but ",
                                                   gradients.size(), " gradient floats (dim ", dim,
                                                   ")"));
  }
  for (size_t i = 1; i < ids.size(); ++i) {
    if (ids[i] <= ids[i - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("embedding push: ids must be strictly increasing; id ", ids[i],
                       " at position ", i, " follows ", ids[i - 1]));
    }
  }
  const RowUpdate update = PrepareRowUpdate(options_.optimizer, step);
  const size_t count = ids.size();
  // First every id's slot, as far as the index holds it, looked up ahead (LookUpAhead)
  // with its LRU links asked for. Nothing changes yet.
  found_slots_.resize(count);
  index_.LookUpAhead(
      ids, SlotIds(),
      [&](uint32_t slot) {
        PrefetchForRead(SlotStart(slot), sizeof(int64_t));  // its id, which confirms it
        PrefetchLinks(slot);
      },
      [&](size_t i, uint32_t slot) {
        found_slots_[i] = slot;
        return true;
      });
  // Then, in id order, each row is made or moved to the recent end of the LRU list
  // (its neighbours' links asked for kRowsAhead rows ahead). The rows' arithmetic comes
  // last, all together; unless this call makes so many rows that one it updated could be
  // evicted by a later one (more ids than max_rows): then each row is updated in turn.
  const bool update_together =
      options_.max_rows == 0 || static_cast<int64_t>(count) <= options_.max_rows;
  const int64_t evicted_before = evicted_;
  update_slots_.assign(update_together ? count : 0, nullptr);
  size_t drawn_at = 0;  // into drawn_ids_, which ascend as ids do
  for (size_t i = 0; i < count; ++i) {
    if (keeps_recency_ && i + kRowsAhead < count && found_slots_[i + kRowsAhead] != kNone) {
      PrefetchNeighbours(found_slots_[i + kRowsAhead]);
    }
    uint32_t slot = found_slots_[i];
    if (evicted_ != evicted_before) {
      // An eviction in this call may have taken a slot found above: look again.
      slot = FindSlot(ids[i]);
    }
    if (slot != kNone) {
      Touch(slot);
    } else {
      if (options_.min_count > 1) {
        if (static_cast<int64_t>(sightings_.size()) >= options_.max_pending &&
            !sightings_.contains(ids[i])) {
          sightings_.clear();
          ++pending_resets_;
        }
        if (++sightings_[ids[i]] < options_.min_count) {
          ++dropped_;
          continue;
        }
        sightings_.erase(ids[i]);
      }
      slot = NewSlot(ids[i]);
      float* data = SlotData(slot);
      // The initial value the push's check drew already, if it did (the same bits: a
      // function of the id alone); else drawn now.
      while (drawn_at < drawn_ids_.size() && drawn_ids_[drawn_at] < ids[i]) ++drawn_at;
      if (drawn_at < drawn_ids_.size() && drawn_ids_[drawn_at] == ids[i]) {
        std::copy_n(drawn_rows_.data() + drawn_at * dim, dim, data);
      } else {
        InitialEmbeddingRow(options_.init_seed, options_.table_index, ids[i],
                            absl::MakeSpan(data, dim));
      }
      InitializeRowState(options_.optimizer, dim, absl::MakeSpan(data + dim, state_floats_));
    }
    changed_[slot] = true;
    float* data = SlotData(slot);
    if (update_together) {
      update_slots_[i] = data;
    } else {
      ApplyRowUpdate(update, gradients.subspan(i * dim, dim), absl::MakeSpan(data, dim),
                     absl::MakeSpan(data + dim, state_floats_));
    }
  }
  if (update_together) ApplyRowUpdates(update, dim, update_slots_, gradients);
  return absl::OkStatus();
}

size_t EmbeddingTable::FirstUnsafeElement(int64_t step, absl::Span<const int64_t> ids,
                                          absl::Span<const float> gradients) {
  const int dim = options_.dim;
  const RowUpdate update = PrepareRowUpdate(options_.optimizer, step);
  const RowUpdateCheck check(update, dim);
  std::vector<float> fresh;  // a row not made yet: its initial value, then its initial state
  drawn_ids_.clear();
  drawn_rows_.clear();
  if (drawn_rows_.capacity() > kMostDrawnFloatsKept) {  // an outsized batch's: let it go
    std::vector<int64_t>().swap(drawn_ids_);
    std::vector<float>().swap(drawn_rows_);
  }
  size_t unsafe = gradients.size();
  ForEachSlot(ids, sizeof(float) * slot_floats_, [&](size_t i, uint32_t slot) {
    const float* data;
    if (slot != kNone) {
      data = SlotData(slot);
    } else {
      fresh.resize(slot_floats_);
      InitialEmbeddingRow(options_.init_seed, options_.table_index, ids[i],
                          absl::MakeSpan(fresh.data(), dim));
      InitializeRowState(options_.optimizer, dim,
                         absl::MakeSpan(fresh.data() + dim, state_floats_));
      data = fresh.data();
      if (drawn_ids_.empty() || drawn_ids_.back() < ids[i]) {  // kept ascending
        drawn_ids_.push_back(ids[i]);
        drawn_rows_.insert(drawn_rows_.end(), fresh.begin(), fresh.begin() + dim);
      }
    }
    const float* gradient = gradients.data() + i * dim;
    if (check.Accepted(gradient, data)) return true;
    const size_t element = paramserver::FirstUnsafeElement(
        update, absl::MakeConstSpan(gradient, dim), absl::MakeConstSpan(data, dim),
        absl::MakeConstSpan(data + dim, state_floats_));
    // The two agree (ps/sparse_optimizer_test); were they ever not to, the row is refused.
    unsafe = i * dim + (element < static_cast<size_t>(dim) ? element : 0);
    return false;
  });
  return unsafe;
}

void EmbeddingTable::ForEachRow(const std::function<void(int64_t, absl::Span<const float>,
                                                         absl::Span<const float>)>& visit) const {
  const auto visit_slot = [&](uint32_t slot) {
    const float* data = SlotData(slot);
    visit(IdAt(slot), absl::MakeConstSpan(data, options_.dim),
          absl::MakeConstSpan(data + options_.dim, state_floats_));
  };
  if (!keeps_recency_) {
    for (uint32_t slot = 0; slot < slots(); ++slot) visit_slot(slot);
    return;
  }
  for (uint32_t slot = head_; slot != kNone; slot = links_[slot].next) visit_slot(slot);
}

void EmbeddingTable::AppendRowsAsStored(std::vector<int64_t>* ids, std::vector<float>* values,
                                        std::vector<float>* states) const {
  const size_t dim = static_cast<size_t>(options_.dim);
  const size_t state_floats = static_cast<size_t>(state_floats_);
  const size_t at = ids->size();
  const size_t slots = this->slots();
  ids->resize(at + slots);
  values->resize(ids->size() * dim);
  states->resize(ids->size() * state_floats);
  for (size_t slot = 0; slot < slots; ++slot) {
    (*ids)[at + slot] = IdAt(static_cast<uint32_t>(slot));
    const float* data = SlotData(static_cast<uint32_t>(slot));
    // copy_n, not memcpy: a rule without state has none, and states->data() may be null.
    std::copy_n(data, dim, values->data() + (at + slot) * dim);
    std::copy_n(data + dim, state_floats, states->data() + (at + slot) * state_floats);
  }
}

void EmbeddingTable::AppendIds(std::vector<int64_t>* ids) const {
  ids->reserve(ids->size() + slots());
  for (uint32_t slot = 0; slot < slots(); ++slot) ids->push_back(IdAt(slot));  // each holds a row
}

void EmbeddingTable::CopyHeldRows(absl::Span<const int64_t> ids, std::vector<int64_t>* held_ids,
                                  std::vector<float>* rows) const {
  const size_t dim = static_cast<size_t>(options_.dim);
  ForEachSlot(ids, sizeof(float) * dim, [&](size_t i, uint32_t slot) {
    if (slot != kNone) {
      held_ids->push_back(ids[i]);
      const float* row = SlotData(slot);
      rows->insert(rows->end(), row, row + dim);
    }
    return true;
  });
}

void EmbeddingTable::CopyRecencyLinks(std::vector<uint32_t>* next_more_recent,
                                      uint32_t* least_recent) const {
  static_assert(kNone == kNoMoreRecent);
  // Every slot holds a row (NewSlot): a slot's position in AppendRowsAsStored's copy is
  // its index.
  if (!keeps_recency_) {
    // No order kept: no links, which every reader takes as the order stored.
    next_more_recent->clear();
    *least_recent = kNone;
    return;
  }
  const size_t slots = this->slots();
  next_more_recent->resize(slots);
  for (size_t slot = 0; slot < slots; ++slot) (*next_more_recent)[slot] = links_[slot].next;
  *least_recent = head_;
}

void EmbeddingTable::ForEachChangedRow(
    const std::function<void(int64_t, absl::Span<const float>, absl::Span<const float>)>& visit)
    const {
  for (uint32_t slot = 0; slot < changed_.size(); ++slot) {
    if (!changed_[slot]) continue;
    const float* data = SlotData(slot);
    visit(IdAt(slot), absl::MakeConstSpan(data, options_.dim),
          absl::MakeConstSpan(data + options_.dim, state_floats_));
  }
}

std::vector<int64_t> EmbeddingTable::RemovedSinceClear() const {
  std::vector<int64_t> removed = removed_;
  std::sort(removed.begin(), removed.end());
  removed.erase(std::unique(removed.begin(), removed.end()), removed.end());
  return removed;
}

void EmbeddingTable::ClearChanges() {
  changed_.assign(changed_.size(), false);
  removed_.clear();
  removals_overflowed_ = false;
}

void EmbeddingTable::ForEachPending(
    const std::function<void(int64_t id, int32_t sightings)>& visit) const {
  for (const auto& [id, sightings] : sightings_) visit(id, sightings);
}

absl::Status EmbeddingTable::Restore(int64_t id, absl::Span<const float> row,
                                     absl::Span<const float> state) {
  if (row.size() != static_cast<size_t>(options_.dim) ||
      state.size() != static_cast<size_t>(state_floats_)) {
    return absl::InvalidArgumentError(absl::StrCat("embedding row ", id, ": ", row.size(), "+",
                                                   state.size(), " floats, expected ", options_.dim,
                                                   "+", state_floats_));
  }
  uint32_t slot = FindSlot(id);
  if (slot != kNone) {
    Touch(slot);
  } else {
    slot = NewSlot(id);
  }
  float* data = SlotData(slot);
  changed_[slot] = true;
  std::copy(row.begin(), row.end(), data);
  std::copy(state.begin(), state.end(), data + options_.dim);
  return absl::OkStatus();
}

absl::Status EmbeddingTable::RestoreRows(absl::Span<const int64_t> ids,
                                         absl::Span<const float> rows,
                                         absl::Span<const float> states) {
  const size_t count = ids.size();
  if (rows.size() != count * options_.dim || states.size() != count * state_floats_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "embedding rows: ", count, " ids but ", rows.size(), " row floats and ", states.size(),
        " state floats, expected ", options_.dim, " and ", state_floats_, " a row"));
  }
  if (count == 0) return absl::OkStatus();
  int64_t rows_then = this->rows() + static_cast<int64_t>(count);
  if (options_.max_rows > 0) rows_then = std::min(rows_then, options_.max_rows);
  index_.Reserve(static_cast<size_t>(rows_then));
  changed_.reserve(static_cast<size_t>(rows_then));
  if (keeps_recency_) links_.reserve(static_cast<size_t>(rows_then));
  for (size_t i = 0; i < count; ++i) {
    if (i + 2 * kRowsAhead < count) index_.Prefetch(ids[i + 2 * kRowsAhead]);
    PS_RETURN_IF_ERROR(Restore(ids[i], rows.subspan(i * options_.dim, options_.dim),
                               states.subspan(i * state_floats_, state_floats_)));
  }
  return absl::OkStatus();
}

int64_t EmbeddingTable::minimum_bytes_per_row() const {
  return static_cast<int64_t>(sizeof(float)) * slot_floats_;
}

double EmbeddingTable::bytes_per_row() const {
  if (rows() == 0) return 0;
  const double slabs =
      static_cast<double>(slabs_.size()) * kSlabSlots * stride_floats_ * sizeof(float);
  const double per_slot = static_cast<double>(links_.capacity()) * sizeof(Links) +
                          static_cast<double>(changed_.capacity()) / 8;  // bits
  return (slabs + static_cast<double>(index_.bytes()) + per_slot) / static_cast<double>(rows());
}

}  // namespace paramserver
