// The file layer: LocalFileSystem's primitives, and what WriteFileAtomically leaves on
// disk when the fault-injecting fake fails it at each step (a full disk, a short write, a
// failed fsync, a failed rename): the previous file, whole, and never part of a new one.
#include "common/files/file_system.h"

#include <algorithm>

#include "catch2/catch.hpp"
#include "common/checkpoint/shard_checkpoint.h"
#include "common/testing/fault_injecting_file_system.h"
#include "common/testing/temp_dir.h"

namespace paramserver {
namespace {

std::vector<std::string> SortedNames(FileSystem& fs, const std::string& dir) {
  absl::StatusOr<std::vector<std::string>> names = fs.ListDir(dir);
  REQUIRE(names.ok());
  std::sort(names->begin(), names->end());
  return *names;
}

ShardState Checkpoint(int64_t step) {
  ShardState state;
  state.shard_id = 3;
  state.range = {100, 200};
  state.step = step;
  state.values.assign(100, static_cast<float>(step));
  state.optimizer = "adam(exp_avg,exp_avg_sq)";
  state.slots = {std::vector<float>(100, 0.5f), std::vector<float>(100, 0.25f)};
  return state;
}

TEST_CASE("the local file system reads, writes, lists, renames and deletes real files") {
  TempDir dir;
  FileSystem& fs = LocalFileSystem();
  const std::string path = dir.File("a");
  CHECK(fs.ReadFile(path).status().code() == absl::StatusCode::kNotFound);
  CHECK(fs.ReadFile(path).status().message().find(path) != absl::string_view::npos);
  REQUIRE(WriteFileAtomically(fs, path, "first").ok());
  REQUIRE(WriteFileAtomically(fs, path, std::string(200000, 'x')).ok());  // replaces
  CHECK(*fs.ReadFile(path) == std::string(200000, 'x'));
  absl::StatusOr<std::unique_ptr<WritableFile>> log = fs.NewAppendableFile(path);
  REQUIRE(log.ok());
  REQUIRE((*log)->Append("tail").ok());
  REQUIRE((*log)->Close().ok());
  CHECK(fs.ReadFile(path)->size() == 200004);
  CHECK(fs.FileExists(path));
  REQUIRE(fs.CreateDir(dir.File("sub")).ok());
  CHECK(fs.CreateDir(dir.File("sub")).ok());                           // already there
  CHECK(fs.CreateDir(path).code() == absl::StatusCode::kUnavailable);  // a file is there
  REQUIRE(CreateDirRecursively(fs, dir.File("x/y/z")).ok());
  CHECK(fs.FileExists(dir.File("x/y/z")));
  CHECK(CreateDirRecursively(fs, dir.File("x/y/z")).ok());
  REQUIRE(fs.RenameFile(path, dir.File("sub/b")).ok());
  CHECK(SortedNames(fs, dir.path()) == std::vector<std::string>{"sub", "x"});
  CHECK(SortedNames(fs, dir.File("sub")) == std::vector<std::string>{"b"});
  REQUIRE(fs.DeleteFile(dir.File("sub/b")).ok());
  CHECK(fs.DeleteFile(dir.File("sub/b")).code() == absl::StatusCode::kNotFound);
  CHECK_FALSE(fs.FileExists(dir.File("sub/b")));
  CHECK(fs.ListDir(dir.File("none")).status().code() == absl::StatusCode::kNotFound);
  CHECK(DirectoryOf("/a/b/c") == "/a/b");
  CHECK(DirectoryOf("/c") == "/");
  CHECK(DirectoryOf("c") == ".");
}

TEST_CASE("a write that fails at any step leaves the previous file whole and no temporary") {
  TempDir dir;
  FaultInjectingFileSystem fs;
  const std::string path = dir.File("state");
  REQUIRE(WriteFileAtomically(fs, path, "the previous contents").ok());
  const std::string next(4096, 'n');

  SECTION("disk full before the first byte") { fs.SetDiskCapacity(0); }
  SECTION("a short write: the disk fills part way") { fs.SetDiskCapacity(21 + 1000); }
  SECTION("a failed fsync") { fs.FailNextSyncs(1); }
  SECTION("a failed rename") { fs.FailNextRenames(1); }

  const absl::Status written = WriteFileAtomically(fs, path, next);
  CHECK(written.code() == absl::StatusCode::kUnavailable);
  CHECK(written.message().find(path) != absl::string_view::npos);
  CHECK(fs.injected_failures() == 1);
  CHECK(*fs.ReadFile(path) == "the previous contents");
  CHECK(SortedNames(fs, dir.path()) == std::vector<std::string>{"state"});
}

TEST_CASE("disk full while writing a checkpoint leaves the previous checkpoint readable") {
  TempDir dir;
  FaultInjectingFileSystem fs;
  REQUIRE(WriteShardCheckpoint(fs, dir.path(), Checkpoint(10)).ok());
  const std::vector<std::string> before = SortedNames(fs, dir.path());
  fs.SetDiskCapacity(0);

  const absl::Status written = WriteShardCheckpoint(fs, dir.path(), Checkpoint(20));
  CHECK(written.code() == absl::StatusCode::kUnavailable);
  CHECK(written.message().find("No space left on device") != absl::string_view::npos);
  CHECK(SortedNames(fs, dir.path()) == before);
  absl::StatusOr<ShardState> newest = LoadNewestShardCheckpoint(fs, dir.path(), 3, {100, 200});
  REQUIRE(newest.ok());
  CHECK(newest->step == 10);
  CHECK(newest->values == Checkpoint(10).values);
  CHECK(NewestCompleteCheckpointStep(fs, dir.path(), 200) == -1);  // [0, 100) never written
}

TEST_CASE("a failed rename leaves no half-written checkpoint visible") {
  TempDir dir;
  FaultInjectingFileSystem fs;
  REQUIRE(WriteShardCheckpoint(fs, dir.path(), Checkpoint(10)).ok());
  fs.FailNextRenames(1);

  const absl::Status written = WriteShardCheckpoint(fs, dir.path(), Checkpoint(20));
  CHECK(written.code() == absl::StatusCode::kUnavailable);
  CHECK(written.message().find("rename") != absl::string_view::npos);
  const std::string failed_path = ShardCheckpointPath(dir.path(), 3, 20);
  CHECK(ReadShardCheckpoint(fs, failed_path).status().code() == absl::StatusCode::kNotFound);
  CHECK(SortedNames(fs, dir.path()) ==
        std::vector<std::string>{"shard-3-step-10.ckpt"});  // no temporary either
  CHECK(ListShardCheckpoints(fs, dir.path()).size() == 1);
  CHECK(LoadNewestShardCheckpoint(fs, dir.path(), 3, {100, 200})->step == 10);

  // The fault was one rename: the next write lands.
  REQUIRE(WriteShardCheckpoint(fs, dir.path(), Checkpoint(20)).ok());
  CHECK(LoadNewestShardCheckpoint(fs, dir.path(), 3, {100, 200})->step == 20);
}

}  // namespace
}  // namespace paramserver
