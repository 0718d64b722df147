#include "common/security/refusal_log.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/security/peer_credentials.h"
#include "spdlog/spdlog.h"

namespace paramserver {
namespace {

constexpr size_t kMaxCallerBytes = 64;

// `name` if it is short and printable, else what it is.
std::string Printable(absl::string_view name, absl::string_view otherwise) {
  if (name.empty() || name.size() > kMaxCallerBytes ||
      !std::all_of(name.begin(), name.end(), [](char c) { return absl::ascii_isgraph(c); })) {
    return std::string(otherwise);
  }
  return std::string(name);
}

}  // namespace

absl::string_view RefusalKind(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kUnauthenticated:
      return "unauthenticated";
    case absl::StatusCode::kPermissionDenied:
      return "permission";
    case absl::StatusCode::kInvalidArgument:
      return "invalid";
    case absl::StatusCode::kResourceExhausted:
      return "exhausted";
    case absl::StatusCode::kUnavailable:
      return "unavailable";
    default:
      return "precondition";
  }
}

std::string RefusalCaller(absl::string_view peer) {
  // "ipv4:1.2.3.4:5", "ipv6:[::1]:5", "unix:/path": drop the scheme and the port.
  if (const size_t scheme = peer.find(':');
      scheme != absl::string_view::npos &&
      (absl::StartsWith(peer, "ipv4:") || absl::StartsWith(peer, "ipv6:"))) {
    peer.remove_prefix(scheme + 1);
    if (const size_t port = peer.rfind(':'); port != absl::string_view::npos)
      peer = peer.substr(0, port);
  }
  return Printable(peer, "an unprintable address");
}

std::string RefusalCaller(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  // The name a call presents is not proven (it may be why it is refused): with the
  // address beside it, an outsider claiming a member's name is a caller of its own.
  if (auto name = metadata.find(kNodeNameMetadata); name != metadata.end()) {
    return absl::StrCat(Printable(absl::string_view(name->second.data(), name->second.size()),
                                  "a node with an unprintable name"),
                        "@", RefusalCaller(context.peer()));
  }
  return RefusalCaller(context.peer());
}

RefusalLog::Kind& RefusalLog::KindOf(absl::string_view kind) {
  auto it = kinds_.find(kind);
  if (it == kinds_.end()) {
    it = kinds_.emplace(std::string(kind), Kind{}).first;
    if (metrics_ != nullptr) {
      it->second.counter = metrics_->AddCounter(
          metric_name_,
          severity_ == Severity::kInfo
              ? "Calls that ended without a request to serve, by kind."
              : "Requests refused, by kind (unauthenticated, permission, malformed, ...).",
          {{"kind", std::string(kind)}});
    }
  }
  return it->second;
}

RefusalLog::Line& RefusalLog::LineOf(absl::string_view kind, absl::string_view caller,
                                     absl::Time now, bool* shared) {
  auto key = std::make_pair(std::string(kind), std::string(caller));
  auto it = callers_.find(key);
  if (it == callers_.end() && callers_.size() >= kMaxTrackedCallers) {
    // A caller idle for an interval would be logged anew anyway: forget it.
    for (auto idle = callers_.begin(); idle != callers_.end();) {
      idle = now - idle->second.last_logged >= interval_ ? callers_.erase(idle) : std::next(idle);
    }
  }
  if (it == callers_.end() && callers_.size() < kMaxTrackedCallers) {
    it = callers_.emplace(std::move(key), Line{}).first;
  }
  *shared = it == callers_.end();
  if (!*shared) return it->second;
  auto line = shared_lines_.find(kind);
  if (line == shared_lines_.end()) line = shared_lines_.emplace(std::string(kind), Line{}).first;
  return line->second;
}

bool RefusalLog::Refused(absl::string_view kind, absl::string_view caller,
                         const absl::Status& why) {
  int64_t unlogged = 0;
  bool shared = false;
  {
    absl::MutexLock lock(&mu_);
    Kind& counts = KindOf(kind);
    ++counts.total;
    if (counts.counter != nullptr) counts.counter->Increment();
    const absl::Time now = absl::Now();
    Line& line = LineOf(kind, caller, now, &shared);
    if (now - line.last_logged < interval_) {
      ++line.unlogged;
      return false;
    }
    line.last_logged = now;
    unlogged = line.unlogged;
    line.unlogged = 0;
  }
  const std::string from = std::string(caller) + (shared ? " (and many other callers)" : "");
  const std::string more =
      unlogged > 0 ? absl::StrCat(" (", unlogged, " more like it not logged)") : std::string();
  if (severity_ == Severity::kInfo) {
    spdlog::info("a call from {} ({}): {}{}", from, std::string(kind), why.ToString(), more);
  } else {
    spdlog::warn("refused a request from {} ({}): {}{}", from, std::string(kind), why.ToString(),
                 more);
  }
  return true;
}

int64_t RefusalLog::count(absl::string_view kind) const {
  absl::MutexLock lock(&mu_);
  auto it = kinds_.find(kind);
  return it == kinds_.end() ? 0 : it->second.total;
}

size_t RefusalLog::tracked() const {
  absl::MutexLock lock(&mu_);
  return callers_.size() + shared_lines_.size();
}

}  // namespace paramserver
