// The scheduler process, wired up: the registry, its gRPC service, and the watch over
// heartbeats. main.cc only parses flags and calls this.
#ifndef PARAMSERVER_SCHEDULER_SCHEDULER_DAEMON_H_
#define PARAMSERVER_SCHEDULER_SCHEDULER_DAEMON_H_

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/config/cluster_spec.h"
#include "common/ops/metrics.h"
#include "common/rpc/rpc_endpoints.h"
#include "common/security/peer_credentials.h"
#include "common/security/refusal_log.h"
#include "scheduler/admin_service.h"
#include "scheduler/cluster_registry.h"
#include "scheduler/map_publisher.h"
#include "scheduler/scheduler_service.h"
#include "scheduler/worker_absence_watch.h"

namespace paramserver {

// The spec's errors that only its model shows (mlp, ctr; a torch model's are checked when
// declared): more shards than parameters, a parameter group's pattern that matches no
// tensor, a tensor two groups claim. INVALID_ARGUMENT naming them. ps_scheduler
// --describe (and so deploy/local/run.sh) checks these before any daemon starts.
absl::Status CheckSpecModel(const ClusterSpec& spec);

struct SchedulerDaemonOptions {
  std::string metrics_host = "127.0.0.1";  // where the metrics HTTP endpoint listens
  int metrics_port = -1;  // >= 0: serve /metrics on the listen host (0: any free port)
  ClusterSpec spec;
  std::string listen_address;  // default: spec.cluster.scheduler_address
  std::string port_file;       // if set, the bound port is written there once serving
  // If set, the scheduler's state is saved there on every change, and a scheduler
  // started with an existing file takes the running job over from it.
  std::string state_file;
};

// Thread-safe.
class SchedulerDaemon {
 public:
  // Starts serving. UNAVAILABLE if the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<SchedulerDaemon>> Create(SchedulerDaemonOptions options);
  ~SchedulerDaemon();

  // Watches heartbeats until the job has finished and every server has been told to
  // stop (or a failure timeout has passed since), or until Shutdown(). A node silent
  // past cluster.failure_timeout_ms is declared dead, logged with how long it was
  // silent, and recovered from (see ClusterRegistry::DeclareDead); each new shard map
  // is pushed to the servers. Logs the final line
  // "final test_accuracy=... samples_per_sec=... steps=...". A started job left with no
  // live worker logs that it waits, every 5 s, and ends at cluster.no_worker_timeout_ms:
  // every node is told to stop and Run returns DEADLINE_EXCEEDED naming the cause,
  // marked MarkJobEndedUnfinished (the scheduler exits 3, and is not restarted). A
  // server's loss that leaves a shard with neither a copy nor checkpoint.dir
  // (DeclareDead's DATA_LOSS) ends a running job the same way, with DATA_LOSS naming the
  // shards.
  absl::Status Run() ABSL_LOCKS_EXCLUDED(mu_);
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  // Has every shard checkpoint at a step it will reach shortly; returns that step.
  // Blocks for at most a few seconds.
  absl::StatusOr<int64_t> RequestCheckpoint();

  int port() const { return rpc_.port; }

 private:
  SchedulerDaemon(SchedulerDaemonOptions options, RegistryOptions registry_options,
                  std::string cluster_token, std::string admin_token);
  // Takes the running job over from options_.state_file when it exists (a scheduler
  // restarted mid-job). DATA_LOSS for a file that is not a state of this job.
  absl::Status TakeOverSavedState();
  // The gauges (one registry snapshot per scrape), and /metrics, /api/status and the
  // status page on options_.metrics_port when set.
  absl::Status ServeStatusAndMetrics();
  void OnResult(const JobResult& result) ABSL_LOCKS_EXCLUDED(mu_);
  // The job ends once every node has been told (see Run).
  // Writes output.report (if set): the status page with the final status built in.
  void WriteFinalReport() ABSL_LOCKS_EXCLUDED(mu_);
  void OnShutdownRequested() ABSL_LOCKS_EXCLUDED(mu_);
  // Run's answer to a job without a live worker (see WorkerAbsenceWatch): a waiting line,
  // or, at cluster.no_worker_timeout_ms, `ending` set to the error Run returns (see
  // Run) and every node told to stop.
  void MaybeEndWithoutWorkers(const WorkerAbsenceWatch::Observation& absence, absl::Status* ending)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the job unfinished: `ending` set to `why`, marked MarkJobEndedUnfinished (the
  // error Run returns), logged as "<why>; telling every node to stop" (the launcher
  // shows it), and every node told to stop. Nothing if the job has ended already.
  void EndJobUnfinished(absl::Status why, absl::Status* ending) ABSL_LOCKS_EXCLUDED(mu_);
  // Queues a map change for the publishing thread, which delivers them in order.
  void EnqueueMapChange(MapChange change) ABSL_LOCKS_EXCLUDED(mu_);
  void PublishLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Saves the registry's state if it changed since the last save. Called by Run's
  // thread and, before each map goes out, by the publishing thread: a scheduler that
  // takes over then knows every map a server may serve (no two maps of one epoch).
  // OK when the state file holds the registry's present state (or there is none);
  // the write's error otherwise (logged too).
  absl::Status MaybeSaveState() ABSL_LOCKS_EXCLUDED(save_mu_);

  const SchedulerDaemonOptions options_;
  const std::string admin_token_;  // empty: none configured
  MetricsRegistry metrics_;
  RefusalLog refusals_{&metrics_, "scheduler_refused_requests_total"};
  ClusterRegistry registry_;
  // What the scheduler presents to servers: the cluster token and its own credential.
  std::shared_ptr<CallCredentials> credentials_;
  ServerStubs server_stubs_{credentials_};  // presenting credentials_
  SchedulerServiceImpl service_;
  AdminServiceImpl admin_;
  RunningServer rpc_;
  std::unique_ptr<MetricsHttpServer> metrics_http_;  // reads registry_: declared after it
  absl::Mutex mu_;
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::Time> finished_at_ ABSL_GUARDED_BY(mu_);
  std::deque<MapChange> pending_changes_ ABSL_GUARDED_BY(mu_);
  std::thread publisher_;
  std::thread timed_checkpoint_;  // the latest every_seconds request, if any
  absl::Mutex save_mu_;  // one save at a time (held across the file's write: only savers wait)
  int64_t saved_state_version_ ABSL_GUARDED_BY(save_mu_) = -1;
};

}  // namespace paramserver

#endif  // PARAMSERVER_SCHEDULER_SCHEDULER_DAEMON_H_
