// Real daemons as child processes on 127.0.0.1, for cluster tests: the scheduler (on an
// OS-assigned port), the servers and the workers, each logging to its own file.
#ifndef PARAMSERVER_COMMON_TESTING_LOCAL_CLUSTER_H_
#define PARAMSERVER_COMMON_TESTING_LOCAL_CLUSTER_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace paramserver {

// A child process with its output in a log file. Killed (SIGKILL) and reaped on
// destruction if still running. Not thread-safe.
class ChildProcess {
 public:
  // Starts argv[0] (a path) with stdout and stderr going to `log_path`.
  static absl::StatusOr<ChildProcess> Start(const std::vector<std::string>& argv,
                                            const std::string& log_path);
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&&) = delete;
  ~ChildProcess();

  // Waits until the process exits or `deadline`; returns its exit code (128+N for signal N).
  // DEADLINE_EXCEEDED if it is still running.
  absl::StatusOr<int> WaitForExit(absl::Time deadline);
  // Sends `signal`. After SIGKILL the process's death is expected: WaitForAll does not
  // count it as a failure.
  void Kill(int signal);
  bool killed() const { return killed_; }
  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }
  std::string ReadLog() const;

 private:
  ChildProcess(pid_t pid, std::string log_path) : pid_(pid), log_path_(std::move(log_path)) {}
  pid_t pid_;
  std::string log_path_;
  bool exited_ = false;
  bool killed_ = false;
  int exit_code_ = 0;
};

// The path of a binary built by Bazel, from inside a test's runfiles
// (e.g. "ps/ps_server").
std::string RunfilePath(const std::string& relative);

// The number captured by `pattern`'s one group in `process`'s log, once a line matches
// (e.g. R"(metrics on http://127\.0\.0\.1:(\d+)/metrics)"); DEADLINE_EXCEEDED after
// `timeout`.
absl::StatusOr<int> WaitForLoggedNumber(const ChildProcess& process, const std::string& pattern,
                                        absl::Duration timeout);

// Waits until some shard in checkpoint folder `dir` has a checkpoint at `step` or later
// (a job that has trained that far). DEADLINE_EXCEEDED saying so at `timeout`.
absl::Status WaitForCheckpoint(const std::string& dir, int64_t step,
                               absl::Duration timeout = absl::Seconds(60));

// A whole cluster of real processes for one config. Not thread-safe.
class LocalCluster {
 public:
  // Starts the scheduler and waits for its port, then `servers` servers and `workers`
  // workers (pass 0 to start fewer than the config expects and play the rest yourself).
  // `worker_args` are added to every worker's command line, `scheduler_args` to the
  // scheduler's.
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(
      const std::string& config_path, const std::string& log_dir, int servers, int workers,
      std::vector<std::string> worker_args = {}, std::vector<std::string> scheduler_args = {},
      std::vector<std::string> server_args = {});

  // Starts a new scheduler on the same address (after the old one was killed).
  absl::Status RestartScheduler(const std::string& log_path);

  // Starts one more server or worker (a restart, or a replacement), logging to `log_path`.
  absl::Status StartServer(const std::string& log_path);
  // `extra_args` go after the cluster's worker args (for one worker alone).
  absl::Status StartWorker(const std::string& log_path,
                           const std::vector<std::string>& extra_args = {});

  // Waits for every daemon to exit. OK if all exited 0 (or were killed by the test);
  // otherwise an error naming the first that failed or is still running, with the
  // tail of its log.
  absl::Status WaitForAll(absl::Duration timeout);

  const std::string& scheduler_address() const { return scheduler_address_; }
  ChildProcess& scheduler() { return processes_[scheduler_index_]; }
  std::vector<ChildProcess>& processes() { return processes_; }
  // The value of `key=` on the (current) scheduler's final line, e.g. "test_accuracy" (or a
  // ctr model's "test_auc");
  // -1 if absent.
  double FinalValue(const std::string& key) const;

 private:
  LocalCluster() = default;
  absl::Status StartDaemon(const char* binary, const std::string& log_path,
                           const std::vector<std::string>& extra);
  std::string config_path_;
  std::vector<std::string> worker_args_;
  std::vector<std::string> server_args_;
  std::vector<std::string> scheduler_args_;
  size_t scheduler_index_ = 0;
  std::string scheduler_address_;
  std::vector<ChildProcess> processes_;  // scheduler first
};

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_TESTING_LOCAL_CLUSTER_H_
