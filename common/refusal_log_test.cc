#include "common/refusal_log.h"

#include "absl/strings/match.h"
#include "catch2/catch.hpp"

namespace paramserver {
namespace {

TEST_CASE("a flood of refusals logs one line per kind and interval, and counts every one") {
  MetricsRegistry metrics;
  RefusalLog log(&metrics, "test_refused_requests_total", absl::Hours(1));
  int logged = 0;
  for (int i = 0; i < 1000; ++i)
    logged += log.Refused("malformed", "ipv4:127.0.0.1:1", absl::InvalidArgumentError("x"));
  CHECK(logged == 1);
  CHECK(log.Refused("unauthenticated", "ipv4:127.0.0.1:1", absl::UnauthenticatedError("y")));
  CHECK(log.count("malformed") == 1000);
  CHECK(log.count("unauthenticated") == 1);
  CHECK(log.count("permission") == 0);
  const std::string rendered = metrics.Render();
  CHECK(absl::StrContains(rendered, "test_refused_requests_total{kind=\"malformed\"} 1000"));
  CHECK(absl::StrContains(rendered, "test_refused_requests_total{kind=\"unauthenticated\"} 1"));
}

TEST_CASE("after the interval the next refusal is logged again") {
  RefusalLog log(nullptr, "unused", absl::ZeroDuration());
  CHECK(log.Refused("malformed", "p", absl::InvalidArgumentError("x")));
  CHECK(log.Refused("malformed", "p", absl::InvalidArgumentError("x")));
}

}  // namespace
}  // namespace paramserver
