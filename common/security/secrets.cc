#include "common/security/secrets.h"

#include <sys/random.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/files/file_system.h"
#include "openssl/crypto.h"
#include "openssl/sha.h"

namespace paramserver {

absl::StatusOr<std::string> ReadSecretFile(const std::string& path, absl::string_view what) {
  struct stat info;
  if (stat(path.c_str(), &info) != 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot read the ", what, " file"));
  }
  // Checked before the secret is read: one that others can read may be anyone's.
  constexpr mode_t kTooOpen = S_IRWXO | S_IWGRP;
  if ((info.st_mode & kTooOpen) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "%s: the %s file has mode %04o: others may read or change it; make it owner-only "
        "(chmod 600 %s)",
        path, what, info.st_mode & 07777, path));
  }
  absl::StatusOr<std::string> contents = LocalFileSystem().ReadFile(path);
  if (!contents.ok()) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot read the ", what, " file"));
  }
  const std::string secret(absl::StripAsciiWhitespace(*contents));
  if (secret.size() < 16) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": the ", what, " must be at least 16 characters, found ", secret.size()));
  }
  return secret;
}

std::string NewSecretToken() {
  unsigned char bytes[32];
  size_t filled = 0;
  while (filled < sizeof(bytes)) {
    const ssize_t got = getrandom(bytes + filled, sizeof(bytes) - filled, 0);
    if (got < 0 && errno == EINTR) continue;
    // getrandom fails only on kernels older than 3.17 or with a bad buffer: a broken
    // invariant of the machine, not bad input.
    if (got < 0) std::abort();
    filled += static_cast<size_t>(got);
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

std::string Sha256(absl::string_view data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  return std::string(reinterpret_cast<const char*>(digest), sizeof(digest));
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  if (a.empty()) return true;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace paramserver
