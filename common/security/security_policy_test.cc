#include "common/security/security_policy.h"

#include <sys/stat.h>

#include <cstdio>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "common/testing/temp_dir.h"

namespace paramserver {
namespace {

TEST_CASE("a daemon refuses a non-loopback address with neither TLS nor a cluster token") {
  SecuritySection open;
  CHECK(CheckListenAddressIsSafe("127.0.0.1:0", open).ok());
  CHECK(CheckListenAddressIsSafe("localhost:7000", open).ok());
  CHECK(CheckListenAddressIsSafe("[::1]:7000", open).ok());
  const absl::Status refused = CheckListenAddressIsSafe("0.0.0.0:7000", open);
  CHECK(refused.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(
      absl::StartsWith(refused.message(),
                       "refusing to listen on 0.0.0.0:7000 with neither TLS nor a cluster token"));
  CHECK(CheckListenAddressIsSafe("10.0.0.5:7000", open).code() ==
        absl::StatusCode::kFailedPrecondition);
  SecuritySection with_token;
  with_token.cluster_token_file = "/etc/ps/cluster.token";
  CHECK(CheckListenAddressIsSafe("0.0.0.0:7000", with_token).ok());
  SecuritySection with_tls;
  with_tls.tls_ca = "ca.pem";
  CHECK(CheckListenAddressIsSafe("0.0.0.0:7000", with_tls).ok());
  SecuritySection insecure;
  insecure.allow_insecure = true;
  CHECK(CheckListenAddressIsSafe("0.0.0.0:7000", insecure).ok());
}

TEST_CASE("the cluster token is read from its file, and a short one is refused") {
  TempDir dir;
  SecuritySection security;
  CHECK(ReadClusterToken(security).value().empty());
  security.cluster_token_file = dir.WriteSecretFile("token", "0123456789abcdef0123\n");
  CHECK(ReadClusterToken(security).value() == "0123456789abcdef0123");
  security.cluster_token_file = dir.WriteSecretFile("short", "abc");
  CHECK(ReadClusterToken(security).status().message() ==
        security.cluster_token_file +
            ": the cluster token must be at least 16 characters, found 3");
}

TEST_CASE("a token file others may read or change is refused, naming it and its mode") {
  TempDir dir;
  SecuritySection security;
  security.cluster_token_file = dir.WriteSecretFile("token", "0123456789abcdef0123\n");
  for (const mode_t mode : {0644, 0604, 0620, 0666}) {
    REQUIRE(chmod(security.cluster_token_file.c_str(), mode) == 0);
    const absl::StatusOr<std::string> token = ReadClusterToken(security);
    CHECK(token.status().code() == absl::StatusCode::kPermissionDenied);
    const std::string message(token.status().message());
    CHECK(message.find(security.cluster_token_file) != std::string::npos);
    char octal[8];
    snprintf(octal, sizeof(octal), "%04o", mode);
    INFO(message);
    CHECK(message.find(std::string("mode ") + octal) != std::string::npos);
  }
  // Owner-only, and group-readable for a service's group (EC2: root:ps 0640), are fine.
  for (const mode_t mode : {0600, 0400, 0640}) {
    REQUIRE(chmod(security.cluster_token_file.c_str(), mode) == 0);
    CHECK(ReadClusterToken(security).value() == "0123456789abcdef0123");
  }
}

}  // namespace
}  // namespace paramserver
