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

TEST_CASE("one caller's flood of 5,000 registrations does not keep a replacement out") {
  RegistrationAdmission admission({});
  const absl::Time start = absl::FromUnixSeconds(1000);
  const std::string flooder = RegistrationCaller("ipv4:127.0.0.1:40000", "127.0.0.1:7777");
  const std::string replacement = RegistrationCaller("ipv4:127.0.0.1:40001", "127.0.0.1:7001");
  int flood_admitted = 0;
  int attempts = 0;
  bool registered = false;
  // 5,000 calls over 5 s; the replacement tries at 2 s and, if refused, 1 s later.
  for (int i = 0; i < 5000; ++i) {
    const absl::Time now = start + absl::Milliseconds(i);
    flood_admitted += admission.Admit(flooder, now).ok();  // each fails at the registry
    if (!registered && (i == 2000 || i == 3000)) {
      ++attempts;
      registered = admission.Admit(replacement, now).ok();
      if (registered) admission.NoteRegistered(now);
    }
  }
  CHECK(registered);
  CHECK(attempts == 1);
  CHECK(flood_admitted <= 4 + 5);  // its burst, then one a second
  const absl::Status refused = admission.Admit(flooder, start + absl::Milliseconds(4999));
  CHECK(refused.code() == absl::StatusCode::kUnavailable);
  CHECK(absl::StartsWith(refused.message(), "this caller: too many registrations"));
}

TEST_CASE("registrations that succeed are capped for all callers together") {
  RegistrationAdmission::Limits limits;
  limits.registrations_burst = 3;
  limits.registrations_per_second = 1;
  RegistrationAdmission admission(limits);
  const absl::Time start = absl::FromUnixSeconds(1000);
  // Rotating addresses: each is a new caller, but only successes spend the shared cap.
  for (int i = 0; i < 3; ++i) {
    const std::string caller =
        RegistrationCaller("ipv4:10.0.0.1:5", "10.0.0.1:" + std::to_string(7000 + i));
    REQUIRE(admission.Admit(caller, start).ok());
    admission.NoteRegistered(start);
  }
  CHECK(admission.Admit(RegistrationCaller("ipv4:10.0.0.2:5", "10.0.0.2:7000"), start).code() ==
        absl::StatusCode::kUnavailable);
  CHECK(admission
            .Admit(RegistrationCaller("ipv4:10.0.0.2:5", "10.0.0.2:7000"), start + absl::Seconds(1))
            .ok());
}

TEST_CASE("failed registrations from many callers leave the shared cap alone, in bounded memory") {
  RegistrationAdmission admission({});
  const absl::Time start = absl::FromUnixSeconds(1000);
  for (int i = 0; i < 20000; ++i) {
    // Admitted or refused, either is fine here: what is measured is the memory kept.
    admission
        .Admit(RegistrationCaller("ipv4:10.0.0.1:5", "10.0.0.1:" + std::to_string(i)),
               start + absl::Microseconds(i))
        .IgnoreError();
  }
  CHECK(admission.tracked_callers() <= RegistrationAdmission::kMaxTrackedCallers);
  CHECK(admission
            .Admit(RegistrationCaller("ipv4:10.0.0.9:5", "10.0.0.9:7000"), start + absl::Seconds(1))
            .ok());
}

TEST_CASE("a registration caller is the peer's IP and the advertised address") {
  CHECK(RegistrationCaller("ipv4:127.0.0.1:51234", "127.0.0.1:7000") ==
        "ipv4:127.0.0.1 advertising 127.0.0.1:7000");
  CHECK(RegistrationCaller("ipv6:[::1]:5", "[::1]:7000") == "ipv6:[::1] advertising [::1]:7000");
  CHECK(RegistrationCaller("ipv4:127.0.0.1:1", std::string(1 << 20, 'a')) ==
        "ipv4:127.0.0.1 advertising an over-long address");
}

}  // namespace
}  // namespace paramserver
