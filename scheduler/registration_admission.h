// What the scheduler checks before a registration reaches the registry: the address a
// node advertises, and how fast registrations arrive.
#ifndef PARAMSERVER_SCHEDULER_REGISTRATION_ADMISSION_H_
#define PARAMSERVER_SCHEDULER_REGISTRATION_ADMISSION_H_

#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace paramserver {

// Longest advertised address accepted (a DNS name is at most 253 bytes).
inline constexpr size_t kMaxAdvertisedAddressBytes = 262;

// OK if `address` is host:port that other nodes can dial: port 1-65535; host an IPv4
// literal, a bracketed IPv6 literal, or a DNS name (letters, digits, '-' and '.', at most
// 253 bytes) that resolves. INVALID_ARGUMENT saying what is wrong otherwise (the
// address is quoted only when short and printable). May block for a name lookup.
absl::Status CheckAdvertisedAddress(const std::string& address);

// A token bucket: at most `burst` registrations at once, refilled at `per_second`.
// Thread-safe.
class RegistrationRateLimiter {
 public:
  RegistrationRateLimiter(double per_second, double burst)
      : per_second_(per_second), burst_(burst), tokens_(burst) {}

  // Takes one registration's token at `now`: OK, or UNAVAILABLE saying when to retry
  // (registering nodes retry UNAVAILABLE with backoff).
  absl::Status Admit(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const double per_second_;
  const double burst_;
  absl::Mutex mu_;
  double tokens_ ABSL_GUARDED_BY(mu_);
  absl::Time last_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace paramserver

#endif  // PARAMSERVER_SCHEDULER_REGISTRATION_ADMISSION_H_
