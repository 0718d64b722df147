// CheckpointWriter on a disk that fills up: the failure is reported until a write
// succeeds, space is reclaimed from files older than the rollback target, and writing
// resumes once there is room. The disk is a fault-injecting file layer over real files:
// a write stops short with "No space left on device" when it is full, as a real one does.
#include "ps/checkpoint_writer.h"

#include <memory>

#include "catch2/catch.hpp"
#include "common/testing/fault_injecting_file_system.h"
#include "common/testing/log_capture.h"
#include "common/testing/temp_dir.h"

namespace paramserver {
namespace {

ShardState State(int shard_id, int64_t step) {
  ShardState state;
  state.shard_id = shard_id;
  state.range = {shard_id * 4, shard_id * 4 + 4};
  state.step = step;
  state.values.assign(4, static_cast<float>(step));
  state.optimizer = "adam(exp_avg,exp_avg_sq)";
  state.slots = {std::vector<float>(4, 0.5f), std::vector<float>(4, 0.25f)};
  return state;
}

// The size of one State() file: header (52 bytes: skipped_steps too; the optimizer state's name
// with its length byte, the slot count), three 4-float vectors, checksum.
constexpr int64_t kFileBytes = 44 + 8 + 1 + 24 + 1 + 3 * 4 * 4 + 4;

// A disk with room for `files` State() files.
std::unique_ptr<FaultInjectingFileSystem> SmallDisk(int files) {
  auto disk = std::make_unique<FaultInjectingFileSystem>();
  disk->SetDiskCapacity(files * kFileBytes);
  return disk;
}

std::vector<int64_t> StepsOnDisk(const std::string& dir, int shard_id) {
  std::vector<int64_t> steps;
  for (const CheckpointFileName& file : ListShardCheckpoints(LocalFileSystem(), dir)) {
    if (file.shard_id == shard_id) steps.push_back(file.step);
  }
  return steps;  // newest first
}

TEST_CASE(
    "a full disk is reported until a write succeeds; space older than the rollback target is "
    "reclaimed") {
  TempDir dir;
  std::unique_ptr<FaultInjectingFileSystem> disk = SmallDisk(4);
  CheckpointWriter writer(dir.path(), /*keep=*/3, *disk);
  // Until the scheduler has said which step is the rollback target, nothing may be
  // deleted: the writes fail and say so.
  for (int64_t step : {0, 10, 20, 30}) REQUIRE(writer.WriteNow(State(0, step)).ok());
  CHECK(writer.failure().failed_writes == 0);
  LogCapture log;
  CHECK_FALSE(writer.WriteNow(State(0, 40)).ok());
  CHECK_FALSE(writer.WriteNow(State(0, 50)).ok());
  CheckpointFailure failure = writer.failure();
  CHECK(failure.failed_writes == 2);
  CHECK(failure.failing_since_step == 40);
  CHECK(failure.error.find("No space left on device") != std::string::npos);
  CHECK(StepsOnDisk(dir.path(), 0) == std::vector<int64_t>{30, 20, 10, 0});
  CHECK(log.text().find("[error] checkpoint of shard 0 at step 40 failed") != std::string::npos);

  // The rollback target is step 20: files before it go, and the retried write lands.
  writer.set_retain_from(20);
  REQUIRE(writer.WriteNow(State(0, 60)).ok());
  CHECK(writer.failure().failed_writes == 0);
  CHECK(writer.failed_writes() == 2);  // the lifetime count stays
  const std::vector<int64_t> kept = StepsOnDisk(dir.path(), 0);
  CHECK(kept == std::vector<int64_t>{60, 30, 20});
  CHECK(writer.newest_step(0) == 60);
  CHECK(log.text().find("deleted 2 files older than the rollback target to make room, retrying") !=
        std::string::npos);
  CHECK(log.text().find("checkpoints are written again (shard 0 at step 60), after 2 failed writes "
                        "since step 40") != std::string::npos);

  // What a delta may be written against: a step written, or queued until its write fails.
  CHECK(writer.Holds(0, 60));
  CHECK_FALSE(writer.Holds(0, 40));  // failed
  CHECK_FALSE(writer.Holds(1, 60));  // another shard's
  disk->SetDiskCapacity(0);          // no room for any other file: the next writes fail
  writer.Enqueue(State(0, 70));
  writer.Enqueue(State(0, 80));
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (writer.failure().failed_writes < 2 && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(5));
  REQUIRE(writer.failure().failed_writes == 2);
  CHECK_FALSE(writer.Holds(0, 70));
  CHECK_FALSE(writer.Holds(0, 80));
  CHECK(writer.Holds(0, 60));
}

TEST_CASE(
    "the rollback target itself is never deleted to make room; writing resumes when space is "
    "freed") {
  TempDir dir;
  std::unique_ptr<FaultInjectingFileSystem> disk = SmallDisk(2);
  CheckpointWriter writer(dir.path(), /*keep=*/2, *disk);
  REQUIRE(writer.WriteNow(State(0, 10)).ok());
  REQUIRE(writer.WriteNow(State(1, 10)).ok());
  writer.set_retain_from(10);
  CHECK_FALSE(writer.WriteNow(State(0, 20)).ok());
  CHECK(StepsOnDisk(dir.path(), 0) == std::vector<int64_t>{10});
  CHECK(StepsOnDisk(dir.path(), 1) == std::vector<int64_t>{10});
  CHECK(writer.failure().failing_since_step == 20);
  disk->SetDiskCapacity(10 * kFileBytes);  // the operator freed space
  writer.Enqueue(State(0, 30));
  for (int i = 0; i < 500 && writer.newest_step(0) != 30; ++i)
    absl::SleepFor(absl::Milliseconds(10));
  CHECK(writer.newest_step(0) == 30);
  CHECK(writer.failure().failed_writes == 0);
}

}  // namespace
}  // namespace paramserver
