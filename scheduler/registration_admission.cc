#include "scheduler/registration_admission.h"

#include <arpa/inet.h>
#include <netdb.h>

#include <algorithm>

#include "absl/strings/ascii.h"
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

absl::Status RegistrationRateLimiter::Admit(absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (last_ != absl::InfinitePast()) {
    tokens_ = std::min(burst_, tokens_ + absl::ToDoubleSeconds(now - last_) * per_second_);
  }
  last_ = now;
  if (tokens_ >= 1) {
    tokens_ -= 1;
    return absl::OkStatus();
  }
  return absl::UnavailableError(
      absl::StrCat("too many registrations: at most ", per_second_, " a second; retry in ",
                   absl::FormatDuration(absl::Seconds((1 - tokens_) / per_second_))));
}

}  // namespace paramserver
