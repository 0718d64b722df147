// The admin token: how the scheduler's admin service and psctl read it, send it and
// compare it. It travels as gRPC metadata "authorization: Bearer <token>".
#ifndef PARAMSERVER_COMMON_SECURITY_ADMIN_TOKEN_H_
#define PARAMSERVER_COMMON_SECURITY_ADMIN_TOKEN_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace paramserver {

inline constexpr char kAuthorizationMetadata[] = "authorization";

// The token in `path`, without surrounding whitespace. NOT_FOUND if the file cannot be
// read; INVALID_ARGUMENT naming the file if it holds no token or one shorter than 16
// characters (too easy to guess).
absl::StatusOr<std::string> ReadAdminToken(const std::string& path);

// "Bearer <token>".
std::string BearerValue(absl::string_view token);

// Whether `presented` (a metadata value) is "Bearer <expected>". Takes the same time
// whatever the first differing character, so timing does not reveal the token.
bool BearerMatches(absl::string_view presented, absl::string_view expected);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_SECURITY_ADMIN_TOKEN_H_
