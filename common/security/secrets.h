// Secrets as files, and the few operations on them every credential needs: reading one,
// making one, hashing one and comparing two without leaking where they differ.
#ifndef PARAMSERVER_COMMON_SECURITY_SECRETS_H_
#define PARAMSERVER_COMMON_SECURITY_SECRETS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace paramserver {

// The secret in `path`, without surrounding whitespace. NOT_FOUND naming the file if it
// cannot be read; PERMISSION_DENIED naming the file and its mode if others than its
// owner and group may read it, or others than its owner may change it (a secret must
// be 0600, or 0640 for a service's group as on EC2); INVALID_ARGUMENT naming the file
// if it holds fewer than 16 characters ("<path>: the <what> must be at least 16
// characters, found N").
absl::StatusOr<std::string> ReadSecretFile(const std::string& path, absl::string_view what);

// 64 hex digits (256 bits) from the operating system's random source (getrandom).
std::string NewSecretToken();

// The SHA-256 of `data`, 32 raw bytes.
std::string Sha256(absl::string_view data);

// Whether a == b, taking the same time whatever the first differing byte (the time
// depends only on the lengths), so that timing does not reveal a secret.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_SECURITY_SECRETS_H_
