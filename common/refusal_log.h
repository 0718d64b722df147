// Warnings that peers cause (a refused request), rate-limited so that a flood of bad
// requests cannot flood the log: at most one line per kind of refusal in each
// interval, saying how many like it were not logged since. Every refusal is counted in
// the metric `<metric_name>{kind="..."}` whether logged or not.
#ifndef PARAMSERVER_COMMON_REFUSAL_LOG_H_
#define PARAMSERVER_COMMON_REFUSAL_LOG_H_

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics.h"

namespace paramserver {

// The kind a refusal with `code` is logged and counted as: "unauthenticated",
// "permission", "invalid", "exhausted", "unavailable" or "precondition".
absl::string_view RefusalKind(absl::StatusCode code);

// Thread-safe.
class RefusalLog {
 public:
  // `metrics` may be null (nothing counted). `metric_name`: e.g. "ps_refused_requests_total".
  RefusalLog(MetricsRegistry* metrics, std::string metric_name,
             absl::Duration interval = absl::Seconds(10))
      : metrics_(metrics), metric_name_(std::move(metric_name)), interval_(interval) {}

  // Counts a refusal of kind `kind` (a short fixed word: "unauthenticated",
  // "malformed", ...) of a request from `peer`, and logs it as a warning unless a
  // refusal of that kind was logged less than the interval ago. Returns whether it was
  // logged.
  bool Refused(absl::string_view kind, absl::string_view peer, const absl::Status& why)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Refusals of `kind` so far (logged or not).
  int64_t count(absl::string_view kind) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Kind {
    int64_t total = 0;
    int64_t unlogged = 0;  // since the last line
    absl::Time last_logged = absl::InfinitePast();
    Counter* counter = nullptr;
  };
  MetricsRegistry* const metrics_;
  const std::string metric_name_;
  const absl::Duration interval_;
  mutable absl::Mutex mu_;
  std::map<std::string, Kind, std::less<>> kinds_ ABSL_GUARDED_BY(mu_);
};

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_REFUSAL_LOG_H_
