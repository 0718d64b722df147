#include "common/refusal_log.h"

#include "spdlog/spdlog.h"

namespace paramserver {

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

bool RefusalLog::Refused(absl::string_view kind, absl::string_view peer, const absl::Status& why) {
  int64_t unlogged = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = kinds_.find(kind);
    if (it == kinds_.end()) {
      it = kinds_.emplace(std::string(kind), Kind{}).first;
      if (metrics_ != nullptr) {
        it->second.counter = metrics_->AddCounter(
            metric_name_,
            "Requests refused, by kind (unauthenticated, permission, malformed, ...).",
            {{"kind", std::string(kind)}});
      }
    }
    Kind& counts = it->second;
    ++counts.total;
    if (counts.counter != nullptr) counts.counter->Increment();
    const absl::Time now = absl::Now();
    if (now - counts.last_logged < interval_) {
      ++counts.unlogged;
      return false;
    }
    counts.last_logged = now;
    unlogged = counts.unlogged;
    counts.unlogged = 0;
  }
  if (unlogged > 0) {
    spdlog::warn("refused a request from {} ({}): {} ({} more refusals of this kind not logged)",
                 std::string(peer), std::string(kind), why.ToString(), unlogged);
  } else {
    spdlog::warn("refused a request from {} ({}): {}", std::string(peer), std::string(kind),
                 why.ToString());
  }
  return true;
}

int64_t RefusalLog::count(absl::string_view kind) const {
  absl::MutexLock lock(&mu_);
  auto it = kinds_.find(kind);
  return it == kinds_.end() ? 0 : it->second.total;
}

}  // namespace paramserver
