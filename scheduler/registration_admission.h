// What the scheduler checks before a registration reaches the registry: the address a
// node advertises, and how fast registrations arrive from each caller.
#ifndef PARAMSERVER_SCHEDULER_REGISTRATION_ADMISSION_H_
#define PARAMSERVER_SCHEDULER_REGISTRATION_ADMISSION_H_

#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
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
  // OK if a token is there at `now`, without taking it (UNAVAILABLE as Admit).
  absl::Status Check(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes a token at `now` even if none is left (the bucket may go into debt).
  void Take(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the bucket is full at `now` (as good as a new one).
  bool Full(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Refill(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Refusal() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const double per_second_;
  const double burst_;
  absl::Mutex mu_;
  double tokens_ ABSL_GUARDED_BY(mu_);
  absl::Time last_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// How fast registrations are taken, per caller, so that one member's flood cannot keep
// a genuine replacement out.
//
// Who is a caller: the peer's IP address together with the address it advertises
// (RegistrationCaller). The IP alone would put every node of a host (and every test
// on 127.0.0.1, or nodes behind one NAT) in one bucket; the advertised address alone
// is the caller's to choose. Each node advertises its own host:port, so a genuine node
// is one caller and its retries and restarts share its bucket. A flooder that keeps
// its address is held to its own bucket; one that rotates addresses gets a small burst
// for each, but registrations that fail (no free slot: RESOURCE_EXHAUSTED, a bad
// address) change nothing; registrations that succeed (each admits a node or issues a
// credential) are capped for everyone together, and only they use the shared cap, so
// a flood of failing calls cannot spend it.
//
// Memory is bounded: at most kMaxTrackedCallers buckets; past that, full buckets (as
// good as new) are forgotten first, then the least recently used quarter (forgetting
// a bucket only gives that caller a fresh burst). Thread-safe.
class RegistrationAdmission {
 public:
  static constexpr size_t kMaxTrackedCallers = 4096;

  struct Limits {
    double per_caller_per_second = 1;
    double per_caller_burst = 4;
    double registrations_per_second = 5;  // successful ones, all callers together
    double registrations_burst = 32;      // e.g. a whole cluster at once
  };
  explicit RegistrationAdmission(Limits limits) : limits_(limits) {
    registrations_ = std::make_unique<RegistrationRateLimiter>(limits.registrations_per_second,
                                                               limits.registrations_burst);
  }

  // Takes one attempt of `caller` at `now`: OK, or UNAVAILABLE saying when to retry,
  // when this caller tried too often or too many registrations succeeded of late.
  absl::Status Admit(const std::string& caller, absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // A registration admitted at `now` succeeded: it counts against the shared cap.
  void NoteRegistered(absl::Time now) { registrations_->Take(now); }

  size_t tracked_callers() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Tracked {
    std::unique_ptr<RegistrationRateLimiter> bucket;
    absl::Time last_used;
  };
  // Makes room for one more bucket.
  void ForgetSome(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Limits limits_;
  std::unique_ptr<RegistrationRateLimiter> registrations_;
  mutable absl::Mutex mu_;
  std::map<std::string, Tracked> callers_ ABSL_GUARDED_BY(mu_);
};

// The caller a Register call is limited as: the IP of gRPC peer `peer` (its port
// dropped) and the address it advertises (an over-long one as one key).
std::string RegistrationCaller(absl::string_view peer, const std::string& advertised_address);

}  // namespace paramserver

#endif  // PARAMSERVER_SCHEDULER_REGISTRATION_ADMISSION_H_
