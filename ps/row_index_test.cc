#include "ps/row_index.h"

#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

constexpr uint32_t kMissing = RowIndex::kMissing;

// Tags from a handful of values, so that many ids share one and their runs are long, at
// both ends of the tag space (runs that start at bucket 0, and runs that start at the
// last bucket and wrap around to the first; negative ids give the tags near 2^32 in the
// first, those near 0 in the second).
struct FewLowTags {
  uint32_t operator()(int64_t id) const { return static_cast<uint32_t>(id % 3); }
};
struct FewHighTags {
  uint32_t operator()(int64_t id) const { return 0xffffffffu - static_cast<uint32_t>(id % 3); }
};

// An index and the slots it points into (slot -> id), checked against a std::map after
// every change: each id held is found at its slot, each id not held is not found.
template <typename Index>
class Checked {
 public:
  void Insert(int64_t id) {
    const uint32_t slot = static_cast<uint32_t>(id_of_slot_.size());
    id_of_slot_.push_back(id);
    index_.Insert(id, slot);
    held_[id] = slot;
  }
  void Erase(int64_t id) {
    index_.Erase(id, held_.at(id));
    held_.erase(id);
  }
  uint32_t Find(int64_t id) const { return index_.Find(id, IdAt()); }
  void CheckAgainstReference(const std::vector<int64_t>& absent) const {
    REQUIRE(index_.size() == held_.size());
    for (const auto& [id, slot] : held_) {
      REQUIRE(Find(id) == slot);
      // A candidate is a slot whose id shares the tag, or the id's own.
      const uint32_t candidate = index_.Candidate(id);
      REQUIRE(candidate != kMissing);
    }
    for (int64_t id : absent) REQUIRE(Find(id) == kMissing);
    // LookUpAhead agrees with Find on every id, held or not, in one pass.
    std::vector<int64_t> ids;
    for (const auto& entry : held_) ids.push_back(entry.first);
    ids.insert(ids.end(), absent.begin(), absent.end());
    size_t visited = 0;
    index_.LookUpAhead(
        ids, IdAt(), [](uint32_t) {},
        [&](size_t i, uint32_t slot) {
          REQUIRE(i == visited);
          const auto held = held_.find(ids[i]);
          REQUIRE(slot == (held == held_.end() ? kMissing : held->second));
          ++visited;
          return true;
        });
    REQUIRE(visited == ids.size());
  }
  const Index& index() const { return index_; }

 private:
  auto IdAt() const {
    return [this](uint32_t slot) { return id_of_slot_.at(slot); };
  }
  Index index_;
  std::vector<int64_t> id_of_slot_;
  std::map<int64_t, uint32_t> held_;
};

template <typename Index>
void InsertAndEraseAtRandom(int64_t id_space, int operations) {
  Checked<Index> checked;
  std::map<int64_t, bool> held;
  std::mt19937_64 random(7);
  std::uniform_int_distribution<int64_t> pick(-id_space, id_space);
  for (int op = 0; op < operations; ++op) {
    const int64_t id = pick(random);
    if (held[id]) {
      checked.Erase(id);
    } else {
      checked.Insert(id);
    }
    held[id] = !held[id];
    if (op % 97 == 0 || op == operations - 1) {
      std::vector<int64_t> absent;
      for (const auto& [held_id, is_held] : held) {
        if (!is_held) absent.push_back(held_id);
      }
      checked.CheckAgainstReference(absent);
    }
  }
}

TEST_CASE("a row index finds every id it holds and none it does not, through growth and erasure",
          "[row_index]") {
  InsertAndEraseAtRandom<RowIndex>(/*id_space=*/5000, /*operations=*/20000);
}

TEST_CASE(
    "ids that share a tag are told apart by their slots' ids; runs that wrap around the "
    "end survive erasure",
    "[row_index]") {
  // Every id's tag is one of three: each lookup past the first id of a tag needs the
  // slot's id, and every erasure shifts a long run back.
  InsertAndEraseAtRandom<BasicRowIndex<FewLowTags>>(/*id_space=*/300, /*operations=*/3000);
  InsertAndEraseAtRandom<BasicRowIndex<FewHighTags>>(/*id_space=*/300, /*operations=*/3000);
}

TEST_CASE("a row index stays at most 4/5 full and grows by doubling; Reserve makes room ahead",
          "[row_index]") {
  Checked<RowIndex> checked;
  for (int64_t id = 0; id < 1000; ++id) {
    checked.Insert(id * 31);
    const size_t buckets = checked.index().bucket_count();
    REQUIRE(checked.index().size() * 5 <= buckets * 4);
    REQUIRE((buckets & (buckets - 1)) == 0);
  }
  REQUIRE(checked.index().bucket_count() == 2048);  // 1000 > 4/5 of 1024
  REQUIRE(checked.index().bytes() == 2048 * 8);
  RowIndex reserved;
  reserved.Reserve(1000);
  REQUIRE(reserved.bucket_count() == 2048);
  for (int64_t id = 0; id < 1000; ++id) reserved.Insert(id, static_cast<uint32_t>(id));
  REQUIRE(reserved.bucket_count() == 2048);
  REQUIRE(reserved.Find(999, [](uint32_t slot) { return int64_t{slot}; }) == 999);
  REQUIRE(RowIndex().Find(1, [](uint32_t slot) { return int64_t{slot}; }) == kMissing);
  REQUIRE(RowIndex().Candidate(1) == kMissing);
}

}  // namespace
}  // namespace paramserver
