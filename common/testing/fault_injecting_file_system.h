// A FileSystem over real files that fails on purpose, as LevelDB's FaultInjectionTestEnv
// does: a disk that fills up (a write stops short where the space ends, with "No space
// left on device"), and fsyncs and renames that fail. Tests hand it to the code under
// test in place of LocalFileSystem() and then check what a failure left on disk.
#ifndef PARAMSERVER_COMMON_TESTING_FAULT_INJECTING_FILE_SYSTEM_H_
#define PARAMSERVER_COMMON_TESTING_FAULT_INJECTING_FILE_SYSTEM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/files/file_system.h"

namespace paramserver {

// Thread-safe. Every operation not failed on purpose is passed to `base`.
class FaultInjectingFileSystem : public FileSystem {
 public:
  explicit FaultInjectingFileSystem(FileSystem& base = LocalFileSystem()) : base_(base) {}

  // A disk of `bytes`: appends beyond it stop short. Used space is what was appended
  // through this object since it was made, less the sizes of the files it deleted,
  // truncated or renamed over. Unlimited until called; may be called again (the
  // operator frees space).
  void SetDiskCapacity(int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // The next `count` Sync() calls on any file fail with "Input/output error".
  void FailNextSyncs(int count) ABSL_LOCKS_EXCLUDED(mu_);
  // The next `count` RenameFile() calls fail with "Input/output error"; nothing is renamed.
  void FailNextRenames(int count) ABSL_LOCKS_EXCLUDED(mu_);
  // How many operations were failed on purpose so far.
  int injected_failures() const ABSL_LOCKS_EXCLUDED(mu_);

  absl::StatusOr<std::string> ReadFile(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                                FileAccess access) override;
  absl::StatusOr<std::unique_ptr<WritableFile>> NewAppendableFile(const std::string& path) override;
  absl::Status RenameFile(const std::string& from, const std::string& to) override;
  absl::Status SyncDir(const std::string& dir) override;
  absl::Status DeleteFile(const std::string& path) override;
  absl::Status CreateDir(const std::string& dir) override;
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override;
  bool FileExists(const std::string& path) override;

 private:
  class FaultyFile;
  // How much of `size` bytes fits on the disk; reserves it.
  int64_t ReserveSpace(int64_t size) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes the size of `path` (if it exists) off the bytes used.
  void ReleaseSpaceOf(const std::string& path) ABSL_LOCKS_EXCLUDED(mu_);
  bool TakeSyncFailure() ABSL_LOCKS_EXCLUDED(mu_);

  FileSystem& base_;
  mutable absl::Mutex mu_;
  int64_t capacity_ ABSL_GUARDED_BY(mu_) = -1;  // -1: unlimited
  int64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  int sync_failures_ ABSL_GUARDED_BY(mu_) = 0;
  int rename_failures_ ABSL_GUARDED_BY(mu_) = 0;
  int injected_failures_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_TESTING_FAULT_INJECTING_FILE_SYSTEM_H_
