#include "common/admin_token.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"

namespace paramserver {

absl::StatusOr<std::string> ReadAdminToken(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot read the admin token file"));
  std::stringstream contents;
  contents << in.rdbuf();
  const std::string token(absl::StripAsciiWhitespace(contents.str()));
  if (token.size() < 16) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": the admin token must be at least 16 characters, found ",
                                                   token.size()));
  }
  return token;
}

std::string BearerValue(absl::string_view token) { return absl::StrCat("Bearer ", token); }

bool BearerMatches(absl::string_view presented, absl::string_view expected) {
  const std::string wanted = BearerValue(expected);
  // Compare every byte of `wanted`, whatever `presented` holds.
  unsigned char difference = presented.size() == wanted.size() ? 0 : 1;
  for (size_t i = 0; i < wanted.size(); ++i) {
    const unsigned char got = i < presented.size() ? static_cast<unsigned char>(presented[i]) : 0;
    difference |= got ^ static_cast<unsigned char>(wanted[i]);
  }
  return difference == 0;
}

}  // namespace paramserver
