#include "scheduler/registration_admission.h"

#include <arpa/inet.h>
#include <netdb.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace paramserver {
namespace {

// The address as an error message may show it.
std::string Shown(const std::string& address) {
  const bool printable =
      std::all_of(address.begin(), address.end(), [](char c) { return absl::ascii_isgraph(c); });
  if (address.size() <= 80 && printable) return absl::StrCat("'", address, "'");
  return absl::StrCat("of ", address.size(), " bytes",
                      printable ? "" : " with unprintable characters");
}

bool IsDnsName(const std::string& host) {
  if (host.empty() || host.size() > 253 || host.front() == '.' || host.front() == '-') return false;
  return std::all_of(host.begin(), host.end(),
                     [](char c) { return absl::ascii_isalnum(c) || c == '-' || c == '.'; });
}

}  // namespace

absl::Status CheckAdvertisedAddress(const std::string& address) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("register: the advertised address ", Shown(address), " ", why));
  };
  if (address.size() > kMaxAdvertisedAddressBytes) return bad("is too long");
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return bad("is not host:port");
  std::string host = address.substr(0, colon);
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 1 || port > 65535) {
    return bad("has no port in 1-65535");
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    in6_addr ipv6;
    if (inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), &ipv6) != 1)
      return bad("has a bad IPv6 literal");
    return absl::OkStatus();
  }
  in_addr ipv4;
  if (inet_pton(AF_INET, host.c_str(), &ipv4) == 1) return absl::OkStatus();
  if (!IsDnsName(host)) return bad("has a host that is neither an IP literal nor a DNS name");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int looked_up = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (found != nullptr) freeaddrinfo(found);
  if (looked_up != 0) return bad(absl::StrCat("does not resolve (", gai_strerror(looked_up), ")"));
  return absl::OkStatus();
}

void RegistrationRateLimiter::Refill(absl::Time now) {
  if (last_ != absl::InfinitePast() && now > last_) {
    tokens_ = std::min(burst_, tokens_ + absl::ToDoubleSeconds(now - last_) * per_second_);
  }
  if (now > last_) last_ = now;
}

absl::Status RegistrationRateLimiter::Refusal() const {
  return absl::UnavailableError(
      absl::StrCat("too many registrations: at most ", per_second_, " a second; retry in ",
                   absl::FormatDuration(absl::Seconds((1 - tokens_) / per_second_))));
}

absl::Status RegistrationRateLimiter::Admit(absl::Time now) {
  absl::MutexLock lock(&mu_);
  Refill(now);
  if (tokens_ < 1) return Refusal();
  tokens_ -= 1;
  return absl::OkStatus();
}

absl::Status RegistrationRateLimiter::Check(absl::Time now) {
  absl::MutexLock lock(&mu_);
  Refill(now);
  return tokens_ >= 1 ? absl::OkStatus() : Refusal();
}

void RegistrationRateLimiter::Take(absl::Time now) {
  absl::MutexLock lock(&mu_);
  Refill(now);
  tokens_ -= 1;
}

bool RegistrationRateLimiter::Full(absl::Time now) {
  absl::MutexLock lock(&mu_);
  Refill(now);
  return tokens_ >= burst_;
}

void RegistrationAdmission::ForgetSome(absl::Time now) {
  for (auto it = callers_.begin(); it != callers_.end();) {
    it = it->second.bucket->Full(now) ? callers_.erase(it) : std::next(it);
  }
  if (callers_.size() < kMaxTrackedCallers) return;
  // A flood from many callers: forget the least recently used quarter at once, so that
  // the scan is paid once per kMaxTrackedCallers / 4 new callers.
  std::vector<std::pair<absl::Time, std::string>> by_use;
  by_use.reserve(callers_.size());
  for (const auto& [caller, tracked] : callers_) by_use.emplace_back(tracked.last_used, caller);
  const size_t forget = callers_.size() / 4;
  std::nth_element(by_use.begin(), by_use.begin() + forget, by_use.end());
  for (size_t i = 0; i < forget; ++i) callers_.erase(by_use[i].second);
}

absl::Status RegistrationAdmission::Admit(const std::string& caller, absl::Time now) {
  {
    absl::MutexLock lock(&mu_);
    auto it = callers_.find(caller);
    if (it == callers_.end()) {
      if (callers_.size() >= kMaxTrackedCallers) ForgetSome(now);
      it =
          callers_
              .emplace(caller, Tracked{std::make_unique<RegistrationRateLimiter>(
                                           limits_.per_caller_per_second, limits_.per_caller_burst),
                                       now})
              .first;
    }
    it->second.last_used = std::max(it->second.last_used, now);
    if (absl::Status own = it->second.bucket->Admit(now); !own.ok()) {
      return absl::UnavailableError(absl::StrCat("this caller: ", own.message()));
    }
  }
  return registrations_->Check(now);
}

size_t RegistrationAdmission::tracked_callers() const {
  absl::MutexLock lock(&mu_);
  return callers_.size();
}

std::string RegistrationCaller(absl::string_view peer, const std::string& advertised_address) {
  // "ipv4:1.2.3.4:5" or "ipv6:[::1]:5": the scheme and the host, without the port.
  if (const size_t port = peer.rfind(':');
      port != absl::string_view::npos &&
      (absl::StartsWith(peer, "ipv4:") || absl::StartsWith(peer, "ipv6:"))) {
    peer = peer.substr(0, port);
  }
  return absl::StrCat(peer, " advertising ",
                      advertised_address.size() <= kMaxAdvertisedAddressBytes
                          ? advertised_address
                          : std::string("an over-long address"));
}

}  // namespace paramserver
