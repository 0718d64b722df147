// The S3 file system against the recording stand-in `aws` (tests/stand_ins/aws), which
// keeps objects as files and answers as the real CLI does, including its errors.
#include "common/files/s3_file_system.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "catch2/catch.hpp"
#include "common/checkpoint/shard_checkpoint.h"
#include "common/testing/local_cluster.h"
#include "common/testing/temp_dir.h"

namespace paramserver {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A stand-in S3 with the bucket "ps-bucket".
struct StandInS3 {
  TempDir dir;
  S3FileSystem fs{S3Options{RunfilePath("tests/stand_ins/aws"), absl::Seconds(30)}};
  StandInS3() {
    setenv("AWS_STANDIN_ROOT", dir.path().c_str(), 1);
    // DefaultS3FileSystem() runs the `aws` on PATH: the stand-in's folder comes first.
    const std::string aws = RunfilePath("tests/stand_ins/aws");
    const std::string path = aws.substr(0, aws.rfind('/')) + ":" + std::getenv("PATH");
    setenv("PATH", path.c_str(), 1);
    REQUIRE(CreateDirRecursively(LocalFileSystem(), dir.File("s3/ps-bucket")).ok());
  }
  std::string Calls() const { return Slurp(dir.File("calls.log")); }
};

TEST_CASE("s3 URIs are checked before any call") {
  CHECK(IsS3Uri("s3://b/k"));
  CHECK_FALSE(IsS3Uri("/var/lib/ps/s3://x"));
  CHECK(ValidateS3Uri("s3://ps-bucket/jobs/w.safetensors").ok());
  CHECK(std::string(ValidateS3Uri("s3://Bad_Bucket/k").message()) ==
        "s3://Bad_Bucket/k: the bucket name 'Bad_Bucket' is not one S3 allows (3 to 63 of a-z, "
        "0-9, '.' and '-')");
  CHECK(std::string(ValidateS3Uri("s3://ps-bucket").message()) ==
        "s3://ps-bucket: no object key after the bucket (s3://BUCKET/KEY)");
  CHECK(std::string(ValidateS3Uri("s3://ps-bucket/").message()).find("no object key") !=
        std::string::npos);
  StandInS3 s3;
  CHECK(s3.fs.ReadFile("s3://x/y").status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(s3.Calls().empty());  // refused before the CLI ran
}

TEST_CASE("objects are written whole, read back, listed, renamed and deleted") {
  StandInS3 s3;
  REQUIRE(WriteFileAtomically(s3.fs, "s3://ps-bucket/run/a.txt", "alpha").ok());
  CHECK(Slurp(s3.dir.File("s3/ps-bucket/run/a.txt")) == "alpha");
  absl::StatusOr<std::string> read = s3.fs.ReadFile("s3://ps-bucket/run/a.txt");
  REQUIRE(read.ok());
  CHECK(*read == "alpha");
  // WriteFileAtomically's temporary was uploaded, then moved over the name: an S3 PUT
  // is atomic, and the temporary does not stay.
  CHECK(s3.Calls().find("s3 cp - s3://ps-bucket/run/a.txt.tmp") != std::string::npos);
  CHECK(s3.Calls().find("s3 mv s3://ps-bucket/run/a.txt.tmp") != std::string::npos);
  REQUIRE(s3.fs.Upload("s3://ps-bucket/run/sub/b.txt", "beta").ok());
  absl::StatusOr<std::vector<std::string>> names = s3.fs.ListDir("s3://ps-bucket/run");
  REQUIRE(names.ok());
  CHECK(*names == std::vector<std::string>{"a.txt", "sub"});
  CHECK(s3.fs.FileExists("s3://ps-bucket/run/a.txt"));
  CHECK_FALSE(s3.fs.FileExists("s3://ps-bucket/run/a.tx"));  // a prefix is not the object
  REQUIRE(s3.fs.RenameFile("s3://ps-bucket/run/a.txt", "s3://ps-bucket/run/c.txt").ok());
  CHECK_FALSE(s3.fs.FileExists("s3://ps-bucket/run/a.txt"));
  REQUIRE(s3.fs.DeleteFile("s3://ps-bucket/run/c.txt").ok());
  CHECK(s3.fs.DeleteFile("s3://ps-bucket/run/c.txt").code() == absl::StatusCode::kNotFound);
  CHECK(s3.fs.ListDir("s3://ps-bucket/nothing").status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("the CLI's errors become statuses naming the object and what the CLI said") {
  StandInS3 s3;
  absl::StatusOr<std::string> missing = s3.fs.ReadFile("s3://ps-bucket/absent.bin");
  CHECK(missing.status().code() == absl::StatusCode::kNotFound);
  CHECK(std::string(missing.status().message())
            .find("read s3://ps-bucket/absent.bin: aws s3 exited with status 1: fatal error: An "
                  "error occurred (404)") == 0);
  absl::Status no_bucket = s3.fs.Upload("s3://other-bucket/x", "x");
  CHECK(no_bucket.code() == absl::StatusCode::kNotFound);
  CHECK(std::string(no_bucket.message()).find("NoSuchBucket") != std::string::npos);
  CHECK(s3.fs.NewWritableFile("s3://ps-bucket/token", FileAccess::kOwnerOnly).status().code() ==
        absl::StatusCode::kInvalidArgument);
  S3FileSystem absent_cli(S3Options{"no-such-aws-cli", absl::Seconds(5)});
  absl::StatusOr<std::string> unrunnable = absent_cli.ReadFile("s3://ps-bucket/x");
  CHECK(unrunnable.status().code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(unrunnable.status().message()).find("is it installed and on PATH?") !=
        std::string::npos);
}

TEST_CASE("shard checkpoints go to S3 and come back whole") {
  StandInS3 s3;
  ShardState state;
  state.shard_id = 3;
  state.range = {100, 104};
  state.step = 40;
  state.epoch = 2;
  state.values = {1, 2, 3, 4};
  state.optimizer = "adam(exp_avg,exp_avg_sq)";
  state.slots = {{0.1f, 0.2f, 0.3f, 0.4f}, {1e-3f, 2e-3f, 3e-3f, 4e-3f}};
  REQUIRE(WriteShardCheckpoint(s3.fs, "s3://ps-bucket/ckpt", state).ok());
  std::vector<CheckpointFileName> listed = ListShardCheckpoints(s3.fs, "s3://ps-bucket/ckpt");
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].path == "s3://ps-bucket/ckpt/shard-3-step-40.ckpt");
  absl::StatusOr<ShardState> loaded =
      LoadNewestShardCheckpoint(s3.fs, "s3://ps-bucket/ckpt", 3, {100, 104});
  REQUIRE(loaded.ok());
  CHECK(loaded->values == state.values);
  CHECK(loaded->slots == state.slots);
  CHECK(loaded->step == 40);
}

TEST_CASE("an s3:// data file is downloaded into the cache; a local one is used in place") {
  StandInS3 s3;
  REQUIRE(s3.fs.Upload("s3://ps-bucket/data/train.gz", "gzip bytes").ok());
  absl::StatusOr<std::string> local =
      LocalCopyOf("data.train_images", "s3://ps-bucket/data/train.gz", s3.dir.File("cache"));
  REQUIRE(local.ok());
  CHECK(*local == s3.dir.File("cache/ps-bucket/data/train.gz"));
  CHECK(Slurp(*local) == "gzip bytes");
  CHECK(*LocalCopyOf("data.train_images", "/usr/share/x.gz", s3.dir.File("cache")) ==
        "/usr/share/x.gz");
  absl::StatusOr<std::string> absent =
      LocalCopyOf("data.test_labels", "s3://ps-bucket/data/absent.gz", s3.dir.File("cache"));
  CHECK(absent.status().code() == absl::StatusCode::kNotFound);
  CHECK(std::string(absent.status().message())
            .find("data.test_labels: s3://ps-bucket/data/absent.gz cannot be read: ") == 0);
  CHECK(LocalFileSystem().ListDir(s3.dir.File("cache/ps-bucket/data"))->size() == 1);  // no .part
}

}  // namespace
}  // namespace paramserver
