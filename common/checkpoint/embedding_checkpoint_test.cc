#include "common/checkpoint/embedding_checkpoint.h"

#include <algorithm>
#include <set>

#include "catch2/catch.hpp"
#include "common/checkpoint/file_bytes.h"
#include "common/wire/shard_layout.h"

namespace paramserver {
namespace {

// Shard `shard` of 3 for table 4: the ids of [0, 300) that hash there, dim 2, adam state.
EmbeddingShardState Shard(int shard, int count = 3) {
  EmbeddingShardState state;
  state.table_index = 4;
  state.dim = 2;
  state.state_floats = 4;
  state.shard_id = shard;
  state.shard_count = count;
  state.step = 120;
  state.epoch = 3;
  for (int64_t id = 0; id < 300; ++id) {
    if (EmbeddingShardOf(4, id * 1000003, count) != shard) continue;
    state.ids.push_back(id * 1000003);
    state.rows.insert(state.rows.end(), {float(id), -float(id)});
    state.state.insert(state.state.end(), {0.1f * id, 0.2f, 0.3f, 0.4f * id});
  }
  return state;
}

TEST_CASE("a shard's rows and state round-trip; the bytes depend on the rows alone") {
  const EmbeddingShardState shard = Shard(1);
  REQUIRE(shard.ids.size() > 50);
  absl::StatusOr<std::string> bytes = EncodeEmbeddingCheckpoint(shard);
  REQUIRE(bytes.ok());
  absl::StatusOr<EmbeddingShardState> back = ParseEmbeddingCheckpoint(*bytes, "f");
  REQUIRE(back.ok());
  CHECK(back->ids == shard.ids);
  CHECK(back->rows == shard.rows);
  CHECK(back->state == shard.state);
  CHECK(back->step == 120);
  CHECK(back->epoch == 3);
  CHECK(EmbeddingCheckpointPath("/c", shard) == "/c/emb-4-shard-1-of-3-step-120.ckpt");
  CHECK(back->skipped_steps == 0);
}

TEST_CASE("rows sorted by id carry their own row and state along; sorted ones stay as they are") {
  const EmbeddingShardState sorted = Shard(1);
  EmbeddingShardState same = sorted;
  SortRowsById(&same);
  CHECK(same.ids == sorted.ids);
  CHECK(same.rows == sorted.rows);
  CHECK(same.state == sorted.state);
  // The rows reversed, then every other pair swapped: each row with its own floats.
  EmbeddingShardState shuffled = sorted;
  const size_t n = sorted.ids.size();
  for (size_t i = 0; i < n; ++i) {
    size_t from = n - 1 - i;
    if (i % 2 == 1) from = std::min(n - 1, from + 1);
    if (i % 2 == 0 && from > 0) from -= 1;
    shuffled.ids[i] = sorted.ids[from];
    std::copy_n(sorted.rows.begin() + 2 * from, 2, shuffled.rows.begin() + 2 * i);
    std::copy_n(sorted.state.begin() + 4 * from, 4, shuffled.state.begin() + 4 * i);
  }
  REQUIRE(std::set<int64_t>(shuffled.ids.begin(), shuffled.ids.end()).size() == n);
  REQUIRE_FALSE(std::is_sorted(shuffled.ids.begin(), shuffled.ids.end()));
  REQUIRE_FALSE(EncodeEmbeddingCheckpoint(shuffled).ok());  // the encoder takes ids in order
  SortRowsById(&shuffled);
  CHECK(shuffled.ids == sorted.ids);
  CHECK(shuffled.rows == sorted.rows);
  CHECK(shuffled.state == sorted.state);
  CHECK(EncodeEmbeddingCheckpoint(shuffled).ok());
}

TEST_CASE("an embedding checkpoint keeps its skipped steps; PSEMB001 reads as none skipped") {
  EmbeddingShardState shard = Shard(0);
  shard.skipped_steps = 7;
  absl::StatusOr<std::string> bytes = EncodeEmbeddingCheckpoint(shard);
  REQUIRE(bytes.ok());
  absl::StatusOr<EmbeddingShardState> back = ParseEmbeddingCheckpoint(*bytes, "f");
  REQUIRE(back.ok());
  CHECK(back->skipped_steps == 7);
  std::string old = bytes->substr(0, bytes->size() - 4);
  old.replace(0, 8, "PSEMB001");
  old.erase(8 + 5 * 4 + 3 * 8, 8 + 4);  // skipped_steps and the (empty) optimizer name
  AppendLittleEndian<uint32_t>(Crc32Of(old.data(), old.size()), &old);
  absl::StatusOr<EmbeddingShardState> older = ParseEmbeddingCheckpoint(old, "f");
  REQUIRE(older.ok());
  CHECK(older->skipped_steps == 0);
  CHECK(older->rows == shard.rows);
}

TEST_CASE("an embedding checkpoint names its rows' optimizer; PSEMB002 reads as unknown") {
  EmbeddingShardState shard = Shard(2);
  shard.optimizer = "ftrl";
  absl::StatusOr<std::string> bytes = EncodeEmbeddingCheckpoint(shard);
  REQUIRE(bytes.ok());
  CHECK(bytes->substr(0, 8) == "PSEMB003");
  absl::StatusOr<EmbeddingShardState> back = ParseEmbeddingCheckpoint(*bytes, "f");
  REQUIRE(back.ok());
  CHECK(back->optimizer == "ftrl");
  CHECK(back->rows == shard.rows);
  CHECK(RehashEmbeddingShards({*back}, 2)[1].optimizer == "ftrl");
  // The same rows as PSEMB002 wrote them: no name.
  std::string old = bytes->substr(0, bytes->size() - 4);
  old.replace(0, 8, "PSEMB002");
  old.erase(8 + 5 * 4 + 4 * 8, 4 + 4);
  AppendLittleEndian<uint32_t>(Crc32Of(old.data(), old.size()), &old);
  absl::StatusOr<EmbeddingShardState> older = ParseEmbeddingCheckpoint(old, "f");
  REQUIRE(older.ok());
  CHECK(older->optimizer.empty());
  CHECK(older->state == shard.state);
  // A name past the bound is refused both ways, before anything is read for it.
  shard.optimizer = std::string(kMaxEmbeddingOptimizerName + 1, 'x');
  CHECK(EncodeEmbeddingCheckpoint(shard).status().code() == absl::StatusCode::kInvalidArgument);
  std::string long_name = *bytes;
  long_name[8 + 5 * 4 + 4 * 8] = 100;  // the name's length byte
  CHECK(ParseEmbeddingCheckpoint(long_name, "f").status().code() == absl::StatusCode::kDataLoss);
}

TEST_CASE("damaged files and inconsistent shards are refused, naming the problem") {
  const std::string bytes = *EncodeEmbeddingCheckpoint(Shard(0));
  std::string flipped = bytes;
  flipped[100] ^= 1;
  CHECK(std::string(ParseEmbeddingCheckpoint(flipped, "f").status().message()) ==
        "f: corrupt embedding checkpoint: checksum mismatch");
  CHECK(ParseEmbeddingCheckpoint(bytes.substr(0, bytes.size() - 7), "f").status().code() ==
        absl::StatusCode::kDataLoss);
  CHECK(ParseEmbeddingCheckpoint("PSEMB001", "f").status().code() == absl::StatusCode::kDataLoss);
  // A row count far past the file's size is refused before anything is allocated.
  std::string huge = bytes;
  for (int i = 0; i < 8; ++i) huge[8 + 36 + i] = static_cast<char>(0x7f);
  CHECK(ParseEmbeddingCheckpoint(huge, "f").status().code() == absl::StatusCode::kDataLoss);
  EmbeddingShardState unsorted = Shard(0);
  std::swap(unsorted.ids[0], unsorted.ids[1]);
  CHECK(EncodeEmbeddingCheckpoint(unsorted).status().code() == absl::StatusCode::kInvalidArgument);
  EmbeddingShardState elsewhere = Shard(0);
  elsewhere.shard_id = 1;
  CHECK(std::string(EncodeEmbeddingCheckpoint(elsewhere).status().message())
            .find("belongs to another shard") != std::string::npos);
}

TEST_CASE("rows restore onto a different number of shards, each row once, where it belongs") {
  const std::vector<EmbeddingShardState> three = {Shard(0), Shard(1), Shard(2)};
  const std::vector<EmbeddingShardState> five = RehashEmbeddingShards(three, 5);
  REQUIRE(five.size() == 5);
  std::set<int64_t> seen;
  for (const EmbeddingShardState& shard : five) {
    REQUIRE(EncodeEmbeddingCheckpoint(shard).ok());  // sorted, on its shard, sizes agree
    for (size_t i = 0; i < shard.ids.size(); ++i) {
      CHECK(seen.insert(shard.ids[i]).second);
      const int64_t original = shard.ids[i] / 1000003;
      CHECK(shard.rows[2 * i] == float(original));
      CHECK(shard.state[4 * i + 3] == 0.4f * original);
    }
  }
  CHECK(seen.size() == 300);
  // And back to three: the same shards as at first.
  const std::vector<EmbeddingShardState> again = RehashEmbeddingShards(five, 3);
  for (int s = 0; s < 3; ++s) {
    CHECK(again[s].ids == three[s].ids);
    CHECK(again[s].rows == three[s].rows);
  }
}

}  // namespace
}  // namespace paramserver
