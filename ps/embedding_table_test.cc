#include "ps/embedding_table.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/checkpoint/embedding_checkpoint.h"

namespace paramserver {
namespace {

EmbeddingTableOptions Options(int dim = 4) {
  EmbeddingTableOptions options;
  options.dim = dim;
  options.optimizer.type = EmbeddingOptimizerType::kAdam;
  options.optimizer.learning_rate = 0.01;
  options.init_seed = 5;
  options.table_index = 2;
  return options;
}

std::vector<float> Pull(EmbeddingTable& table, std::vector<int64_t> ids,
                        std::vector<bool>* present = nullptr) {
  std::vector<float> rows(ids.size() * table.dim());
  std::vector<bool> flags;
  table.Pull(ids, absl::MakeSpan(rows), &flags);
  if (present != nullptr) *present = flags;
  return rows;
}

// Makes the rows of `ids` (ascending) with a zero gradient (Adam leaves them as they are).
void Touch(EmbeddingTable& table, int64_t step, std::vector<int64_t> ids) {
  REQUIRE(table.Apply(step, ids, std::vector<float>(ids.size() * table.dim(), 0.0f)).ok());
}

TEST_CASE("InitialEmbeddingRow draws each element as InitialEmbeddingValue does, bit for bit") {
  int compared = 0;
  for (uint64_t seed : {uint64_t{0}, uint64_t{5}, uint64_t{1} << 40}) {
    for (int table_index : {0, 3}) {
      for (int64_t id : {int64_t{0}, int64_t{-1}, int64_t{42}, std::numeric_limits<int64_t>::min(),
                         std::numeric_limits<int64_t>::max()}) {
        for (int dim : {1, 8, 33}) {
          std::vector<float> row(dim);
          InitialEmbeddingRow(seed, table_index, id, absl::MakeSpan(row));
          for (int e = 0; e < dim; ++e) {
            const float element = InitialEmbeddingValue(seed, table_index, id, e);
            CHECK(std::memcmp(&row[e], &element, sizeof(float)) == 0);
            ++compared;
          }
        }
      }
    }
  }
  CHECK(compared == 3 * 2 * 5 * (1 + 8 + 33));
}

TEST_CASE(
    "a row reads as its value from (seed, table, id) alone, and is made at its first update") {
  EmbeddingTable table(Options());
  std::vector<bool> present;
  const std::vector<float> rows = Pull(table, {42, 0xfffffffeLL}, &present);
  CHECK(present == std::vector<bool>{true, true});
  CHECK(table.rows() == 0);  // a pull changes nothing
  for (int e = 0; e < 4; ++e) {
    CHECK(rows[e] == InitialEmbeddingValue(5, 2, 42, e));
    CHECK(rows[4 + e] == InitialEmbeddingValue(5, 2, 0xfffffffeLL, e));
  }
  Touch(table, 1, {42, 0xfffffffeLL});
  CHECK(table.rows() == 2);
  CHECK(Pull(table, {42, 0xfffffffeLL}) == rows);  // made with the value it read as
  EmbeddingTable elsewhere(Options());             // another server, a replay, a restore
  std::vector<float> swapped(rows.begin() + 4, rows.end());
  swapped.insert(swapped.end(), rows.begin(), rows.begin() + 4);
  CHECK(Pull(elsewhere, {0xfffffffeLL, 42}) == swapped);
  CHECK(InitialEmbeddingValue(5, 3, 42, 0) != InitialEmbeddingValue(5, 2, 42, 0));
  // N(0, 1): over many values, mean about 0 and variance about 1.
  double sum = 0, squares = 0;
  for (int64_t id = 0; id < 20000; ++id) {
    const double x = InitialEmbeddingValue(1, 0, id, 0);
    sum += x;
    squares += x * x;
  }
  CHECK(std::abs(sum / 20000) < 0.03);
  CHECK(std::abs(squares / 20000 - 1) < 0.05);
}

TEST_CASE("pushes update only their rows, with the row optimizer; bad pushes change nothing") {
  EmbeddingTable table(Options());
  const std::vector<float> before = Pull(table, {3, 9});
  const std::vector<float> gradient = {0.5f, -0.25f, 1, 0};
  REQUIRE(table.Apply(1, {9}, gradient).ok());
  // What the optimizer does to a copy of row 9 with fresh state.
  std::vector<float> expected(before.begin() + 4, before.end());
  std::vector<float> state(8, 0.0f);
  ApplyRowUpdate(Options().optimizer, 1, gradient, absl::MakeSpan(expected), absl::MakeSpan(state));
  const std::vector<float> after = Pull(table, {3, 9});
  CHECK(std::vector<float>(after.begin(), after.begin() + 4) ==
        std::vector<float>(before.begin(), before.begin() + 4));
  CHECK(std::vector<float>(after.begin() + 4, after.end()) == expected);
  CHECK(table.rows() == 1);
  const std::vector<float> two(8, 1.0f);
  CHECK(table.Apply(2, {9, 3}, two).message() ==
        "embedding push: ids must be strictly increasing; id 3 at position 1 follows 9");
  CHECK(table.Apply(2, {3, 3}, two).code() == absl::StatusCode::kInvalidArgument);
  CHECK(table.Apply(2, {3}, two).message() ==
        "embedding push: 1 ids but 8 gradient floats (dim 4)");
  CHECK(Pull(table, {3, 9}) == after);  // unchanged by the refused pushes
  CHECK(table.rows() == 1);
  CHECK(table.dropped_gradients() == 0);
}

// Every row (id, floats, state, in recency order) and the counters, as one list of bits.
std::vector<int64_t> Snapshot(const EmbeddingTable& table) {
  std::vector<int64_t> bits = {table.rows(), table.evicted_rows(), table.dropped_gradients(),
                               table.pending_ids()};
  table.ForEachRow([&](int64_t id, absl::Span<const float> row, absl::Span<const float> state) {
    bits.push_back(id);
    for (absl::Span<const float> part : {row, state}) {
      for (float x : part) {
        uint32_t word;
        std::memcpy(&word, &x, sizeof(word));
        bits.push_back(word);
      }
    }
  });
  return bits;
}

TEST_CASE("an update of many rows leaves the table as the same rows updated one at a time") {
  struct Capacity {
    int64_t max_rows;
    int min_count;
  };
  // Unbounded; bounded above a call's ids (rows found at the start of a call are evicted
  // by rows it makes later); bounded below them (each row updated in turn); and sightings.
  for (const Capacity capacity :
       {Capacity{0, 1}, Capacity{24, 1}, Capacity{6, 1}, Capacity{24, 2}, Capacity{0, 3}}) {
    for (EmbeddingOptimizerType type :
         {EmbeddingOptimizerType::kAdam, EmbeddingOptimizerType::kRowwiseAdagrad,
          EmbeddingOptimizerType::kFtrl, EmbeddingOptimizerType::kSgd}) {
      INFO(EmbeddingOptimizerName(type)
           << " max_rows " << capacity.max_rows << " min_count " << capacity.min_count);
      EmbeddingTableOptions options = Options(/*dim=*/5);
      options.optimizer.type = type;
      options.max_rows = capacity.max_rows;
      options.min_count = capacity.min_count;
      EmbeddingTable together(options), one_by_one(options);
      std::mt19937 random(11);
      std::normal_distribution<float> normal(0.0f, 0.1f);
      for (int64_t step = 1; step <= 60; ++step) {
        std::vector<int64_t> ids;
        const int wanted = 1 + static_cast<int>(random() % 20);
        for (int64_t id = 0; id < 40 && static_cast<int>(ids.size()) < wanted; ++id) {
          if (random() % 2 == 0) ids.push_back(id * 7 - 100);  // some negative ids too
        }
        std::vector<float> gradients(ids.size() * 5);
        for (float& g : gradients) g = normal(random);
        REQUIRE(together.Apply(step, ids, gradients).ok());
        for (size_t i = 0; i < ids.size(); ++i) {
          REQUIRE(one_by_one.Apply(step, {ids[i]}, absl::MakeConstSpan(gradients).subspan(i * 5, 5))
                      .ok());
        }
        REQUIRE(Snapshot(together) == Snapshot(one_by_one));
      }
      if (capacity.max_rows > 0) CHECK(together.evicted_rows() > 0);
      if (capacity.min_count > 1) CHECK(together.dropped_gradients() > 0);
    }
  }
}

TEST_CASE("past max_rows the least recently updated row is evicted, and comes back fresh") {
  EmbeddingTableOptions options = Options();
  options.max_rows = 3;
  EmbeddingTable table(options);
  const std::vector<float> fresh_two = Pull(table, {2});
  REQUIRE(table.Apply(1, {2}, std::vector<float>(4, 1.0f)).ok());  // 2
  Touch(table, 2, {1, 3});                                         // 2 1 3
  Touch(table, 3, {2});                                            // 1 3 2
  Pull(table, {1});                                                // pulls change no order
  Touch(table, 4, {1});                                            // 3 2 1
  Touch(table, 5, {4});  // full: evicts 3, the least recently updated  // 2 1 4
  CHECK(table.rows() == 3);
  CHECK(table.evicted_rows() == 1);
  CHECK(Pull(table, {2}) != fresh_two);  // still trained
  Touch(table, 6, {5});                  // evicts 2                        // 1 4 5
  CHECK(table.evicted_rows() == 2);
  // Read again, 2 is its initial value: its trained value and moments are gone.
  CHECK(Pull(table, {2}) == fresh_two);
  CHECK(table.rows() == 3);
}

// `steps` updates of up to 8 random ids of 100 (seeded by `seed`) to a table of dim 3
// that holds fewer, so that rows are evicted and their slots reused.
void TrainWithEvictions(EmbeddingTable* table, uint64_t seed, int64_t steps) {
  std::mt19937_64 random(seed);
  for (int64_t step = 1; step <= steps; ++step) {
    std::vector<int64_t> ids;
    for (int i = 0; i < 8; ++i) ids.push_back(static_cast<int64_t>(random() % 100));
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    std::vector<float> gradient(ids.size() * 3);
    for (float& g : gradient) g = static_cast<float>(random() % 7) - 3.0f;
    REQUIRE(table->Apply(step, ids, gradient).ok());
  }
  REQUIRE(table->evicted_rows() > 0);
}

TEST_CASE("the copy as stored holds exactly the rows the LRU walk visits, evictions included") {
  EmbeddingTableOptions options = Options(3);
  options.max_rows = 40;
  EmbeddingTable table(options);
  TrainWithEvictions(&table, 3, 30);
  using Contents = std::map<int64_t, std::vector<float>>;  // id -> row then state
  Contents walked;
  table.ForEachRow([&](int64_t id, absl::Span<const float> row, absl::Span<const float> state) {
    std::vector<float>& both = walked[id];
    both.assign(row.begin(), row.end());
    both.insert(both.end(), state.begin(), state.end());
  });
  std::vector<int64_t> ids = {-1};  // appended after what is there
  std::vector<float> rows = {-1, -1, -1}, state(StateFloatsPerRow(options.optimizer.type, 3), -1);
  const size_t state_floats = state.size();
  table.AppendRowsAsStored(&ids, &rows, &state);
  REQUIRE(ids.size() == static_cast<size_t>(table.rows()) + 1);
  REQUIRE(rows.size() == ids.size() * 3);
  REQUIRE(state.size() == ids.size() * state_floats);
  CHECK(ids[0] == -1);
  Contents copied;
  for (size_t i = 1; i < ids.size(); ++i) {
    std::vector<float>& both = copied[ids[i]];
    both.assign(rows.begin() + i * 3, rows.begin() + (i + 1) * 3);
    both.insert(both.end(), state.begin() + i * state_floats,
                state.begin() + (i + 1) * state_floats);
  }
  CHECK(copied.size() == ids.size() - 1);  // no id twice
  CHECK(copied == walked);
}

TEST_CASE("an export lists every row's id once, and reads the rows of those still held") {
  EmbeddingTableOptions options = Options(3);
  options.max_rows = 40;
  EmbeddingTable table(options);
  TrainWithEvictions(&table, 5, 30);
  std::map<int64_t, std::vector<float>> walked;  // id -> row
  table.ForEachRow([&](int64_t id, absl::Span<const float> row, absl::Span<const float>) {
    walked[id].assign(row.begin(), row.end());
  });
  std::vector<int64_t> ids = {-7};  // appended after what is there
  table.AppendIds(&ids);
  REQUIRE(ids.size() == walked.size() + 1);
  CHECK(ids[0] == -7);
  std::sort(ids.begin() + 1, ids.end());
  CHECK(std::adjacent_find(ids.begin() + 1, ids.end()) == ids.end());  // no id twice
  for (size_t i = 1; i < ids.size(); ++i) CHECK(walked.count(ids[i]) == 1);

  // A page asks for rows in its own order, with ids the table does not hold among them:
  // one never made (1000), and one evicted by an update after the listing.
  const int64_t least_recent = [&] {
    int64_t first = -1;
    table.ForEachRow([&](int64_t id, absl::Span<const float>, absl::Span<const float>) {
      if (first < 0) first = id;
    });
    return first;
  }();
  int64_t newcomer = 100;
  while (walked.count(newcomer) > 0) ++newcomer;
  Touch(table, 31, {newcomer});  // full: evicts the least recently updated
  REQUIRE(Pull(table, {least_recent}) ==
          std::vector<float>{InitialEmbeddingValue(5, 2, least_recent, 0),
                             InitialEmbeddingValue(5, 2, least_recent, 1),
                             InitialEmbeddingValue(5, 2, least_recent, 2)});
  std::vector<int64_t> page;
  for (const auto& [id, row] : walked) {
    if (id != least_recent) page.push_back(id);
  }
  std::reverse(page.begin(), page.end());
  std::vector<int64_t> asked = page;
  asked.insert(asked.begin() + 1, 1000);
  asked.push_back(least_recent);
  std::vector<int64_t> held = {-7};
  std::vector<float> rows = {-1, -1, -1};
  table.CopyHeldRows(asked, &held, &rows);
  page.insert(page.begin(), -7);
  CHECK(held == page);  // in the order asked, the others left out
  REQUIRE(rows.size() == held.size() * 3);
  CHECK(std::vector<float>(rows.begin(), rows.begin() + 3) == std::vector<float>{-1, -1, -1});
  for (size_t i = 1; i < held.size(); ++i) {
    CHECK(std::vector<float>(rows.begin() + i * 3, rows.begin() + (i + 1) * 3) == walked[held[i]]);
  }
}

TEST_CASE("the copy as stored, put in order by its recency links, is exactly the LRU walk") {
  EmbeddingTableOptions options = Options(3);
  options.max_rows = 40;
  EmbeddingTable table(options);
  const int state_floats = StateFloatsPerRow(options.optimizer.type, 3);
  EmbeddingShardState empty;
  table.CopyRecencyLinks(&empty.next_more_recent, &empty.least_recent);
  CHECK(empty.next_more_recent.empty());
  CHECK(empty.least_recent == EmbeddingTable::kNoMoreRecent);
  TrainWithEvictions(&table, 5, 40);
  EmbeddingShardState walked;
  table.ForEachRow([&](int64_t id, absl::Span<const float> row, absl::Span<const float> state) {
    walked.ids.push_back(id);
    walked.rows.insert(walked.rows.end(), row.begin(), row.end());
    walked.state.insert(walked.state.end(), state.begin(), state.end());
  });
  EmbeddingShardState copy;
  copy.dim = 3;
  copy.state_floats = state_floats;
  table.AppendRowsAsStored(&copy.ids, &copy.rows, &copy.state);
  table.CopyRecencyLinks(&copy.next_more_recent, &copy.least_recent);
  REQUIRE(copy.next_more_recent.size() == copy.ids.size());
  REQUIRE(copy.ids != walked.ids);  // stored in another order than updated: a real test
  EmbeddingShardState as_stored = copy;
  REQUIRE(OrderRowsByRecency(&copy).ok());
  CHECK(copy.ids == walked.ids);
  CHECK(copy.rows == walked.rows);
  CHECK(copy.state == walked.state);
  CHECK(copy.next_more_recent.empty());
  // No links: no change.
  REQUIRE(OrderRowsByRecency(&copy).ok());
  CHECK(copy.ids == walked.ids);
  // Links that do not lead through every row once (a peer's may not) are refused by
  // name, the rows unchanged: cut short, a cycle, a position past the rows, too few.
  const auto refused = [&](const std::function<void(EmbeddingShardState&)>& spoil) {
    EmbeddingShardState broken = as_stored;
    spoil(broken);
    const absl::Status status = OrderRowsByRecency(&broken);
    CHECK(broken.ids == as_stored.ids);
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    return std::string(status.message());
  };
  const uint32_t last = static_cast<uint32_t>(as_stored.ids.size());
  CHECK_THAT(refused([](EmbeddingShardState& s) {
               s.next_more_recent[s.least_recent] = kNoMoreRecentRow;
             }),
             Catch::Contains("reach 1 of its"));
  CHECK_THAT(refused([](EmbeddingShardState& s) {
               s.next_more_recent[s.next_more_recent[s.least_recent]] = s.least_recent;
             }),
             Catch::Contains("do not lead through every row once"));
  CHECK_THAT(refused([&](EmbeddingShardState& s) { s.least_recent = last; }),
             Catch::Contains(absl::StrCat("row position ", last, " after 0 rows")));
  CHECK_THAT(refused([](EmbeddingShardState& s) { s.next_more_recent.pop_back(); }),
             Catch::Contains("links for"));
}

TEST_CASE("with min_count an id reads as absent until the update of its min_count-th sighting") {
  EmbeddingTableOptions options = Options();
  options.min_count = 3;
  EmbeddingTable table(options);
  std::vector<bool> present;
  CHECK(Pull(table, {7}, &present) == std::vector<float>(4, 0.0f));
  CHECK(present == std::vector<bool>{false});
  REQUIRE(table.Apply(1, {7}, std::vector<float>(4, 1.0f)).ok());  // sighting 1: dropped
  CHECK(table.dropped_gradients() == 1);
  CHECK(table.pending_ids() == 1);
  Pull(table, {7}, &present);
  CHECK(present == std::vector<bool>{false});
  REQUIRE(table.Apply(2, {7}, std::vector<float>(4, 1.0f)).ok());  // sighting 2: dropped
  CHECK(table.dropped_gradients() == 2);
  // The next update is its third sighting: it reads as its initial value now.
  const std::vector<float> row = Pull(table, {7}, &present);
  CHECK(present == std::vector<bool>{true});
  CHECK(row[0] == InitialEmbeddingValue(5, 2, 7, 0));
  CHECK(table.rows() == 0);
  REQUIRE(table.Apply(3, {7}, std::vector<float>(4, 0.0f)).ok());
  CHECK(table.rows() == 1);
  CHECK(table.pending_ids() == 0);
  CHECK(Pull(table, {7}) == row);
}

TEST_CASE("rows, their state, recency and sightings round-trip through ForEach and Restore") {
  EmbeddingTableOptions options = Options();
  options.max_rows = 3;
  options.min_count = 2;
  EmbeddingTable table(options);
  for (int64_t step = 1; step <= 2; ++step) {
    REQUIRE(table.Apply(step, {1, 2, 3}, std::vector<float>(12, 0.5f)).ok());
  }
  REQUIRE(table.Apply(3, {1, 3, 8}, std::vector<float>(12, 0.25f)).ok());  // order: 2 1 3
  EmbeddingTable copy(options);
  table.ForEachRow([&](int64_t id, absl::Span<const float> row, absl::Span<const float> state) {
    REQUIRE(copy.Restore(id, row, state).ok());
  });
  table.ForEachPending([&](int64_t id, int32_t sightings) { copy.RestorePending(id, sightings); });
  CHECK(copy.rows() == 3);
  CHECK(copy.pending_ids() == 1);
  CHECK(Pull(copy, {1, 2, 3}) == Pull(table, {1, 2, 3}));
  // The moments, the recency order and the sightings came too: the same next updates
  // evict the same row (2), admit 8, and give the same rows.
  for (EmbeddingTable* t : {&table, &copy}) {
    REQUIRE(t->Apply(4, {1, 8}, std::vector<float>(8, -1.0f)).ok());
  }
  CHECK(copy.evicted_rows() == 1);
  CHECK(table.evicted_rows() == 1);
  CHECK(Pull(copy, {1, 2, 3, 8}) == Pull(table, {1, 2, 3, 8}));
  CHECK(copy.Restore(9, std::vector<float>(3), std::vector<float>(8)).code() ==
        absl::StatusCode::kInvalidArgument);
}

// Every row as ForEachRow visits it: its id (as a float: the tests' ids are small), row
// and state.
std::vector<std::vector<float>> Walk(const EmbeddingTable& table) {
  std::vector<std::vector<float>> walked;
  table.ForEachRow([&](int64_t id, absl::Span<const float> row, absl::Span<const float> state) {
    std::vector<float> entry = {static_cast<float>(id)};
    entry.insert(entry.end(), row.begin(), row.end());
    entry.insert(entry.end(), state.begin(), state.end());
    walked.push_back(entry);
  });
  return walked;
}

TEST_CASE("RestoreRows restores as Restore does row by row, and refuses sizes that disagree") {
  // A bounded table given more rows than max_rows keeps the last ones, as row by row.
  for (const int64_t max_rows : {int64_t{0}, int64_t{50}}) {
    EmbeddingTableOptions options = Options();
    options.max_rows = max_rows;
    const int state_floats = StateFloatsPerRow(options.optimizer.type, options.dim);
    std::vector<int64_t> ids;
    std::vector<float> rows, states;
    for (int64_t i = 0; i < 300; ++i) {
      ids.push_back((i * 7919) % 1000 - 500);  // distinct, in no order, some negative
      for (int e = 0; e < options.dim; ++e) rows.push_back(static_cast<float>(i * 10 + e));
      for (int e = 0; e < state_floats; ++e) states.push_back(static_cast<float>(i + e) / 8);
    }
    EmbeddingTable batched(options), one_by_one(options);
    REQUIRE(batched.RestoreRows(ids, rows, states).ok());
    for (size_t i = 0; i < ids.size(); ++i) {
      REQUIRE(one_by_one
                  .Restore(ids[i], absl::MakeConstSpan(rows).subspan(i * options.dim, options.dim),
                           absl::MakeConstSpan(states).subspan(i * state_floats, state_floats))
                  .ok());
    }
    CHECK(batched.rows() == (max_rows > 0 ? max_rows : 300));
    CHECK(Walk(batched) == Walk(one_by_one));
    std::vector<int64_t> sorted = ids;
    std::sort(sorted.begin(), sorted.end());
    CHECK(Pull(batched, sorted) == Pull(one_by_one, sorted));
    // Again into the tables that now hold rows, the first 100 ids over again (their rows
    // replaced, moved to the recent end) and 20 new ones: still the same.
    std::vector<int64_t> again(ids.begin(), ids.begin() + 100);
    for (int64_t id = 600; id < 620; ++id) again.push_back(id);
    const std::vector<float> again_rows(again.size() * options.dim, -2.5f);
    const std::vector<float> again_states(again.size() * state_floats, 0.75f);
    REQUIRE(batched.RestoreRows(again, again_rows, again_states).ok());
    for (size_t i = 0; i < again.size(); ++i) {
      REQUIRE(
          one_by_one
              .Restore(again[i],
                       absl::MakeConstSpan(again_rows).subspan(i * options.dim, options.dim),
                       absl::MakeConstSpan(again_states).subspan(i * state_floats, state_floats))
              .ok());
    }
    CHECK(batched.rows() == one_by_one.rows());
    CHECK(batched.evicted_rows() == one_by_one.evicted_rows());
    CHECK(Walk(batched) == Walk(one_by_one));
    CHECK(batched.RestoreRows({}, {}, {}).ok());
    // Sizes that disagree: refused, nothing restored.
    EmbeddingTable refused(options);
    CHECK(refused.RestoreRows(ids, absl::MakeConstSpan(rows).subspan(1), states).code() ==
          absl::StatusCode::kInvalidArgument);
    CHECK(refused.RestoreRows(ids, rows, absl::MakeConstSpan(states).subspan(1)).code() ==
          absl::StatusCode::kInvalidArgument);
    CHECK(refused.rows() == 0);
  }
}

TEST_CASE(
    "without max_rows no recency is kept: rows are visited and linked in the order stored, and "
    "cost no links") {
  std::vector<int64_t> ids;
  for (int64_t id = 0; id < 3000; ++id) ids.push_back(id * 7919 % 100003);
  std::sort(ids.begin(), ids.end());
  EmbeddingTableOptions bounded_options = Options(3);
  bounded_options.max_rows = 1 << 20;  // never reached: the same rows, with an LRU list
  EmbeddingTable unbounded(Options(3)), bounded(bounded_options);
  for (EmbeddingTable* table : {&unbounded, &bounded}) {
    Touch(*table, 1, ids);
    // The first ten again: the most recently updated now, stored first.
    Touch(*table, 2, std::vector<int64_t>(ids.begin(), ids.begin() + 10));
  }
  std::vector<int64_t> unbounded_walk, bounded_walk, stored;
  unbounded.ForEachRow([&](int64_t id, absl::Span<const float>, absl::Span<const float>) {
    unbounded_walk.push_back(id);
  });
  bounded.ForEachRow([&](int64_t id, absl::Span<const float>, absl::Span<const float>) {
    bounded_walk.push_back(id);
  });
  std::vector<float> values, states;
  unbounded.AppendRowsAsStored(&stored, &values, &states);
  CHECK(unbounded_walk == stored);
  CHECK(unbounded_walk == ids);          // made in id order
  CHECK(bounded_walk.back() == ids[9]);  // the LRU walk ends with the last updated
  CHECK(bounded_walk.front() == ids[10]);
  // The unbounded copy comes with no links: its order is the order stored, as a backup
  // or OrderRowsByRecency takes it.
  EmbeddingShardState copy;
  copy.ids = stored;
  copy.next_more_recent = {1, 2, 3};  // cleared
  unbounded.CopyRecencyLinks(&copy.next_more_recent, &copy.least_recent);
  CHECK(copy.next_more_recent.empty());
  CHECK(copy.least_recent == EmbeddingTable::kNoMoreRecent);
  REQUIRE(OrderRowsByRecency(&copy).ok());
  CHECK(copy.ids == stored);
  // The same rows, bit for bit, and 8 bytes a row less (the two links).
  std::vector<int64_t> bounded_stored;
  std::vector<float> bounded_values, bounded_states;
  bounded.AppendRowsAsStored(&bounded_stored, &bounded_values, &bounded_states);
  CHECK(bounded_stored == stored);
  CHECK(bounded_values == values);
  CHECK(bounded_states == states);
  CHECK(bounded.bytes_per_row() - unbounded.bytes_per_row() >= 8);
}

TEST_CASE("a row costs little more than its floats") {
  EmbeddingTable table(Options(16));  // adam: 16 * 4 * 3 = 192 bytes at least
  CHECK(table.minimum_bytes_per_row() == 192);
  std::vector<int64_t> ids;
  for (int64_t id = 0; id < 120000; ++id) ids.push_back(id * 2654435761LL % 4294967291LL);
  std::sort(ids.begin(), ids.end());
  Touch(table, 1, ids);
  CHECK(table.rows() == 120000);
  INFO("bytes per row: " << table.bytes_per_row());
  CHECK(table.bytes_per_row() >= 192);
  CHECK(table.bytes_per_row() < 1.5 * 192);
}

}  // namespace
TEST_CASE("a table's options: its own settings where it gives them, the spec's otherwise") {
  ClusterSpec spec;
  spec.model.init_seed = 9;
  spec.model.max_rows = 1000;
  spec.model.min_count = 3;
  spec.training.embedding_optimizer.type = EmbeddingOptimizerType::kAdam;
  spec.training.embedding_optimizer.learning_rate = 0.01;
  const EmbeddingTableOptions plain = EmbeddingTableOptionsFor(spec, 1, 8, {});
  CHECK(plain.dim == 8);
  CHECK(plain.table_index == 1);
  CHECK(plain.init_seed == 9);
  CHECK(plain.max_rows == 1000);
  CHECK(plain.min_count == 3);
  CHECK(plain.optimizer.type == EmbeddingOptimizerType::kAdam);
  EmbeddingTableSettings own;
  own.max_rows = 0;  // unbounded, though the spec bounds the others
  own.min_count = 1;
  own.optimizer = EmbeddingOptimizerOptions{};
  own.optimizer->type = EmbeddingOptimizerType::kFtrl;
  own.optimizer->l1 = 0.5;
  const EmbeddingTableOptions table = EmbeddingTableOptionsFor(spec, 0, 4, own);
  CHECK(table.max_rows == 0);
  CHECK(table.min_count == 1);
  CHECK(table.optimizer.type == EmbeddingOptimizerType::kFtrl);
  CHECK(table.optimizer.l1 == 0.5);
  // Its rows keep that optimizer's state: FTRL's accumulators and linear terms.
  EmbeddingTable rows(table);
  REQUIRE(rows.Apply(1, std::vector<int64_t>{7}, std::vector<float>{1, 1, 1, 1}).ok());
  int64_t seen = 0;
  rows.ForEachRow([&](int64_t id, absl::Span<const float> row, absl::Span<const float> state) {
    ++seen;
    CHECK(id == 7);
    CHECK(row.size() == 4);
    CHECK(state.size() == static_cast<size_t>(StateFloatsPerRow(EmbeddingOptimizerType::kFtrl, 4)));
  });
  CHECK(seen == 1);
}

TEST_CASE(
    "rows made after a check take the initial values it drew: the same bits as a table never "
    "checked, whichever ids the check saw") {
  // Some rows made beforehand, so that each push mixes made rows and new ones.
  const std::vector<int64_t> made = {2, 5, 7};
  const std::vector<int64_t> pushed = {1, 2, 3, 5, 8, 9, 40};
  std::vector<float> gradients(pushed.size() * 4);
  for (size_t i = 0; i < gradients.size(); ++i) gradients[i] = 0.125f * (1 + i % 7);
  EmbeddingTable unchecked(Options());
  Touch(unchecked, 1, made);
  REQUIRE(unchecked.Apply(2, pushed, gradients).ok());
  // The check's ids: the same; a subset; a superset; none in common; not ascending.
  const std::vector<std::vector<int64_t>> checked_ids = {
      pushed, {3, 9}, {0, 1, 2, 3, 4, 5, 8, 9, 40, 41}, {100, 200}, {9, 3, 40, 1}};
  for (const std::vector<int64_t>& ids : checked_ids) {
    EmbeddingTable checked(Options());
    Touch(checked, 1, made);
    const std::vector<float> check_gradients(ids.size() * 4, 0.5f);
    CHECK(checked.FirstUnsafeElement(2, ids, check_gradients) == check_gradients.size());
    REQUIRE(checked.Apply(2, pushed, gradients).ok());
    CHECK(Walk(checked) == Walk(unchecked));
  }
}

}  // namespace paramserver
