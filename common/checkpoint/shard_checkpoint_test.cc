#include "common/checkpoint/shard_checkpoint.h"

#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "catch2/catch.hpp"
#include "common/checkpoint/file_bytes.h"
#include "common/testing/log_capture.h"
#include "common/testing/temp_dir.h"

namespace paramserver {
namespace {

ShardState State(int shard_id, ParameterRange range, int64_t step) {
  ShardState state;
  state.shard_id = shard_id;
  state.range = range;
  state.step = step;
  state.epoch = 3;
  state.optimizer = "rmsprop";
  state.slots.resize(3);
  for (int64_t i = range.begin; i < range.end; ++i) {
    state.values.push_back(static_cast<float>(i) + 0.5f * step);
    state.slots[0].push_back(-static_cast<float>(i));
    state.slots[1].push_back(static_cast<float>(i * i) + 1e-9f);
    state.slots[2].push_back(0.25f * static_cast<float>(i));
  }
  return state;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// `state`'s file bytes, as WriteShardCheckpoint writes them.
std::string EncodeForTest(const ShardState& state) {
  TempDir dir;
  REQUIRE(WriteShardCheckpoint(LocalFileSystem(), dir.path(), state).ok());
  return ReadBytes(ShardCheckpointPath(dir.path(), state.shard_id, state.step));
}

TEST_CASE("a shard checkpoint round-trips exactly") {
  TempDir dir;
  const ShardState written = State(2, {10, 17}, 40);
  REQUIRE(WriteShardCheckpoint(LocalFileSystem(), dir.path(), written).ok());
  absl::StatusOr<ShardState> read =
      ReadShardCheckpoint(LocalFileSystem(), ShardCheckpointPath(dir.path(), 2, 40));
  REQUIRE(read.ok());
  CHECK(read->shard_id == 2);
  CHECK(read->range == ParameterRange{10, 17});
  CHECK(read->step == 40);
  CHECK(read->epoch == 3);
  CHECK(read->values == written.values);
  CHECK(read->optimizer == "rmsprop");
  CHECK(read->slots == written.slots);
  CHECK(read->skipped_steps == 0);
}

TEST_CASE("a checkpoint keeps its skipped steps; a PSCKPT02 file reads as none skipped") {
  ShardState written = State(1, {0, 4}, 12);
  written.skipped_steps = 3;
  const std::string bytes = EncodeForTest(written);
  absl::StatusOr<ShardState> read = ParseShardCheckpoint(bytes, "f");
  REQUIRE(read.ok());
  CHECK(read->skipped_steps == 3);
  // The same file as PSCKPT02 wrote it: no skipped_steps field after the epoch.
  std::string old = bytes.substr(0, bytes.size() - 4);
  old.replace(0, 8, "PSCKPT02");
  old.erase(8 + 4 + 8 * 4, 8);
  AppendLittleEndian<uint32_t>(Crc32Of(old.data(), old.size()), &old);
  absl::StatusOr<ShardState> older = ParseShardCheckpoint(old, "f");
  REQUIRE(older.ok());
  CHECK(older->skipped_steps == 0);
  CHECK(older->values == written.values);
  written.skipped_steps = 13;  // more than its steps
  CHECK_THAT(std::string(ParseShardCheckpoint(EncodeForTest(written), "f").status().message()),
             Catch::Contains("13 skipped of 12 steps"));
}

TEST_CASE("corrupt, truncated and foreign files are refused with DATA_LOSS") {
  TempDir dir;
  REQUIRE(WriteShardCheckpoint(LocalFileSystem(), dir.path(), State(0, {0, 5}, 7)).ok());
  const std::string good = ReadBytes(ShardCheckpointPath(dir.path(), 0, 7));
  std::string flipped = good;
  flipped[good.size() - 10] ^= 0x01;  // a bit of the last slot
  for (const auto& [name, bytes, problem] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"flipped", flipped, "checksum mismatch"},
           {"short", good.substr(0, good.size() - 9), "does not match"},
           {"foreign", "hello world, not a checkpoint at all", "bad magic"}}) {
    const std::string path = dir.WriteFile(name, bytes);
    absl::StatusOr<ShardState> read = ReadShardCheckpoint(LocalFileSystem(), path);
    INFO(name);
    REQUIRE_FALSE(read.ok());
    CHECK(read.status().code() == absl::StatusCode::kDataLoss);
    CHECK(std::string(read.status().message()).find(problem) != std::string::npos);
  }
  CHECK(ReadShardCheckpoint(LocalFileSystem(), dir.File("absent")).status().code() ==
        absl::StatusCode::kNotFound);
  // Found by tests/fuzz: a range whose size overflows (begin very negative).
  std::string wild = good;
  const int64_t begin = std::numeric_limits<int64_t>::min() + 5;
  std::memcpy(&wild[12], &begin, sizeof(begin));  // the header: magic (8), shard id (4), begin, end
  const absl::StatusOr<ShardState> refused = ParseShardCheckpoint(wild, "wild");
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kDataLoss);
  CHECK(std::string(refused.status().message()).find("is not one") != std::string::npos);
}

TEST_CASE("a range is assembled from the files of one step, however it was sharded") {
  TempDir dir;
  for (auto [id, range] :
       std::vector<std::pair<int, ParameterRange>>{{0, {0, 4}}, {1, {4, 7}}, {2, {7, 10}}}) {
    REQUIRE(WriteShardCheckpoint(LocalFileSystem(), dir.path(), State(id, range, 20)).ok());
    REQUIRE(WriteShardCheckpoint(LocalFileSystem(), dir.path(), State(id, range, 30)).ok());
  }
  absl::StatusOr<ShardState> middle = LoadRangeAtStep(LocalFileSystem(), dir.path(), {2, 9}, 30);
  REQUIRE(middle.ok());
  const ShardState expected = State(9, {2, 9}, 30);
  CHECK(middle->values == expected.values);
  CHECK(middle->slots == expected.slots);
  CHECK(middle->optimizer == "rmsprop");
  CHECK(middle->step == 30);
  CHECK(NewestCompleteCheckpointStep(LocalFileSystem(), dir.path(), 10) == 30);
  CHECK(NewestCompleteCheckpointStep(LocalFileSystem(), dir.path(), 11) ==
        -1);  // nothing covers parameter 10
  // Files holding parameters past the model's are another model's, never resumed from.
  CHECK(NewestCompleteCheckpointStep(LocalFileSystem(), dir.path(), 9) == -1);
  const absl::Status other =
      LoadRangeAtStep(LocalFileSystem(), dir.path(), {0, 9}, 30, /*model_parameters=*/9).status();
  CHECK(other.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(other.message()) == ShardCheckpointPath(dir.path(), 2, 30) +
                                            " holds parameters [7, 10) but this model has 9: a "
                                            "checkpoint of another model");

  // Step 40 is incomplete (shard 1 never wrote it), so 30 stays the newest complete one.
  REQUIRE(WriteShardCheckpoint(LocalFileSystem(), dir.path(), State(0, {0, 4}, 40)).ok());
  REQUIRE(WriteShardCheckpoint(LocalFileSystem(), dir.path(), State(2, {7, 10}, 40)).ok());
  CHECK(NewestCompleteCheckpointStep(LocalFileSystem(), dir.path(), 10) == 30);
  absl::StatusOr<ShardState> gap = LoadRangeAtStep(LocalFileSystem(), dir.path(), {0, 10}, 40);
  REQUIRE_FALSE(gap.ok());
  CHECK(std::string(gap.status().message()).find("covers parameter 4") != std::string::npos);

  absl::StatusOr<ShardState> newest =
      LoadNewestShardCheckpoint(LocalFileSystem(), dir.path(), 0, {0, 4});
  REQUIRE(newest.ok());
  CHECK(newest->step == 40);
  CHECK_FALSE(
      LoadNewestShardCheckpoint(LocalFileSystem(), dir.path(), 0, {0, 5}).ok());  // another range
}

TEST_CASE("an interrupted write leaves the previous checkpoint usable, and old files are pruned") {
  TempDir dir;
  REQUIRE(WriteShardCheckpoint(LocalFileSystem(), dir.path(), State(0, {0, 6}, 10)).ok());
  // What a writer killed before its rename leaves: a partial temporary file, and a
  // half-written file under the final name is impossible because of the rename.
  dir.WriteFile("shard-0-step-20.ckpt.tmp.12345", "PSCKPT01 partial");
  CHECK(ListShardCheckpoints(LocalFileSystem(), dir.path()).size() == 1);
  CHECK(NewestCompleteCheckpointStep(LocalFileSystem(), dir.path(), 6) == 10);
  // A corrupt file with a final name (a disk error, say) is skipped for the older one.
  dir.WriteFile("shard-0-step-30.ckpt", "garbage");
  absl::StatusOr<ShardState> newest =
      LoadNewestShardCheckpoint(LocalFileSystem(), dir.path(), 0, {0, 6});
  REQUIRE(newest.ok());
  CHECK(newest->step == 10);
  for (int step : {40, 50, 60})
    REQUIRE(WriteShardCheckpoint(LocalFileSystem(), dir.path(), State(0, {0, 6}, step)).ok());
  RemoveOldShardCheckpoints(LocalFileSystem(), dir.path(), 0, 2,
                            /*retain_from=*/-1);  // unknown: keep all
  CHECK(ListShardCheckpoints(LocalFileSystem(), dir.path()).size() == 5);
  RemoveOldShardCheckpoints(LocalFileSystem(), dir.path(), 0, 2,
                            /*retain_from=*/40);  // another shard is only at 40
  CHECK(ListShardCheckpoints(LocalFileSystem(), dir.path()).size() == 3);
  RemoveOldShardCheckpoints(LocalFileSystem(), dir.path(), 0, 2, /*retain_from=*/60);
  std::vector<CheckpointFileName> left = ListShardCheckpoints(LocalFileSystem(), dir.path());
  REQUIRE(left.size() == 2);
  CHECK(left[0].step == 60);
  CHECK(left[1].step == 50);
}

TEST_CASE("a corrupt checkpoint that is skipped is named in the log, with the reason") {
  TempDir dir;
  REQUIRE(WriteShardCheckpoint(LocalFileSystem(), dir.path(), State(0, {0, 4}, 10)).ok());
  REQUIRE(WriteShardCheckpoint(LocalFileSystem(), dir.path(), State(0, {0, 4}, 20)).ok());
  const std::string newest = ShardCheckpointPath(dir.path(), 0, 20);
  std::string bytes = ReadBytes(newest);
  bytes[bytes.size() / 2] ^= 0x40;  // one flipped bit in the body
  std::ofstream(newest, std::ios::binary | std::ios::trunc) << bytes;
  LogCapture log;
  absl::StatusOr<ShardState> loaded =
      LoadNewestShardCheckpoint(LocalFileSystem(), dir.path(), 0, {0, 4});
  REQUIRE(loaded.ok());
  CHECK(loaded->step == 10);  // the fallback
  CHECK(log.text().find("[warning] skipping a checkpoint of shard 0: " + newest +
                        ": corrupt shard checkpoint: checksum mismatch") != std::string::npos);
  CHECK(NewestCompleteCheckpointStep(LocalFileSystem(), dir.path(), 4) == 10);
  CHECK(log.text().find(
            "skipping the checkpoint at step 20 as a rollback or resume target: " + newest +
            ": corrupt shard checkpoint: checksum mismatch") != std::string::npos);
}

}  // namespace
}  // namespace paramserver
