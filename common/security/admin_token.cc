#include "common/security/admin_token.h"

#include "absl/strings/str_cat.h"
#include "common/security/secrets.h"

namespace paramserver {

absl::StatusOr<std::string> ReadAdminToken(const std::string& path) {
  return ReadSecretFile(path, "admin token");
}

std::string BearerValue(absl::string_view token) { return absl::StrCat("Bearer ", token); }

bool BearerMatches(absl::string_view presented, absl::string_view expected) {
  return ConstantTimeEquals(presented, BearerValue(expected));
}

}  // namespace paramserver
