#include "common/security/admin_token.h"

#include <fstream>

#include "catch2/catch.hpp"
#include "common/testing/temp_dir.h"

namespace paramserver {
namespace {

TEST_CASE(
    "the admin token is read trimmed, and short or missing ones are refused with the file named") {
  TempDir dir;
  const std::string good = dir.WriteSecretFile("token", "  0123456789abcdef-secret\n");
  absl::StatusOr<std::string> token = ReadAdminToken(good);
  REQUIRE(token.ok());
  CHECK(*token == "0123456789abcdef-secret");
  const std::string short_token = dir.WriteSecretFile("short", "abc\n");
  CHECK(ReadAdminToken(short_token).status().message() ==
        short_token + ": the admin token must be at least 16 characters, found 3");
  CHECK(ReadAdminToken(dir.File("absent")).status().code() == absl::StatusCode::kNotFound);
}

TEST_CASE("only the exact bearer value matches") {
  const std::string token = "0123456789abcdef";
  CHECK(BearerMatches("Bearer 0123456789abcdef", token));
  CHECK_FALSE(BearerMatches("Bearer 0123456789abcdeg", token));
  CHECK_FALSE(BearerMatches("Bearer 0123456789abcdef0", token));
  CHECK_FALSE(BearerMatches("Bearer 0123456789abcde", token));
  CHECK_FALSE(BearerMatches("0123456789abcdef", token));
  CHECK_FALSE(BearerMatches("", token));
  CHECK(BearerValue(token) == "Bearer 0123456789abcdef");
}

}  // namespace
}  // namespace paramserver
