// One embedding table's rows on a server: made when a worker's first gradient for them
// arrives, updated by the row optimizers (ps/sparse_optimizer.h), bounded in count.
//
// Pulls only read: a row not made yet reads as its initial value (it would be made with
// that value), so every change happens in Apply, in the order the shard's log gives,
// and a backup applying the same log holds the same rows, the same recency order and
// the same sightings as its primary.
//
// Storage is compact: slots in slabs of kSlabSlots, each slot holding the row's id, its
// `dim` floats and its optimizer state (StateFloatsPerRow floats) side by side; an index
// from id to slot number that keeps no id of its own (ps/row_index.h: 8 bytes a bucket,
// a lookup confirmed by the id in the slot it reads anyway); and, where max_rows bounds the table,
// two links of an exact least-recently-updated list (without a bound nothing is evicted, and no
// order is kept: 8 bytes a row and three random writes an update saved). bytes_per_row() reports
// what a row costs against the minimum (4 * (dim + state floats per row); the id adds 8 to that,
// the index 10-20 at the loads it keeps).
//
// Capacity, from the spec:
//   max_rows   past it, the least recently updated row is evicted; it is made again,
//              from its initial value, if it is updated later. 0: no bound.
//   min_count  an id gets a row at the update that brings its sightings (updates whose
//              gradient holds it) to min_count; before that it reads as zeros (the
//              worker's sum makes it an empty bag) and its gradient is dropped.
//              Sightings are kept for at most max_pending ids; past that the tally
//              restarts (counted in pending_resets()).
//
// A row's initial value is a function of (seed, table, id) only: N(0, 1) per element,
// PyTorch's nn.EmbeddingBag default, from a SplitMix64 hash and Box-Muller, so every
// server, every replay and every restore makes the same row.
//
// Not thread-safe: its owner serialises calls (the const ones may run alongside each
// other).
#ifndef PARAMSERVER_PS_EMBEDDING_TABLE_H_
#define PARAMSERVER_PS_EMBEDDING_TABLE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "ps/row_index.h"
#include "ps/sparse_optimizer.h"

namespace paramserver {

struct EmbeddingTableOptions {
  int dim = 16;
  EmbeddingOptimizerOptions optimizer;
  uint64_t init_seed = 1;
  int table_index = 0;   // which table (C1 is 0): part of every row's initial value
  int64_t max_rows = 0;  // 0: unbounded (the spec's are over all servers, a shard's its share)
  int min_count = 1;     // 1: every id gets a row at its first pull
  int64_t max_pending = 1 << 20;
  // Whether evicted ids are remembered until ClearChanges (delta checkpoints read them);
  // off, RemovedSinceClear is empty and nothing grows with evictions.
  bool track_removals = false;
};

// Table `table_index`'s options in a job of `spec`, rows of `dim`: each of `settings`
// given, else the spec's (model.max_rows, over all servers, model.min_count,
// training.embedding_optimizer).
EmbeddingTableOptions EmbeddingTableOptionsFor(const ClusterSpec& spec, int table_index, int dim,
                                               const EmbeddingTableSettings& settings);

// The initial value of element `element` of row `id` of table `table_index`.
float InitialEmbeddingValue(uint64_t seed, int table_index, int64_t id, int element);
// The same for a whole row: row[e] = InitialEmbeddingValue(seed, table_index, id, e), bit
// for bit, with the row's share of the hashing done once.
void InitialEmbeddingRow(uint64_t seed, int table_index, int64_t id, absl::Span<float> row);

class EmbeddingTable {
 public:
  static constexpr int64_t kSlabSlots = 1 << 16;
  static constexpr uint32_t kNoMoreRecent = 0xffffffffu;  // CopyRecencyLinks' end

  explicit EmbeddingTable(EmbeddingTableOptions options);

  // Copies the rows of `ids` into `rows` (ids.size() * dim floats): a row not made yet
  // reads as its initial value, or as zeros while its id is short of min_count
  // sightings (then present[i] is false; `present` may be null). Changes nothing.
  void Pull(absl::Span<const int64_t> ids, absl::Span<float> rows,
            std::vector<bool>* present) const;

  // Applies `gradients` (ids.size() * dim floats, the step's row gradients) to the rows
  // of `ids` at job step `step`, making the rows of admitted ids first (see the
  // capacity rules above). INVALID_ARGUMENT, changing nothing, unless the ids are
  // strictly increasing (sorted, no repeat) and the sizes agree.
  absl::Status Apply(int64_t step, absl::Span<const int64_t> ids,
                     absl::Span<const float> gradients);

  // The first element (an index into `gradients`) that Apply(step, ids, gradients),
  // called now, would let take a row or its optimizer state out of the accepted range
  // (FirstUnsafeElement in ps/sparse_optimizer.h), a row not made yet counted from its
  // initial value and zero state; gradients.size() if none would. Changes no row; keeps
  // the initial values it drew (for ascending ids), which the next Apply takes instead of
  // drawing them again (a log, a square root and a cosine an element).
  // REQUIRES: gradients.size() == ids.size() * dim.
  size_t FirstUnsafeElement(int64_t step, absl::Span<const int64_t> ids,
                            absl::Span<const float> gradients);

  // Every row with its optimizer state, least recently updated first (Restore in this
  // order rebuilds the recency order too); without max_rows, in the order stored.
  void ForEachRow(const std::function<void(int64_t id, absl::Span<const float> row,
                                           absl::Span<const float> state)>& visit) const;
  // Appends every row's id, row and state to *ids, *values and *states in the order the
  // rows are stored, which is no order to rely on: the fastest full copy (a sequential
  // read of the slabs, where ForEachRow follows the LRU list's links about memory), for
  // a checkpoint that sorts them afterwards (SortRowsById).
  void AppendRowsAsStored(std::vector<int64_t>* ids, std::vector<float>* values,
                          std::vector<float>* states) const;
  // Appends every row's id to *ids in the order the rows are stored (a sequential read):
  // the ids an export sorts and then reads a page at a time (CopyHeldRows).
  void AppendIds(std::vector<int64_t>* ids) const;
  // Appends to *held_ids, and their rows to *rows (dim floats each), those of `ids` the
  // table holds a row for, in the order given. An id without a row (never made, short
  // of min_count, or evicted) is skipped. Changes nothing.
  void CopyHeldRows(absl::Span<const int64_t> ids, std::vector<int64_t>* held_ids,
                    std::vector<float>* rows) const;
  // The LRU list as links between the positions of AppendRowsAsStored's copy (into empty
  // vectors), for a copy that keeps the recency order (a replica's): *least_recent and
  // (*next_more_recent)[p], kNoMoreRecent after the most recent (and as *least_recent of
  // a table without rows); without max_rows, none (empty links: the order stored, as
  // OrderRowsByRecency and a backup take them). A sequential read of
  // the links; OrderRowsByRecency (common/checkpoint) walks them later, without the
  // shard's lock.
  void CopyRecencyLinks(std::vector<uint32_t>* next_more_recent, uint32_t* least_recent) const;
  // Puts a row with its state back (from a checkpoint or a replica) as the most recently
  // updated. INVALID_ARGUMENT on wrong sizes.
  absl::Status Restore(int64_t id, absl::Span<const float> row, absl::Span<const float> state);
  // Restore of each of `ids` in order, its row and state the i-th dim floats of `rows` and
  // state floats of `states`: the index made room for all of them first (built once at
  // its size, not grown by doubling) and asked of memory ahead. INVALID_ARGUMENT, changing
  // nothing, unless the sizes agree.
  absl::Status RestoreRows(absl::Span<const int64_t> ids, absl::Span<const float> rows,
                           absl::Span<const float> states);
  // The rows changed (updated, made or restored) since the last ClearChanges (or since
  // the table was made), in no order; and the ids evicted since, ascending (an id evicted
  // and made again is in both). What a delta checkpoint holds.
  void ForEachChangedRow(const std::function<void(int64_t id, absl::Span<const float> row,
                                                  absl::Span<const float> state)>& visit) const;
  std::vector<int64_t> RemovedSinceClear() const;
  void ClearChanges();
  // False once more ids were evicted since ClearChanges than are kept (the larger of
  // 2^16 and max_rows), or when evictions may happen untracked (max_rows without
  // track_removals): RemovedSinceClear is then incomplete.
  bool changes_complete() const {
    return !removals_overflowed_ && (options_.track_removals || options_.max_rows == 0);
  }
  // The ids short of min_count and their sightings (for a replica), and putting them back.
  void ForEachPending(const std::function<void(int64_t id, int32_t sightings)>& visit) const;
  void RestorePending(int64_t id, int32_t sightings) { sightings_[id] = sightings; }

  int dim() const { return options_.dim; }
  int64_t rows() const { return static_cast<int64_t>(index_.size()); }
  int64_t evicted_rows() const { return evicted_; }
  int64_t dropped_gradients() const { return dropped_; }
  int64_t pending_ids() const { return static_cast<int64_t>(sightings_.size()); }
  int64_t pending_resets() const { return pending_resets_; }
  // Bytes held per row (slabs, index, list links, changed flags) and the minimum a row
  // needs (its floats and its state).
  double bytes_per_row() const;
  int64_t minimum_bytes_per_row() const;

 private:
  static constexpr uint32_t kNone = RowIndex::kMissing;
  // A slot's first floats hold its row's id (memcpy: they are 4-byte aligned).
  static constexpr int kIdFloats = sizeof(int64_t) / sizeof(float);
  // A slot's neighbours in the LRU list, side by side: moving a row to the recent end
  // reads and writes one line per slot involved.
  struct Links {
    uint32_t prev = kNone;
    uint32_t next = kNone;
  };
  struct SlabDelete {
    void operator()(float* slab) const { ::operator delete[](slab, std::align_val_t(64)); }
  };
  // Where slot `slot` starts (its id), and its floats: the row, then its optimizer state.
  const float* SlotStart(uint32_t slot) const;
  float* SlotData(uint32_t slot) { return const_cast<float*>(SlotStart(slot)) + kIdFloats; }
  const float* SlotData(uint32_t slot) const { return SlotStart(slot) + kIdFloats; }
  int64_t IdAt(uint32_t slot) const;
  // IdAt as RowIndex takes it (the `id_at` of its lookups).
  auto SlotIds() const {
    return [this](uint32_t slot) { return IdAt(slot); };
  }
  // Slots made: every one holds a row (NewSlot reuses an evicted row's), numbered from 0.
  uint32_t slots() const { return static_cast<uint32_t>(changed_.size()); }
  // `id`'s slot, kNone if it has no row.
  uint32_t FindSlot(int64_t id) const;
  uint32_t NewSlot(int64_t id);  // evicting the least recently used row if full
  // Whether an id without a row reads as its initial value (and would get a row if updated now).
  bool Admitted(int64_t id) const;
  void Touch(uint32_t slot);  // to the most recently used end
  void Unlink(uint32_t slot);
  // Calls visit(i, slot) for each of `ids` in order (slot kNone where the id has no row)
  // until it returns false; each id's index bucket is asked of memory 2 * kRowsAhead ids
  // ahead and its slot's id and first `row_bytes` kRowsAhead ids ahead.
  template <typename Visit>
  void ForEachSlot(absl::Span<const int64_t> ids, size_t row_bytes, const Visit& visit) const;
  // Ask for a slot's links, or for its list neighbours' links, ahead of a Touch.
  void PrefetchLinks(uint32_t slot) const;
  void PrefetchNeighbours(uint32_t slot) const;

  const EmbeddingTableOptions options_;
  const int slot_floats_;  // the row and its state
  const int state_floats_;
  const int stride_floats_;  // a slot's floats, its id's included
  // Whether the LRU list is kept (max_rows > 0); else links_ stays empty.
  const bool keeps_recency_;
  RowIndex index_;
  absl::flat_hash_map<int64_t, int32_t> sightings_;          // ids not admitted yet
  std::vector<std::unique_ptr<float[], SlabDelete>> slabs_;  // 64-byte aligned
  std::vector<Links> links_;      // per slot: the LRU list; head_ is the least recently used
  std::vector<bool> changed_;     // per slot: changed since ClearChanges
  std::vector<int64_t> removed_;  // ids evicted since ClearChanges
  bool removals_overflowed_ = false;
  uint32_t head_ = kNone;
  uint32_t tail_ = kNone;
  int64_t evicted_ = 0;
  int64_t dropped_ = 0;
  int64_t pending_resets_ = 0;
  // Apply's working lists, kept between calls so that a step allocates nothing.
  std::vector<uint32_t> found_slots_;
  std::vector<float*> update_slots_;
  // The rows without a slot that the last FirstUnsafeElement drew, ascending by id, and
  // their initial values (dim floats each). Never stale: a row's initial value depends
  // on its id alone. Their room is kept for the next check up to kMostDrawnFloatsKept
  // floats (4 MiB), past which it is given back.
  static constexpr size_t kMostDrawnFloatsKept = size_t{1} << 20;
  std::vector<int64_t> drawn_ids_;
  std::vector<float> drawn_rows_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_PS_EMBEDDING_TABLE_H_
