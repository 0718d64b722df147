#include "common/testing/fault_injecting_file_system.h"

#include <sys/stat.h>

#include "absl/strings/str_cat.h"

namespace paramserver {

class FaultInjectingFileSystem::FaultyFile : public WritableFile {
 public:
  FaultyFile(FaultInjectingFileSystem& owner, std::string path, std::unique_ptr<WritableFile> file)
      : owner_(owner), path_(std::move(path)), file_(std::move(file)) {}

  absl::Status Append(absl::string_view data) override {
    const int64_t fits = owner_.ReserveSpace(static_cast<int64_t>(data.size()));
    if (fits < static_cast<int64_t>(data.size())) {
      // A short write: what fits lands, the rest does not.
      file_->Append(data.substr(0, static_cast<size_t>(fits))).IgnoreError();
      return absl::UnavailableError(absl::StrCat("write ", path_, ": No space left on device"));
    }
    return file_->Append(data);
  }

  absl::Status Sync() override {
    if (owner_.TakeSyncFailure()) {
      return absl::UnavailableError(absl::StrCat("fsync ", path_, ": Input/output error"));
    }
    return file_->Sync();
  }

  absl::Status Close() override { return file_->Close(); }

 private:
  FaultInjectingFileSystem& owner_;
  const std::string path_;
  const std::unique_ptr<WritableFile> file_;
};

void FaultInjectingFileSystem::SetDiskCapacity(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  capacity_ = bytes;
}

void FaultInjectingFileSystem::FailNextSyncs(int count) {
  absl::MutexLock lock(&mu_);
  sync_failures_ = count;
}

void FaultInjectingFileSystem::FailNextRenames(int count) {
  absl::MutexLock lock(&mu_);
  rename_failures_ = count;
}

int FaultInjectingFileSystem::injected_failures() const {
  absl::MutexLock lock(&mu_);
  return injected_failures_;
}

int64_t FaultInjectingFileSystem::ReserveSpace(int64_t size) {
  absl::MutexLock lock(&mu_);
  if (capacity_ < 0) {
    used_ += size;
    return size;
  }
  const int64_t fits = std::max<int64_t>(0, std::min(size, capacity_ - used_));
  used_ += fits;
  if (fits < size) ++injected_failures_;
  return fits;
}

void FaultInjectingFileSystem::ReleaseSpaceOf(const std::string& path) {
  struct stat info;
  if (stat(path.c_str(), &info) != 0) return;
  absl::MutexLock lock(&mu_);
  used_ = std::max<int64_t>(0, used_ - static_cast<int64_t>(info.st_size));
}

bool FaultInjectingFileSystem::TakeSyncFailure() {
  absl::MutexLock lock(&mu_);
  if (sync_failures_ == 0) return false;
  --sync_failures_;
  ++injected_failures_;
  return true;
}

absl::StatusOr<std::string> FaultInjectingFileSystem::ReadFile(const std::string& path) {
  return base_.ReadFile(path);
}

absl::StatusOr<std::unique_ptr<WritableFile>> FaultInjectingFileSystem::NewWritableFile(
    const std::string& path, FileAccess access) {
  ReleaseSpaceOf(path);  // truncated
  absl::StatusOr<std::unique_ptr<WritableFile>> file = base_.NewWritableFile(path, access);
  if (!file.ok()) return file.status();
  return std::unique_ptr<WritableFile>(new FaultyFile(*this, path, *std::move(file)));
}

absl::StatusOr<std::unique_ptr<WritableFile>> FaultInjectingFileSystem::NewAppendableFile(
    const std::string& path) {
  absl::StatusOr<std::unique_ptr<WritableFile>> file = base_.NewAppendableFile(path);
  if (!file.ok()) return file.status();
  return std::unique_ptr<WritableFile>(new FaultyFile(*this, path, *std::move(file)));
}

absl::Status FaultInjectingFileSystem::RenameFile(const std::string& from, const std::string& to) {
  {
    absl::MutexLock lock(&mu_);
    if (rename_failures_ > 0) {
      --rename_failures_;
      ++injected_failures_;
      return absl::UnavailableError(
          absl::StrCat("rename ", from, " to ", to, ": Input/output error"));
    }
  }
  ReleaseSpaceOf(to);  // replaced
  return base_.RenameFile(from, to);
}

absl::Status FaultInjectingFileSystem::SyncDir(const std::string& dir) {
  return base_.SyncDir(dir);
}

absl::Status FaultInjectingFileSystem::DeleteFile(const std::string& path) {
  ReleaseSpaceOf(path);
  return base_.DeleteFile(path);
}

absl::Status FaultInjectingFileSystem::CreateDir(const std::string& dir) {
  return base_.CreateDir(dir);
}

absl::StatusOr<std::vector<std::string>> FaultInjectingFileSystem::ListDir(const std::string& dir) {
  return base_.ListDir(dir);
}

bool FaultInjectingFileSystem::FileExists(const std::string& path) {
  return base_.FileExists(path);
}

}  // namespace paramserver
