#include "common/testing/local_cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/checkpoint/shard_checkpoint.h"
#include "common/files/file_system.h"

namespace paramserver {

absl::StatusOr<ChildProcess> ChildProcess::Start(const std::vector<std::string>& argv,
                                                 const std::string& log_path) {
  const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) return absl::UnavailableError(absl::StrCat("cannot create ", log_path));
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(log_fd);
    return absl::UnavailableError("fork failed");
  }
  if (pid == 0) {
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    execv(args[0], args.data());
    _exit(127);
  }
  close(log_fd);
  return ChildProcess(pid, log_path);
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(other.pid_),
      log_path_(std::move(other.log_path_)),
      exited_(other.exited_),
      killed_(other.killed_),
      exit_code_(other.exit_code_) {
  other.pid_ = -1;
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && !exited_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

absl::StatusOr<int> ChildProcess::WaitForExit(absl::Time deadline) {
  while (!exited_) {
    int status = 0;
    const pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == pid_) {
      exited_ = true;
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("pid ", pid_, " (", log_path_, ") is still running"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return exit_code_;
}

void ChildProcess::Kill(int signal) {
  if (pid_ > 0 && !exited_) kill(pid_, signal);
  if (signal == SIGKILL) killed_ = true;
}

std::string ChildProcess::ReadLog() const {
  return LocalFileSystem().ReadFile(log_path_).value_or("");
}

std::string RunfilePath(const std::string& relative) {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* workspace = getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return relative;
  return absl::StrCat(srcdir, "/", workspace != nullptr ? workspace : "paramserver", "/", relative);
}

absl::StatusOr<int> WaitForLoggedNumber(const ChildProcess& process, const std::string& pattern,
                                        absl::Duration timeout) {
  const std::regex line(pattern);
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    std::smatch match;
    const std::string log = process.ReadLog();
    if (std::regex_search(log, match, line)) return std::stoi(match[1]);
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("no line matching ", pattern, " in ", process.log_path()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(
    const std::string& config_path, const std::string& log_dir, int servers, int workers,
    std::vector<std::string> worker_args, std::vector<std::string> scheduler_args,
    std::vector<std::string> server_args) {
  std::unique_ptr<LocalCluster> cluster(new LocalCluster());
  cluster->worker_args_ = std::move(worker_args);
  cluster->server_args_ = std::move(server_args);
  cluster->scheduler_args_ = scheduler_args;
  const std::string port_file = log_dir + "/scheduler.port";
  LocalFileSystem().DeleteFile(port_file).IgnoreError();  // a previous cluster's, if any
  std::vector<std::string> argv = {RunfilePath("scheduler/ps_scheduler"),
                                   "--config",
                                   config_path,
                                   "--listen",
                                   "127.0.0.1:0",
                                   "--port_file",
                                   port_file};
  argv.insert(argv.end(), scheduler_args.begin(), scheduler_args.end());
  absl::StatusOr<ChildProcess> scheduler = ChildProcess::Start(argv, log_dir + "/scheduler.log");
  if (!scheduler.ok()) return scheduler.status();
  cluster->processes_.push_back(std::move(*scheduler));
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  std::string port;
  while (port.empty()) {
    port =
        std::string(absl::StripAsciiWhitespace(LocalFileSystem().ReadFile(port_file).value_or("")));
    if (!port.empty()) break;
    if (absl::Now() > deadline || cluster->scheduler().WaitForExit(absl::Now()).ok()) {
      return absl::UnavailableError(
          absl::StrCat("the scheduler did not start: ", cluster->scheduler().ReadLog()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  cluster->scheduler_address_ = "127.0.0.1:" + port;
  cluster->config_path_ = config_path;
  for (int i = 0; i < servers; ++i) {
    if (absl::Status s = cluster->StartServer(absl::StrCat(log_dir, "/server-", i, ".log"));
        !s.ok())
      return s;
  }
  for (int i = 0; i < workers; ++i) {
    if (absl::Status s = cluster->StartWorker(absl::StrCat(log_dir, "/worker-", i, ".log"));
        !s.ok())
      return s;
  }
  return cluster;
}

absl::Status LocalCluster::StartDaemon(const char* binary, const std::string& log_path,
                                       const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {
      RunfilePath(binary), "--config",    config_path_,          "--scheduler", scheduler_address_,
      "--listen",          "127.0.0.1:0", "--startup_timeout_s", "60"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  absl::StatusOr<ChildProcess> child = ChildProcess::Start(argv, log_path);
  if (!child.ok()) return child.status();
  processes_.push_back(std::move(*child));
  return absl::OkStatus();
}

absl::Status LocalCluster::RestartScheduler(const std::string& log_path) {
  std::vector<std::string> argv = {RunfilePath("scheduler/ps_scheduler"), "--config", config_path_,
                                   "--listen", scheduler_address_};
  argv.insert(argv.end(), scheduler_args_.begin(), scheduler_args_.end());
  absl::StatusOr<ChildProcess> scheduler = ChildProcess::Start(argv, log_path);
  if (!scheduler.ok()) return scheduler.status();
  processes_.push_back(std::move(*scheduler));
  scheduler_index_ = processes_.size() - 1;
  return absl::OkStatus();
}

absl::Status LocalCluster::StartServer(const std::string& log_path) {
  return StartDaemon("ps/ps_server", log_path, server_args_);
}

absl::Status LocalCluster::StartWorker(const std::string& log_path,
                                       const std::vector<std::string>& extra_args) {
  std::vector<std::string> args = worker_args_;
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  return StartDaemon("worker/ps_worker", log_path, args);
}

absl::Status LocalCluster::WaitForAll(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  auto tail = [](const std::string& log) {
    return log.size() > 3000 ? log.substr(log.size() - 3000) : log;
  };
  auto failure = [&](ChildProcess& process, const std::string& what) {
    return absl::InternalError(
        absl::StrCat(process.log_path(), " ", what, "; its log ends:\n", tail(process.ReadLog()),
                     "\nthe scheduler's log ends:\n", tail(scheduler().ReadLog())));
  };
  // Polls every process, so that one that fails is reported at once rather than after
  // the others have waited for it until their own deadlines.
  while (true) {
    bool all_done = true;
    for (ChildProcess& process : processes_) {
      absl::StatusOr<int> code = process.WaitForExit(absl::Now());
      if (!code.ok()) {
        all_done = false;
      } else if (*code != 0 && !process.killed()) {
        return failure(process, absl::StrCat("exited with ", *code));
      }
    }
    if (all_done) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      for (ChildProcess& process : processes_) {
        if (!process.WaitForExit(absl::Now()).ok()) return failure(process, "did not exit in time");
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

double LocalCluster::FinalValue(const std::string& key) const {
  const std::string log = processes_[scheduler_index_].ReadLog();
  const size_t line = log.find("final test_");  // test_accuracy=, or a ctr model's test_auc=
  if (line == std::string::npos) return -1;
  const size_t at = log.find(key + "=", line);
  if (at == std::string::npos) return -1;
  return std::atof(log.c_str() + at + key.size() + 1);
}

absl::Status WaitForCheckpoint(const std::string& dir, int64_t step, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::vector<CheckpointFileName> files = ListShardCheckpoints(LocalFileSystem(), dir);
    if (!files.empty() && files.front().step >= step) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(5));
  }
  return absl::DeadlineExceededError(absl::StrCat("no checkpoint at step ", step, " in ", dir,
                                                  " within ", absl::FormatDuration(timeout)));
}

}  // namespace paramserver
