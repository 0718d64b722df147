// The scheduler process, wired up: the registry, its gRPC service, and the watch over
// heartbeats. main.cc only parses flags and calls this.
#ifndef PARAMSERVER_SCHEDULER_SCHEDULER_DAEMON_H_
#define PARAMSERVER_SCHEDULER_SCHEDULER_DAEMON_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/cluster_spec.h"
#include "common/rpc_endpoints.h"
#include "scheduler/cluster_registry.h"
#include "scheduler/scheduler_service.h"

namespace paramserver {

struct SchedulerDaemonOptions {
  ClusterSpec spec;
  std::string listen_address;  // default: spec.cluster.scheduler_address
  std::string port_file;       // if set, the bound port is written there once serving
};

// Thread-safe.
class SchedulerDaemon {
 public:
  // Starts serving. UNAVAILABLE if the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<SchedulerDaemon>> Create(SchedulerDaemonOptions options);
  ~SchedulerDaemon();

  // Watches heartbeats (logging every node silent past cluster.failure_timeout_ms)
  // until the job has finished and every server has been told to stop (or a failure
  // timeout has passed since), or until Shutdown(). Logs the final line
  // "final test_accuracy=... samples_per_sec=... steps=...".
  absl::Status Run() ABSL_LOCKS_EXCLUDED(mu_);
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  int port() const { return rpc_.port; }

 private:
  explicit SchedulerDaemon(SchedulerDaemonOptions options);
  void OnResult(const JobResult& result) ABSL_LOCKS_EXCLUDED(mu_);

  const SchedulerDaemonOptions options_;
  ClusterRegistry registry_;
  SchedulerServiceImpl service_;
  RunningServer rpc_;
  absl::Mutex mu_;
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::Time> finished_at_ ABSL_GUARDED_BY(mu_);
};

}  // namespace paramserver

#endif  // PARAMSERVER_SCHEDULER_SCHEDULER_DAEMON_H_
