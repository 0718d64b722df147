#include "common/security_policy.h"

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
  security.cluster_token_file = dir.WriteFile("token", "0123456789abcdef0123\n");
  CHECK(ReadClusterToken(security).value() == "0123456789abcdef0123");
  security.cluster_token_file = dir.WriteFile("short", "abc");
  CHECK(ReadClusterToken(security).status().message() ==
        security.cluster_token_file +
            ": the cluster token must be at least 16 characters, found 3");
}

}  // namespace
}  // namespace paramserver
