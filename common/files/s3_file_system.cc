#include "common/files/s3_file_system.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/files/subprocess.h"

namespace paramserver {
namespace {

// Buffers what is written; uploads it whole on Close (or Sync).
class S3WritableFile : public WritableFile {
 public:
  S3WritableFile(S3FileSystem* fs, std::string path) : fs_(fs), path_(std::move(path)) {}
  absl::Status Append(absl::string_view data) override {
    absl::StrAppend(&contents_, data);
    return absl::OkStatus();
  }
  // S3 has no partial object: the data is made durable by the upload.
  absl::Status Sync() override {
    if (uploaded_) return absl::OkStatus();
    uploaded_ = true;
    return fs_->Upload(path_, contents_);
  }
  absl::Status Close() override { return Sync(); }

 private:
  S3FileSystem* const fs_;
  const std::string path_;
  std::string contents_;
  bool uploaded_ = false;
};

// The last line of the CLI's error output, trimmed: "fatal error: An error occurred
// (404) when calling the HeadObject operation: Key "x" does not exist".
std::string LastLine(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipWhitespace());
  return lines.empty() ? "" : std::string(absl::StripAsciiWhitespace(lines.back()));
}

}  // namespace

bool IsS3Uri(absl::string_view path) { return absl::StartsWith(path, "s3://"); }

absl::Status ValidateS3Uri(absl::string_view uri) {
  if (!IsS3Uri(uri)) return absl::InvalidArgumentError(absl::StrCat(uri, ": not an s3:// URI"));
  const absl::string_view rest = uri.substr(5);
  const size_t slash = rest.find('/');
  const absl::string_view bucket = rest.substr(0, slash);
  if (bucket.size() < 3 || bucket.size() > 63 ||
      !std::all_of(bucket.begin(), bucket.end(), [](char c) {
        return absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '.' || c == '-';
      })) {
    return absl::InvalidArgumentError(
        absl::StrCat(uri, ": the bucket name '", bucket,
                     "' is not one S3 allows (3 to 63 of a-z, 0-9, '.' and '-')"));
  }
  if (slash == absl::string_view::npos || slash + 1 == rest.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(uri, ": no object key after the bucket (s3://BUCKET/KEY)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> S3FileSystem::Run(const std::string& what,
                                              std::vector<std::string> args,
                                              const std::vector<std::string>& uris,
                                              absl::string_view input) {
  for (const std::string& uri : uris) {
    if (absl::Status valid = ValidateS3Uri(uri); !valid.ok()) return valid;
  }
  args.insert(args.begin(), {options_.cli, "s3"});
  args.push_back("--only-show-errors");
  absl::StatusOr<CommandResult> ran = RunCommand(args, input, options_.timeout);
  if (!ran.ok()) return absl::UnavailableError(absl::StrCat(what, ": ", ran.status().message()));
  if (ran->exit_code == 0) return std::move(ran->standard_output);
  const std::string said = LastLine(ran->standard_error);
  // `aws s3 ls` of nothing exits 1 and says nothing; a missing object's cp says 404.
  const bool missing = (ran->exit_code == 1 && said.empty()) || absl::StrContains(said, "(404)") ||
                       absl::StrContains(said, "NoSuchKey") ||
                       absl::StrContains(said, "does not exist");
  const std::string message = absl::StrCat(what, ": aws s3 exited with status ", ran->exit_code,
                                           said.empty() ? "" : absl::StrCat(": ", said));
  return missing ? absl::NotFoundError(message) : absl::UnavailableError(message);
}

absl::StatusOr<std::string> S3FileSystem::ReadFile(const std::string& path) {
  return Run(absl::StrCat("read ", path), {"cp", path, "-"}, {path});
}

absl::Status S3FileSystem::Upload(const std::string& path, absl::string_view contents) {
  return Run(absl::StrCat("write ", path), {"cp", "-", path}, {path}, contents).status();
}

absl::StatusOr<std::unique_ptr<WritableFile>> S3FileSystem::NewWritableFile(const std::string& path,
                                                                            FileAccess access) {
  if (absl::Status valid = ValidateS3Uri(path); !valid.ok()) return valid;
  // Who may read an object is the bucket's policy's business; credentials never go to S3.
  if (access == FileAccess::kOwnerOnly) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": files holding a credential are kept on local disk, not in S3"));
  }
  return std::unique_ptr<WritableFile>(new S3WritableFile(this, path));
}

absl::StatusOr<std::unique_ptr<WritableFile>> S3FileSystem::NewAppendableFile(
    const std::string& path) {
  return absl::UnimplementedError(
      absl::StrCat(path, ": S3 objects cannot be appended to; use a local path"));
}

absl::Status S3FileSystem::RenameFile(const std::string& from, const std::string& to) {
  return Run(absl::StrCat("rename ", from, " to ", to), {"mv", from, to}, {from, to}).status();
}

absl::Status S3FileSystem::DeleteFile(const std::string& path) {
  if (!FileExists(path))
    return absl::NotFoundError(absl::StrCat("delete ", path, ": no such object"));
  return Run(absl::StrCat("delete ", path), {"rm", path}, {path}).status();
}

absl::StatusOr<std::vector<std::string>> S3FileSystem::ListDir(const std::string& dir) {
  const std::string prefix = absl::StrCat(absl::StripSuffix(dir, "/"), "/");
  absl::StatusOr<std::string> listing = Run(absl::StrCat("list ", dir), {"ls", prefix}, {prefix});
  if (!listing.ok()) return listing.status();  // NOT_FOUND: nothing under it
  // "                           PRE sub/" and "2026-11-30 12:00:00       1234 name".
  std::vector<std::string> names;
  for (absl::string_view line : absl::StrSplit(*listing, '\n', absl::SkipWhitespace())) {
    line = absl::StripAsciiWhitespace(line);
    if (absl::ConsumePrefix(&line, "PRE ")) {
      names.emplace_back(absl::StripSuffix(absl::StripAsciiWhitespace(line), "/"));
      continue;
    }
    // Skip the date, the time and the size; the name is the rest (it may hold spaces).
    for (int field = 0; field < 3; ++field) {
      const size_t space = line.find(' ');
      if (space == absl::string_view::npos) {
        line = {};
        break;
      }
      line = absl::StripLeadingAsciiWhitespace(line.substr(space));
    }
    if (!line.empty()) names.emplace_back(line);
  }
  return names;
}

bool S3FileSystem::FileExists(const std::string& path) {
  if (!ValidateS3Uri(path).ok()) return false;
  absl::StatusOr<std::string> listing = Run(absl::StrCat("look up ", path), {"ls", path}, {path});
  if (!listing.ok()) return false;
  // `aws s3 ls s3://b/k` lists every key starting with "k": look for "k" itself.
  const std::string name = path.substr(path.rfind('/') + 1);
  for (absl::string_view line : absl::StrSplit(*listing, '\n', absl::SkipWhitespace())) {
    if (absl::EndsWith(absl::StripTrailingAsciiWhitespace(line), absl::StrCat(" ", name)))
      return true;
  }
  return false;
}

absl::Status S3FileSystem::Download(const std::string& path, const std::string& local_path) {
  return Run(absl::StrCat("download ", path), {"cp", path, local_path}, {path}).status();
}

S3FileSystem& DefaultS3FileSystem() {
  static S3FileSystem* const s3 = new S3FileSystem();
  return *s3;
}

FileSystem& FileSystemFor(absl::string_view path) {
  return IsS3Uri(path) ? static_cast<FileSystem&>(DefaultS3FileSystem()) : LocalFileSystem();
}

std::string DefaultDownloadFolder() {
  const auto set = [](const char* name) {
    const char* value = std::getenv(name);
    return value != nullptr && value[0] != '\0' ? std::string(value) : std::string();
  };
  if (std::string dir = set("PS_CACHE_DIR"); !dir.empty()) return dir;
  if (std::string dir = set("XDG_CACHE_HOME"); !dir.empty()) return dir + "/paramserver";
  if (std::string dir = set("HOME"); !dir.empty()) return dir + "/.cache/paramserver";
  return "/tmp/paramserver-cache";
}

absl::StatusOr<std::string> LocalCopyOf(const std::string& key, const std::string& path,
                                        const std::string& cache_dir) {
  if (!IsS3Uri(path)) return path;
  if (absl::Status valid = ValidateS3Uri(path); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(key, ": ", valid.message()));
  }
  if (absl::Status made = CreateDirRecursively(LocalFileSystem(), cache_dir); !made.ok()) {
    return absl::UnavailableError(
        absl::StrCat(key, ": cannot make the download folder ", cache_dir, ": ", made.message()));
  }
  // s3://bucket/a/b.gz -> CACHE/bucket/a/b.gz: readable, and the extension kept (the
  // readers look at it).
  const std::string local = absl::StrCat(cache_dir, "/", path.substr(5));
  if (absl::Status made = CreateDirRecursively(LocalFileSystem(), DirectoryOf(local)); !made.ok()) {
    return absl::UnavailableError(absl::StrCat(key, ": ", made.message()));
  }
  // Into a temporary beside it (one per process: workers on one machine share the
  // folder), renamed once complete: a copy that is there is whole.
  const std::string partial = absl::StrCat(local, ".part.", getpid());
  if (absl::Status got = DefaultS3FileSystem().Download(path, partial); !got.ok()) {
    LocalFileSystem().DeleteFile(partial).IgnoreError();
    return absl::Status(got.code(),
                        absl::StrCat(key, ": ", path, " cannot be read: ", got.message()));
  }
  if (absl::Status renamed = LocalFileSystem().RenameFile(partial, local); !renamed.ok()) {
    return absl::UnavailableError(absl::StrCat(key, ": ", renamed.message()));
  }
  return local;
}

}  // namespace paramserver
