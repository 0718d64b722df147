// An embedding table's index: from a row's id to the number of the slot that holds the
// row, in 8 bytes a bucket. The id itself is not stored here: the slot holds it (the
// table writes it beside the row), so a lookup confirms its answer where it reads the
// row anyway, and the index costs 8 / load bytes a row (10-20 B at the loads it keeps,
// 2/5 to 4/5) where a map of (id, slot) pairs costs 17 / load (absl's, 19-39 B).
//
// Open addressing with linear probing over 2^k buckets, at most 4/5 full. Each bucket
// holds a slot number and a 32-bit tag from the id's hash (SplitMix64); the bucket a
// tag starts from is given by the tag's top bits, so growing and erasing need nothing
// but the buckets (no id is read). The ids a probe meets with the same start share
// those bits, so the tag's other 32 - log2(buckets) bits tell them apart: a lookup that
// finds a bucket with its tag confirms it with the slot's id (`id_at`), and goes on
// past a bucket whose slot holds another id. That costs one slot read more in about
// size() / 2^32 of the lookups: 2% at 10^8 ids, 23% at 10^9 in one index (spread such a
// table over more shards). Erasing shifts the buckets after the hole
// back (no tombstones), so a table that evicts keeps its probes short.
//
// Not thread-safe: its owner serialises changes (lookups may run alongside lookups).
#ifndef PARAMSERVER_PS_ROW_INDEX_H_
#define PARAMSERVER_PS_ROW_INDEX_H_

#include <algorithm>
#include <array>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "common/base/deterministic_random.h"
#include "ps/memory_prefetch.h"

namespace paramserver {

// The tag of an id: the top half of its SplitMix64 hash.
struct SplitMixRowTag {
  uint32_t operator()(int64_t id) const {
    return static_cast<uint32_t>(SplitMix64(static_cast<uint64_t>(id)) >> 32);
  }
};

// `TagOf`: the tag function (tests give one that makes tags collide).
template <typename TagOf = SplitMixRowTag>
class BasicRowIndex {
 public:
  static constexpr uint32_t kMissing = 0xffffffffu;

  size_t size() const { return size_; }
  size_t bucket_count() const { return buckets_.size(); }
  // The bytes the buckets take.
  size_t bytes() const { return buckets_.capacity() * sizeof(Bucket); }

  // Room for `count` ids without growing.
  void Reserve(size_t count) {
    int bits = std::max(bits_, kMinBits);
    while (!Fits(count, size_t{1} << bits)) ++bits;
    assert(bits <= 32);
    if (bits != bits_) Rebuild(bits);
  }

  // Asks memory for the bucket `id`'s probe starts at.
  void Prefetch(int64_t id) const {
    if (!buckets_.empty()) __builtin_prefetch(&buckets_[HomeOf(tag_of_(id))], 0, 3);
  }

  // The slot of the first bucket on `id`'s probe with its tag: id's slot, unless another
  // id holding a row shares the tag (confirm with the slot's id); kMissing when no
  // bucket has it, and then id has no slot. Reads the buckets only.
  uint32_t Candidate(int64_t id) const {
    if (buckets_.empty()) return kMissing;
    const uint32_t tag = tag_of_(id);
    for (size_t i = HomeOf(tag);; i = Next(i)) {
      const Bucket& bucket = buckets_[i];
      if (bucket.slot == kMissing || bucket.tag == tag) return bucket.slot;
    }
  }

  // `id`'s slot, kMissing if none; `id_at(slot)` is the id slot `slot` holds.
  template <typename IdAt>
  uint32_t Find(int64_t id, const IdAt& id_at) const {
    if (buckets_.empty()) return kMissing;
    const uint32_t tag = tag_of_(id);
    for (size_t i = HomeOf(tag);; i = Next(i)) {
      const Bucket& bucket = buckets_[i];
      if (bucket.slot == kMissing) return kMissing;
      if (bucket.tag == tag && id_at(bucket.slot) == id) return bucket.slot;
    }
  }

  // Adds id -> slot. REQUIRES: id has no slot here; slot != kMissing; fewer than
  // 3 x 2^30 ids (2^32 buckets at most).
  void Insert(int64_t id, uint32_t slot) {
    if (!Fits(size_ + 1, buckets_.size())) {
      assert(bits_ < 32);
      Rebuild(std::max(bits_ + 1, kMinBits));
    }
    Place(Bucket{tag_of_(id), slot});
    ++size_;
  }

  // Removes id's entry, which names `slot`. REQUIRES: it is here.
  void Erase(int64_t id, uint32_t slot) {
    const uint32_t tag = tag_of_(id);
    size_t hole = HomeOf(tag);
    while (buckets_[hole].slot != slot) {
      assert(buckets_[hole].slot != kMissing);  // the entry must be here
      hole = Next(hole);
    }
    // Each later bucket of the run moves back into the hole unless the hole lies
    // before its home (it would no longer be found from there).
    for (size_t i = Next(hole); buckets_[i].slot != kMissing; i = Next(i)) {
      const size_t home = HomeOf(buckets_[i].tag);
      if (Distance(home, i) >= Distance(hole, i)) {
        buckets_[hole] = buckets_[i];
        hole = i;
      }
    }
    buckets_[hole] = Bucket{};
    --size_;
  }

  // Calls visit(i, slot) for each of `ids` in order, slot its slot or kMissing, until
  // visit returns false. Three stages, kRowsAhead ids apart: an id's bucket is asked of
  // memory, then its candidate slot is read and prefetch_slot(slot) asks for the slot
  // (which must bring its id: `id_at` reads it), then the candidate is confirmed and
  // visited; so each access finds its line on the way instead of waiting for it.
  template <typename IdAt, typename PrefetchSlot, typename Visit>
  void LookUpAhead(absl::Span<const int64_t> ids, const IdAt& id_at,
                   const PrefetchSlot& prefetch_slot, const Visit& visit) const {
    std::array<uint32_t, kRowsAhead> ahead;  // by id index % kRowsAhead
    const auto look_up = [&](size_t i) {
      const uint32_t slot = Candidate(ids[i]);
      ahead[i % kRowsAhead] = slot;
      if (slot != kMissing) prefetch_slot(slot);
    };
    const size_t count = ids.size();
    for (size_t i = 0; i < std::min(count, 2 * kRowsAhead); ++i) Prefetch(ids[i]);
    for (size_t i = 0; i < std::min(count, kRowsAhead); ++i) look_up(i);
    for (size_t i = 0; i < count; ++i) {
      uint32_t slot = ahead[i % kRowsAhead];
      if (i + 2 * kRowsAhead < count) Prefetch(ids[i + 2 * kRowsAhead]);
      if (i + kRowsAhead < count) look_up(i + kRowsAhead);
      // Another id with the same tag first (about size() / 2^32 of lookups): the whole probe.
      if (slot != kMissing && id_at(slot) != ids[i]) slot = Find(ids[i], id_at);
      if (!visit(i, slot)) return;
    }
  }

 private:
  struct Bucket {
    uint32_t tag = 0;
    uint32_t slot = kMissing;  // kMissing: empty
  };
  static constexpr int kMinBits = 4;

  // Whether `count` ids fit in `buckets` buckets at the highest load kept (4/5).
  static bool Fits(size_t count, size_t buckets) { return count * 5 <= buckets * 4; }
  size_t HomeOf(uint32_t tag) const { return static_cast<size_t>(tag) >> (32 - bits_); }
  size_t Next(size_t i) const { return (i + 1) & (buckets_.size() - 1); }
  // How many buckets on from `from` `to` is, around the end.
  size_t Distance(size_t from, size_t to) const { return (to - from) & (buckets_.size() - 1); }
  void Place(Bucket bucket) {
    size_t i = HomeOf(bucket.tag);
    while (buckets_[i].slot != kMissing) i = Next(i);
    buckets_[i] = bucket;
  }
  // The same entries in 2^bits buckets. REQUIRES: bits <= 32, and they fit.
  void Rebuild(int bits) {
    std::vector<Bucket> old(size_t{1} << bits);
    old.swap(buckets_);
    bits_ = bits;
    for (const Bucket& bucket : old) {
      if (bucket.slot != kMissing) Place(bucket);
    }
  }

  TagOf tag_of_;
  std::vector<Bucket> buckets_;
  int bits_ = 0;
  size_t size_ = 0;
};

using RowIndex = BasicRowIndex<>;

}  // namespace paramserver

#endif  // PARAMSERVER_PS_ROW_INDEX_H_
