#include "common/files/file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace paramserver {
namespace {

absl::Status ErrnoError(absl::string_view action, const std::string& path, int error) {
  const std::string message = absl::StrCat(action, " ", path, ": ", std::strerror(error));
  if (error == ENOENT) return absl::NotFoundError(message);
  return absl::UnavailableError(message);
}

class PosixWritableFile : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) close(fd_);
  }

  absl::Status Append(absl::string_view data) override {
    while (!data.empty()) {
      const ssize_t n = write(fd_, data.data(), data.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoError("write", path_, errno);
      }
      data.remove_prefix(static_cast<size_t>(n));
    }
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    if (fsync(fd_) != 0) return ErrnoError("fsync", path_, errno);
    return absl::OkStatus();
  }

  absl::Status Close() override {
    const int fd = fd_;
    fd_ = -1;
    if (close(fd) != 0) return ErrnoError("close", path_, errno);
    return absl::OkStatus();
  }

 private:
  const std::string path_;
  int fd_;
};

class PosixFileSystem : public FileSystem {
 public:
  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoError("open", path, errno);
    std::string contents;
    char buffer[1 << 16];
    while (true) {
      const ssize_t n = read(fd, buffer, sizeof(buffer));
      if (n < 0) {
        if (errno == EINTR) continue;
        const int error = errno;
        close(fd);
        return ErrnoError("read", path, error);
      }
      if (n == 0) break;
      contents.append(buffer, static_cast<size_t>(n));
    }
    close(fd);
    return contents;
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                                FileAccess access) override {
    return Open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                access == FileAccess::kOwnerOnly ? 0600 : 0644);
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewAppendableFile(
      const std::string& path) override {
    return Open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  }

  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    if (rename(from.c_str(), to.c_str()) != 0) {
      return ErrnoError(absl::StrCat("rename ", from, " to"), to, errno);
    }
    return absl::OkStatus();
  }

  absl::Status SyncDir(const std::string& dir) override {
    const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoError("open folder", dir, errno);
    const int result = fsync(fd);
    const int error = errno;
    close(fd);
    if (result != 0) return ErrnoError("fsync folder", dir, error);
    return absl::OkStatus();
  }

  absl::Status DeleteFile(const std::string& path) override {
    if (unlink(path.c_str()) != 0) return ErrnoError("delete", path, errno);
    return absl::OkStatus();
  }

  absl::Status CreateDir(const std::string& dir) override {
    if (mkdir(dir.c_str(), 0755) == 0) return absl::OkStatus();
    const int error = errno;
    struct stat info;
    if (error == EEXIST && stat(dir.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) {
      return absl::OkStatus();
    }
    return ErrnoError("create folder", dir, error);
  }

  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override {
    DIR* listing = opendir(dir.c_str());
    if (listing == nullptr) return ErrnoError("list", dir, errno);
    std::vector<std::string> names;
    while (const dirent* entry = readdir(listing)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    closedir(listing);
    return names;
  }

  bool FileExists(const std::string& path) override { return access(path.c_str(), F_OK) == 0; }

 private:
  static absl::StatusOr<std::unique_ptr<WritableFile>> Open(const std::string& path, int flags,
                                                            mode_t mode) {
    const int fd = open(path.c_str(), flags, mode);
    if (fd < 0) return ErrnoError("create", path, errno);
    return std::unique_ptr<WritableFile>(new PosixWritableFile(path, fd));
  }
};

}  // namespace

FileSystem& LocalFileSystem() {
  static PosixFileSystem* const file_system = new PosixFileSystem();
  return *file_system;
}

absl::Status CreateDirRecursively(FileSystem& fs, const std::string& dir) {
  for (size_t slash = dir.find('/', 1); slash != std::string::npos;
       slash = dir.find('/', slash + 1)) {
    if (!fs.FileExists(dir.substr(0, slash))) {
      const absl::Status created = fs.CreateDir(dir.substr(0, slash));
      if (!created.ok()) return created;
    }
  }
  return fs.CreateDir(dir);
}

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

absl::Status WriteFileAtomically(FileSystem& fs, const std::string& path,
                                 absl::string_view contents, FileAccess access) {
  // Unique per process and per call, so two writers of one path never share a temporary.
  static std::atomic<uint64_t> next_temporary{0};
  const std::string temporary = absl::StrCat(path, ".tmp.", getpid(), ".", next_temporary++);
  absl::StatusOr<std::unique_ptr<WritableFile>> file = fs.NewWritableFile(temporary, access);
  if (!file.ok()) return file.status();
  absl::Status written = (*file)->Append(contents);
  if (written.ok()) written = (*file)->Sync();
  const absl::Status closed = (*file)->Close();
  if (written.ok()) written = closed;
  if (written.ok()) written = fs.RenameFile(temporary, path);
  if (!written.ok()) {
    fs.DeleteFile(temporary).IgnoreError();  // it may be gone already; the error above matters
    return written;
  }
  // The rename is done: the new file is in place. A failed folder fsync only means it may
  // not survive a power cut, which the caller learns of.
  return fs.SyncDir(DirectoryOf(path));
}

}  // namespace paramserver
