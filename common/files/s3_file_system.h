// Amazon S3 as a FileSystem, through the AWS CLI (Debian's `awscli`), for the spec's
// s3:// URIs: data.*, model.init_from, checkpoint.dir, output.weights and output.report.
//
// Why the CLI and not a library: Debian packages no C++ S3 client (the AWS SDK for C++
// is not in Debian 12), and the CLI is maintained, already on every instance (cloud-init
// installs it), and takes its credentials the standard way (the instance role through
// IMDSv2, or AWS_* variables), with retries, multipart uploads and checksums of its own.
// Each operation is one `aws s3 ...` run with a deadline.
//
// Mapping: a path is "s3://BUCKET/KEY". Folders do not exist in S3: CreateDir and SyncDir
// succeed without a call; ListDir lists the keys under "KEY/" one level deep. A written
// file is uploaded whole when it is closed (an S3 PUT is atomic, so a reader sees the old
// object or the new one); RenameFile is `aws s3 mv` (copy, then delete).
#ifndef PARAMSERVER_COMMON_FILES_S3_FILE_SYSTEM_H_
#define PARAMSERVER_COMMON_FILES_S3_FILE_SYSTEM_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/files/file_system.h"

namespace paramserver {

// True for "s3://...".
bool IsS3Uri(absl::string_view path);

// OK for "s3://BUCKET/KEY" with a bucket name S3 allows (3-63 of a-z, 0-9, '.', '-') and
// a non-empty key; otherwise INVALID_ARGUMENT saying what is wrong with `uri`.
absl::Status ValidateS3Uri(absl::string_view uri);

struct S3Options {
  std::string cli = "aws";  // the AWS CLI, looked up on PATH
  // One operation's limit (an upload or download of a whole file included).
  absl::Duration timeout = absl::Minutes(30);
};

class S3FileSystem : public FileSystem {
 public:
  explicit S3FileSystem(S3Options options = {}) : options_(std::move(options)) {}

  absl::StatusOr<std::string> ReadFile(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                                FileAccess access) override;
  // UNIMPLEMENTED: S3 objects cannot be appended to (TensorBoard's event files, the only
  // appended files, stay local).
  absl::StatusOr<std::unique_ptr<WritableFile>> NewAppendableFile(const std::string& path) override;
  absl::Status RenameFile(const std::string& from, const std::string& to) override;
  absl::Status SyncDir(const std::string& dir) override { return absl::OkStatus(); }
  absl::Status DeleteFile(const std::string& path) override;
  absl::Status CreateDir(const std::string& dir) override { return absl::OkStatus(); }
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& dir) override;
  bool FileExists(const std::string& path) override;

  // Uploads `contents` to `path` (an s3:// URI). Used by the writable files on Close.
  absl::Status Upload(const std::string& path, absl::string_view contents);
  // Downloads the object `path` into the local file `local_path` (streamed to disk, so a
  // data file larger than memory is fine).
  absl::Status Download(const std::string& path, const std::string& local_path);

 private:
  // Runs `aws s3 ARGS...`; INVALID_ARGUMENT for a malformed URI among `uris`, the
  // runner's errors, or the CLI's exit status and message: NOT_FOUND for a missing object,
  // UNAVAILABLE otherwise, each naming `what`.
  absl::StatusOr<std::string> Run(const std::string& what, std::vector<std::string> args,
                                  const std::vector<std::string>& uris,
                                  absl::string_view input = "");
  const S3Options options_;
};

// The process's S3 file system (the `aws` on PATH). Lives for the whole process.
S3FileSystem& DefaultS3FileSystem();

// The file system for `path`: S3 for an s3:// URI, else this machine's.
FileSystem& FileSystemFor(absl::string_view path);

// Where s3:// data files are downloaded to: $PS_CACHE_DIR if set, else
// $XDG_CACHE_HOME/paramserver, else $HOME/.cache/paramserver (/var/lib/ps/.cache/paramserver
// for the EC2 units' user), else /tmp/paramserver-cache.
std::string DefaultDownloadFolder();

// A local file holding the contents of `path`: `path` itself when it is local; for an
// s3:// URI, a copy downloaded into `cache_dir` (made if missing) as
// CACHE_DIR/BUCKET/KEY, fetched afresh at each call. `key` names the spec key in errors, e.g.
// "data.train_images: s3://b/train.gz cannot be read: ...".
absl::StatusOr<std::string> LocalCopyOf(const std::string& key, const std::string& path,
                                        const std::string& cache_dir);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_FILES_S3_FILE_SYSTEM_H_
