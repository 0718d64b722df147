// The one file layer every daemon's files go through, in the way LevelDB's Env works: a
// small interface of primitive operations (LocalFileSystem() does them on this machine's
// disk; common/testing/fault_injecting_file_system.h fails them on purpose), and the
// few ways of using them that the code base needs, written once on top of it.
#ifndef PARAMSERVER_COMMON_FILES_FILE_SYSTEM_H_
#define PARAMSERVER_COMMON_FILES_FILE_SYSTEM_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace paramserver {

// An open file being written. Not thread-safe; owned by the one who opened it. The
// destructor closes the file if Close() was not called (ignoring any error).
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Appends all of `data`. UNAVAILABLE naming the file (e.g. "No space left on device")
  // if not all of it was written; what was written stays.
  virtual absl::Status Append(absl::string_view data) = 0;
  // Flushes the file's contents to the disk (fsync). UNAVAILABLE naming the file on failure.
  virtual absl::Status Sync() = 0;
  // Closes the file. UNAVAILABLE naming the file on failure. Call at most once.
  virtual absl::Status Close() = 0;
};

// Who may read a file that is created: everyone (0644), or its owner only (0600, for
// files that hold a credential).
enum class FileAccess { kWorldReadable, kOwnerOnly };

// The primitive operations. Implementations are thread-safe. Every error names the path.
class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // The whole contents of `path`. NOT_FOUND if it does not exist; UNAVAILABLE otherwise.
  virtual absl::StatusOr<std::string> ReadFile(const std::string& path) = 0;
  // Creates (or truncates) `path` for writing, with `access` if it is created.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                                        FileAccess access) = 0;
  // Opens `path` for appending, creating it if needed.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewAppendableFile(
      const std::string& path) = 0;
  // Renames `from` to `to`, replacing `to` atomically if it exists.
  virtual absl::Status RenameFile(const std::string& from, const std::string& to) = 0;
  // Flushes the folder `dir` (its list of names) to the disk, so a rename in it lasts.
  virtual absl::Status SyncDir(const std::string& dir) = 0;
  // Deletes `path`. NOT_FOUND if it does not exist.
  virtual absl::Status DeleteFile(const std::string& path) = 0;
  // Creates the folder `dir`; OK if it already exists as a folder.
  virtual absl::Status CreateDir(const std::string& dir) = 0;
  // The names (not paths) of the entries of `dir`, without "." and "..", in no order.
  virtual absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) = 0;
  // Whether `path` exists.
  virtual bool FileExists(const std::string& path) = 0;
};

// This machine's files (POSIX). Lives for the whole process.
FileSystem& LocalFileSystem();

// Writes `contents` to `path` so that a crash or a failure at any point leaves either the
// old file or the complete new one, never part of one: a temporary file beside it is
// written, fsynced and renamed over `path`, then the folder is fsynced. On failure the
// temporary is deleted and the error (naming the step and the path) returned.
absl::Status WriteFileAtomically(FileSystem& fs, const std::string& path,
                                 absl::string_view contents,
                                 FileAccess access = FileAccess::kWorldReadable);

// Creates `dir` and every missing folder above it. The first error, naming the folder.
absl::Status CreateDirRecursively(FileSystem& fs, const std::string& dir);

// The folder part of `path` ("." when it has none).
std::string DirectoryOf(const std::string& path);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_FILES_FILE_SYSTEM_H_
