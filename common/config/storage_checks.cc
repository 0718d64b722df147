#include "common/config/storage_checks.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/files/file_system.h"
#include "common/files/s3_file_system.h"
#include "spdlog/spdlog.h"

namespace paramserver {
namespace {

std::string ProbeName() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return absl::StrCat(".ps-write-check-", host, "-", getpid());
}

absl::Status WriteProbe(const std::string& folder) {
  FileSystem& fs = FileSystemFor(folder);
  if (absl::Status made = CreateDirRecursively(fs, folder); !made.ok()) return made;
  const std::string probe = absl::StrCat(folder, "/", ProbeName());
  absl::StatusOr<std::unique_ptr<WritableFile>> file =
      fs.NewWritableFile(probe, FileAccess::kWorldReadable);
  if (!file.ok()) return file.status();
  absl::Status written = (*file)->Append("probe");
  if (written.ok()) written = (*file)->Close();
  const absl::Status deleted = fs.DeleteFile(probe);  // whether or not it was written
  return written.ok() ? deleted : written;
}

}  // namespace

absl::Status CheckReadable(const std::string& key, const std::string& path) {
  std::string why;
  if (IsS3Uri(path)) {
    if (DefaultS3FileSystem().FileExists(path)) return absl::OkStatus();
    why = "no such object, or this machine's credentials may not read it";
  } else {
    std::ifstream in(path, std::ios::binary);
    if (in) return absl::OkStatus();
    why = std::strerror(errno);
  }
  return absl::FailedPreconditionError(absl::StrCat(key, ": ", path, " cannot be read: ", why));
}

absl::Status CheckWritable(const std::string& key, const std::string& path, OutputKind kind) {
  const std::string folder = kind == OutputKind::kFolder ? path : DirectoryOf(path);
  const absl::Status probed = WriteProbe(folder);
  if (probed.ok()) return probed;
  if (absl::StrContains(probed.message(), "No space left on device") ||
      absl::StrContains(probed.message(), "Disk quota exceeded")) {
    return absl::ResourceExhaustedError(absl::StrCat(
        key, ": ", path, " has no space left now: ", probed.message(),
        " (the job starts anyway: space may be freed; failed writes are reported as it runs)"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat(key, ": ", path,
                   " cannot be written (checked at start, so that nothing is lost at the end): ",
                   probed.message()));
}

absl::Status CheckSpecStorage(const ClusterSpec& spec, StorageUser user,
                              std::vector<std::string>* warnings) {
  const bool all = user == StorageUser::kEverything;
  std::vector<absl::Status> results;
  if (all || user == StorageUser::kWorker) {
    for (const auto& [key, path] :
         {std::pair<const char*, const std::string&>{"data.train_images", spec.data.train_images},
          {"data.train_labels", spec.data.train_labels},
          {"data.test_images", spec.data.test_images},
          {"data.test_labels", spec.data.test_labels},
          {"model.init_from", spec.model.init_from}}) {
      if (!path.empty()) results.push_back(CheckReadable(key, path));
    }
  }
  if ((all || user == StorageUser::kServer) && !spec.checkpoint.dir.empty()) {
    results.push_back(CheckWritable("checkpoint.dir", spec.checkpoint.dir, OutputKind::kFolder));
  }
  if ((all || user == StorageUser::kFinisher) && !spec.output.weights.empty()) {
    results.push_back(CheckWritable("output.weights", spec.output.weights, OutputKind::kFile));
  }
  if ((all || user == StorageUser::kScheduler) && !spec.output.report.empty()) {
    results.push_back(CheckWritable("output.report", spec.output.report, OutputKind::kFile));
  }
  for (const absl::Status& result : results) {
    if (result.code() == absl::StatusCode::kResourceExhausted) {
      if (warnings != nullptr) {
        warnings->emplace_back(result.message());
      } else {
        spdlog::warn("{}", std::string(result.message()));
      }
    } else if (!result.ok()) {
      return result;
    }
  }
  return absl::OkStatus();
}

}  // namespace paramserver
