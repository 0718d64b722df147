// The body every daemon's main() shares: load the spec, create the daemon, run it until
// it finishes or SIGTERM/SIGINT arrives, and turn any error into one line and an exit code.
#ifndef PARAMSERVER_COMMON_OPS_DAEMON_MAIN_H_
#define PARAMSERVER_COMMON_OPS_DAEMON_MAIN_H_

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/synchronization/mutex.h"
#include "common/config/cluster_spec.h"
#include "common/config/daemon_flags.h"
#include "common/ops/crash_report.h"
#include "common/ops/termination_signal.h"
#include "common/rpc/rpc_endpoints.h"

namespace paramserver {

// The exit code of a daemon that ended its job unfinished, on purpose, where a restart
// cannot help (the scheduler, once no worker joined in time or a lost server held the
// only state of its shards). systemd's units name it in
// RestartPreventExitStatus; deploy/local/run.sh does not restart it either.
inline constexpr int kExitJobEndedUnfinished = 3;

// The exit code of a daemon stopped by SIGTERM or SIGINT (128 + SIGTERM, as a shell
// reports a process the signal ended) after shutting down cleanly. Not 0: a supervisor
// that counts exit 0 as "done" (a Kubernetes Job counts it as a completion and starts no
// replacement; SageMaker as a finished instance) must see a daemon stopped mid-job as
// stopped. systemd's units name it in SuccessExitStatus, so `systemctl stop` is clean.
inline constexpr int kExitStoppedBySignal = 143;

// `status` (an error) marked so that RunDaemonMain exits with kExitJobEndedUnfinished.
inline absl::Status MarkJobEndedUnfinished(absl::Status status) {
  status.SetPayload("paramserver/job-ended-unfinished", absl::Cord("1"));
  return status;
}

// The spec at `config_path` as a daemon runs it: the security flags applied and, with
// security.tls_ca, mutual TLS set up for every channel and server of this process.
// Errors name the file or the key.
inline absl::StatusOr<ClusterSpec> LoadDaemonSpec(const std::string& config_path) {
  absl::StatusOr<ClusterSpec> spec = LoadClusterSpec(config_path);
  if (!spec.ok()) return spec;
  ApplySecurityFlags(&*spec);
  if (const SecuritySection& security = spec->security; !security.tls_ca.empty()) {
    const absl::Status tls = UseMutualTls(
        {security.tls_ca, security.tls_cert, security.tls_key, security.tls_server_name});
    if (!tls.ok()) return tls;
  }
  return spec;
}

// Exit codes: 0 success, 1 the daemon failed, 2 the config could not be loaded, 3 the
// job ended unfinished (Run's error was MarkJobEndedUnfinished), 143 stopped by SIGTERM
// or SIGINT (kExitStoppedBySignal; whether or not the job had finished by then).
// `Daemon` provides: static StatusOr<unique_ptr<Daemon>> Create(Options);
// Status Run() (blocks until done); void Shutdown() (thread-safe, makes Run return).
// `fill_options` turns the loaded spec into the daemon's options.
template <typename Daemon, typename FillOptions>
int RunDaemonMain(const char* program, const std::string& config_path, FillOptions fill_options) {
  // Debian's Abseil is built with its lock-order graph on: every Mutex acquisition
  // records an edge, 1% of a training job's CPU and 5% of a busy scheduler's (perf). The
  // daemons run without it; the unit tests, which do not come through here, keep it, and
  // clang's thread-safety analysis and the TSAN runs check the lock discipline.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // A crash writes its signal and the crashing thread's stack to the node's log.
  InstallCrashReport();
  absl::StatusOr<ClusterSpec> spec = LoadDaemonSpec(config_path);
  if (!spec.ok()) {
    std::fprintf(stderr, "%s: %s\n", program, std::string(spec.status().message()).c_str());
    return 2;
  }
  static std::atomic<Daemon*> running{nullptr};
  static std::atomic<bool> stopped_by_signal{false};
  CallOnTerminationSignal([] {
    stopped_by_signal.store(true);
    Daemon* daemon = running.load();
    if (daemon != nullptr) {
      daemon->Shutdown();
    } else {
      std::_Exit(1);  // still starting up: nothing to shut down cleanly
    }
  });
  absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Create(fill_options(*std::move(spec)));
  if (!daemon.ok()) {
    std::fprintf(stderr, "%s: %s\n", program, daemon.status().ToString().c_str());
    return 1;
  }
  running.store(daemon->get());
  absl::Status status = (*daemon)->Run();
  running.store(nullptr);
  daemon->reset();
  if (!status.ok()) {
    const bool ended_unfinished = status.GetPayload("paramserver/job-ended-unfinished").has_value();
    status.ErasePayload("paramserver/job-ended-unfinished");  // not part of the message
    std::fprintf(stderr, "%s: %s\n", program, status.ToString().c_str());
    return ended_unfinished ? kExitJobEndedUnfinished : 1;
  }
  return stopped_by_signal.load() ? kExitStoppedBySignal : 0;
}

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_OPS_DAEMON_MAIN_H_
