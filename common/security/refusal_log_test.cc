#include "common/security/refusal_log.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"

namespace paramserver {
namespace {

TEST_CASE("a flood of refusals logs one line per kind, caller and interval, and counts every one") {
  MetricsRegistry metrics;
  RefusalLog log(&metrics, "test_refused_requests_total", absl::Hours(1));
  int logged = 0;
  for (int i = 0; i < 1000; ++i)
    logged += log.Refused("malformed", "127.0.0.1", absl::InvalidArgumentError("x"));
  CHECK(logged == 1);
  CHECK(log.Refused("unauthenticated", "127.0.0.1", absl::UnauthenticatedError("y")));
  CHECK(log.count("malformed") == 1000);
  CHECK(log.count("unauthenticated") == 1);
  CHECK(log.count("permission") == 0);
  const std::string rendered = metrics.Render();
  CHECK(absl::StrContains(rendered, "test_refused_requests_total{kind=\"malformed\"} 1000"));
  CHECK(absl::StrContains(rendered, "test_refused_requests_total{kind=\"unauthenticated\"} 1"));
}

TEST_CASE("one caller's flood does not hide another caller's refusal") {
  RefusalLog log(nullptr, "unused", absl::Hours(1));
  CHECK(log.Refused("permission", "worker-1", absl::PermissionDeniedError("x")));
  for (int i = 0; i < 100; ++i)
    CHECK_FALSE(log.Refused("permission", "worker-1", absl::PermissionDeniedError("x")));
  CHECK(log.Refused("permission", "worker-2", absl::PermissionDeniedError("x")));
  CHECK(log.Refused("permission", "10.0.0.9", absl::PermissionDeniedError("x")));
  CHECK(log.count("permission") == 103);
}

TEST_CASE("a flood from many callers is tracked in bounded memory, then shares a line per kind") {
  RefusalLog log(nullptr, "unused", absl::Hours(1));
  int logged = 0;
  for (int i = 0; i < 100000; ++i) {
    logged += log.Refused("unauthenticated", absl::StrCat("10.0.", i / 256, ".", i % 256),
                          absl::UnauthenticatedError("x"));
  }
  // Each tracked caller's first refusal, then one line for all the others.
  CHECK(logged == RefusalLog::kMaxTrackedCallers + 1);
  CHECK(log.tracked() <= RefusalLog::kMaxTrackedCallers + 1);
  CHECK(log.count("unauthenticated") == 100000);
}

TEST_CASE("callers idle for an interval make room for new ones") {
  RefusalLog log(nullptr, "unused", absl::ZeroDuration());
  for (int i = 0; i < 10000; ++i)
    CHECK(log.Refused("invalid", absl::StrCat("caller-", i), absl::InvalidArgumentError("x")));
  CHECK(log.tracked() <= RefusalLog::kMaxTrackedCallers + 1);
}

TEST_CASE("after the interval the next refusal is logged again") {
  RefusalLog log(nullptr, "unused", absl::ZeroDuration());
  CHECK(log.Refused("malformed", "p", absl::InvalidArgumentError("x")));
  CHECK(log.Refused("malformed", "p", absl::InvalidArgumentError("x")));
}

TEST_CASE("a caller is its address without the port, short and printable") {
  CHECK(RefusalCaller("ipv4:127.0.0.1:51234") == "127.0.0.1");
  CHECK(RefusalCaller("ipv6:[::1]:7000") == "[::1]");
  CHECK(RefusalCaller("unix:/tmp/socket") == "unix:/tmp/socket");
  CHECK(RefusalCaller(std::string(100, 'a')) == "an unprintable address");
  CHECK(RefusalCaller(std::string("ipv4:\n:1")) == "an unprintable address");
}

}  // namespace
}  // namespace paramserver
