// Warnings that peers cause (a refused request), rate-limited so that a flood of bad
// requests cannot flood the log: at most one line per kind of refusal and caller in
// each interval, saying how many like it were not logged since. Every refusal is
// counted in the metric `<metric_name>{kind="..."}` whether logged or not.
#ifndef PARAMSERVER_COMMON_SECURITY_REFUSAL_LOG_H_
#define PARAMSERVER_COMMON_SECURITY_REFUSAL_LOG_H_

#include <map>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/ops/metrics.h"
#include "grpcpp/server_context.h"

namespace paramserver {

// The kind a refusal with `code` is logged and counted as: "unauthenticated",
// "permission", "invalid", "exhausted", "unavailable" or "precondition".
absl::string_view RefusalKind(absl::StatusCode code);

// Who a refusal is logged for: the caller's IP address without its port (a caller
// opening new connections stays one caller), after the node name the call presents
// ("worker-1@10.0.0.7": metadata x-ps-node, unverified, so the address keeps an
// outsider claiming a member's name apart from it). Each part at most 64 printable bytes.
std::string RefusalCaller(const grpc::ServerContextBase& context);
// The same for a gRPC peer string alone ("ipv4:10.0.0.7:51234" -> "10.0.0.7").
std::string RefusalCaller(absl::string_view peer);

// Thread-safe.
class RefusalLog {
 public:
  // (kind, caller) pairs tracked for rate limiting; past that (a flood from many
  // callers) refusals of a kind share one line per interval.
  static constexpr size_t kMaxTrackedCallers = 256;

  // How its lines are logged: refusals as warnings ("refused a request from ..."),
  // events that are no attack (a call its caller cancelled) at info level.
  enum class Severity { kWarning, kInfo };

  // `metrics` may be null (nothing counted). `metric_name`: e.g. "ps_refused_requests_total".
  RefusalLog(MetricsRegistry* metrics, std::string metric_name,
             absl::Duration interval = absl::Seconds(10), Severity severity = Severity::kWarning)
      : metrics_(metrics),
        metric_name_(std::move(metric_name)),
        interval_(interval),
        severity_(severity) {}

  // Counts a refusal of kind `kind` (a short fixed word: "unauthenticated",
  // "malformed", ...) of a request from `caller` (see RefusalCaller), and logs it as a
  // warning unless one of that kind from that caller was logged less than the interval
  // ago. Returns whether it was logged.
  bool Refused(absl::string_view kind, absl::string_view caller, const absl::Status& why)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Refusals of `kind` so far (logged or not), from every caller.
  int64_t count(absl::string_view kind) const ABSL_LOCKS_EXCLUDED(mu_);
  // (kind, caller) pairs tracked now (at most kMaxTrackedCallers, plus one per kind).
  size_t tracked() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Kind {
    int64_t total = 0;
    Counter* counter = nullptr;
  };
  struct Line {
    int64_t unlogged = 0;  // since the last line
    absl::Time last_logged = absl::InfinitePast();
  };
  // The kind's counts, made (with its counter) on first use.
  Kind& KindOf(absl::string_view kind) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The line state of (kind, caller): the caller's own while fewer than
  // kMaxTrackedCallers are tracked (after dropping those idle for an interval), else
  // the kind's shared one (caller ""). Sets *shared accordingly.
  Line& LineOf(absl::string_view kind, absl::string_view caller, absl::Time now, bool* shared)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  MetricsRegistry* const metrics_;
  const std::string metric_name_;
  const absl::Duration interval_;
  const Severity severity_;
  mutable absl::Mutex mu_;
  std::map<std::string, Kind, std::less<>> kinds_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, std::string>, Line> callers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Line, std::less<>> shared_lines_ ABSL_GUARDED_BY(mu_);
};

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_SECURITY_REFUSAL_LOG_H_
