#include "common/config/storage_checks.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "catch2/catch.hpp"
#include "common/files/file_system.h"
#include "common/testing/local_cluster.h"
#include "common/testing/temp_dir.h"

namespace paramserver {
namespace {

TEST_CASE("an unreadable input names its key, its path and why") {
  TempDir dir;
  const std::string present = dir.WriteFile("train.gz", "x");
  CHECK(CheckReadable("data.train_images", present).ok());
  absl::Status absent = CheckReadable("data.train_images", dir.File("absent.gz"));
  CHECK(absent.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(absent.message()) == "data.train_images: " + dir.File("absent.gz") +
                                             " cannot be read: No such file or directory");
}

TEST_CASE("an output that cannot be written is found at start, and no probe is left") {
  TempDir dir;
  CHECK(CheckWritable("output.weights", dir.File("out/deeper/w.safetensors"), OutputKind::kFile)
            .ok());
  CHECK(LocalFileSystem().FileExists(dir.File("out/deeper")));  // made, as the writer would
  CHECK(LocalFileSystem().ListDir(dir.File("out/deeper"))->empty());
  // A read-only folder, as /etc/ps is under the units' ProtectSystem=strict. (Root
  // writes anywhere, so the case is made with a path under a file instead.)
  const std::string file = dir.WriteFile("plain-file", "x");
  absl::Status blocked =
      CheckWritable("output.weights", file + "/w.safetensors", OutputKind::kFile);
  CHECK(blocked.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(blocked.message())
            .rfind("output.weights: " + file +
                       "/w.safetensors cannot be written (checked at start, so that nothing is "
                       "lost at the end): ",
                   0) == 0);
  if (geteuid() != 0) {
    REQUIRE(CreateDirRecursively(LocalFileSystem(), dir.File("readonly")).ok());
    chmod(dir.File("readonly").c_str(), 0555);
    CHECK_FALSE(
        CheckWritable("output.report", dir.File("readonly/r.html"), OutputKind::kFile).ok());
  }
}

TEST_CASE("the spec's keys are checked for the process that uses them; s3 through the CLI") {
  TempDir dir;
  setenv("AWS_STANDIN_ROOT", dir.path().c_str(), 1);
  const std::string aws = RunfilePath("tests/stand_ins/aws");
  setenv("PATH", (aws.substr(0, aws.rfind('/')) + ":" + std::getenv("PATH")).c_str(), 1);
  REQUIRE(CreateDirRecursively(LocalFileSystem(), dir.File("s3/ps-bucket/data")).ok());
  dir.WriteFile("s3/ps-bucket/data/train.gz", "x");
  ClusterSpec spec;
  spec.data.train_images = "s3://ps-bucket/data/train.gz";
  spec.data.train_labels = "s3://ps-bucket/data/labels.gz";  // absent
  spec.data.test_images = dir.WriteFile("t.gz", "x");
  spec.data.test_labels = dir.WriteFile("l.gz", "x");
  spec.output.weights = "s3://ps-bucket/out/w.safetensors";
  spec.checkpoint.dir = "s3://no-such-bucket/ckpt";
  absl::Status worker = CheckSpecStorage(spec, StorageUser::kWorker);
  CHECK(std::string(worker.message()) ==
        "data.train_labels: s3://ps-bucket/data/labels.gz cannot be read: no such object, or "
        "this machine's credentials may not read it");
  CHECK(CheckSpecStorage(spec, StorageUser::kFinisher).ok());
  // The probe object was written and deleted again.
  CHECK(LocalFileSystem().ListDir(dir.File("s3/ps-bucket/out"))->empty());
  CHECK(LocalFileSystem().FileExists(dir.File("calls.log")));
  absl::Status server = CheckSpecStorage(spec, StorageUser::kServer);
  CHECK(std::string(server.message())
            .rfind("checkpoint.dir: s3://no-such-bucket/ckpt cannot be "
                   "written",
                   0) == 0);
  CHECK(std::string(server.message()).find("NoSuchBucket") != std::string::npos);
  CHECK(CheckSpecStorage(spec, StorageUser::kScheduler).ok());  // no output.report
  CHECK_FALSE(CheckSpecStorage(spec, StorageUser::kEverything).ok());
}

}  // namespace
}  // namespace paramserver
