#include "scheduler/registration_admission.h"

#include <string>

#include "absl/strings/match.h"
#include "catch2/catch.hpp"

namespace paramserver {
namespace {

TEST_CASE("advertised addresses: host:port that can be dialled, nothing else") {
  for (const char* good : {"127.0.0.1:7000", "10.1.2.3:65535", "[::1]:7001", "localhost:7002"}) {
    INFO(good);
    CHECK(CheckAdvertisedAddress(good).ok());
  }
  for (const char* bad :
       {"evil:0", "127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1", "127.0.0.1:x", ":7000",
        "[::1:7000", "bad host:7000", "-x:7000", "no-such-host.invalid:7000"}) {
    INFO(bad);
    CHECK(CheckAdvertisedAddress(bad).code() == absl::StatusCode::kInvalidArgument);
  }
  const std::string nul("\0:7000", 6);
  CHECK(CheckAdvertisedAddress(nul).message() ==
        "register: the advertised address of 6 bytes with unprintable characters has a host that "
        "is neither an IP "
        "literal nor a DNS name");
  const std::string huge(1 << 20, 'a');
  const absl::Status too_long = CheckAdvertisedAddress(huge + ":7000");
  CHECK(too_long.code() == absl::StatusCode::kInvalidArgument);
  CHECK(too_long.message().size() < 200);  // the megabyte is not echoed back
}

TEST_CASE("registrations: a burst, then a few a second") {
  RegistrationRateLimiter limiter(/*per_second=*/2, /*burst=*/3);
  const absl::Time start = absl::FromUnixSeconds(1000);
  for (int i = 0; i < 3; ++i) CHECK(limiter.Admit(start).ok());
  const absl::Status refused = limiter.Admit(start);
  CHECK(refused.code() == absl::StatusCode::kUnavailable);
  CHECK(absl::StartsWith(refused.message(), "too many registrations"));
  CHECK(limiter.Admit(start + absl::Milliseconds(400)).code() == absl::StatusCode::kUnavailable);
  CHECK(limiter.Admit(start + absl::Milliseconds(600)).ok());  // 1.2 tokens refilled
  CHECK(limiter.Admit(start + absl::Milliseconds(700)).code() == absl::StatusCode::kUnavailable);
  CHECK(limiter.Admit(start + absl::Seconds(100)).ok());  // refilled to the burst, no more
  CHECK(limiter.Admit(start + absl::Seconds(100)).ok());
  CHECK(limiter.Admit(start + absl::Seconds(100)).ok());
  CHECK_FALSE(limiter.Admit(start + absl::Seconds(100)).ok());
}

}  // namespace
}  // namespace paramserver
