#include "common/files/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

extern char** environ;

namespace paramserver {
namespace {

// A pipe's two ends, closed when it goes out of scope.
struct Pipe {
  int read_end = -1;
  int write_end = -1;
  ~Pipe() {
    if (read_end >= 0) close(read_end);
    if (write_end >= 0) close(write_end);
  }
  bool Open() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return false;
    read_end = fds[0];
    write_end = fds[1];
    return true;
  }
};

void CloseFd(int* fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

// write(2) to a pipe without SIGPIPE: a program that exits before it has read all of its
// input (an AWS CLI refusing a missing bucket at once) makes the write fail with EPIPE,
// not kill this process. SIGPIPE is blocked on this thread for the call, and the one
// the failed write raised is taken off the thread's pending set before it is unblocked.
ssize_t WriteWithoutSigpipe(int fd, const char* data, size_t size) {
  sigset_t sigpipe_only, previous;
  sigemptyset(&sigpipe_only);
  sigaddset(&sigpipe_only, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &sigpipe_only, &previous);
  const bool was_pending = [&] {
    sigset_t pending;
    sigpending(&pending);
    return sigismember(&pending, SIGPIPE) == 1;
  }();
  const ssize_t n = write(fd, data, size);
  const int write_errno = errno;
  if (n < 0 && write_errno == EPIPE && !was_pending) {
    const timespec no_wait = {0, 0};
    while (sigtimedwait(&sigpipe_only, nullptr, &no_wait) < 0 && errno == EINTR) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  errno = write_errno;
  return n;
}

}  // namespace

absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv,
                                         absl::string_view input, absl::Duration timeout) {
  const std::string what = absl::StrJoin(argv, " ");
  if (argv.empty()) return absl::InvalidArgumentError("RunCommand: no program");
  Pipe in, out, err;
  if (!in.Open() || !out.Open() || !err.Open()) {
    return absl::UnavailableError(absl::StrCat("cannot run ", what, ": pipe: ", strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in.read_end, 0);
  posix_spawn_file_actions_adddup2(&actions, out.write_end, 1);
  posix_spawn_file_actions_adddup2(&actions, err.write_end, 2);
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int spawned = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot run ", argv[0], ": ", strerror(spawned),
                     spawned == ENOENT ? " (is it installed and on PATH?)" : ""));
  }
  CloseFd(&in.read_end);
  CloseFd(&out.write_end);
  CloseFd(&err.write_end);
  for (int fd : {in.write_end, out.read_end, err.read_end})
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  if (input.empty()) CloseFd(&in.write_end);

  CommandResult result;
  size_t written = 0;
  const absl::Time deadline = absl::Now() + timeout;
  bool timed_out = false;
  while (out.read_end >= 0 || err.read_end >= 0) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      timed_out = true;
      break;
    }
    pollfd fds[3];
    int count = 0;
    if (in.write_end >= 0) fds[count++] = {in.write_end, POLLOUT, 0};
    if (out.read_end >= 0) fds[count++] = {out.read_end, POLLIN, 0};
    if (err.read_end >= 0) fds[count++] = {err.read_end, POLLIN, 0};
    const int ready = poll(fds, count, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (ready < 0 && errno != EINTR) break;
    for (int i = 0; i < count && ready > 0; ++i) {
      if (fds[i].revents == 0) continue;
      if (fds[i].fd == in.write_end) {
        const ssize_t n =
            WriteWithoutSigpipe(in.write_end, input.data() + written, input.size() - written);
        if (n > 0) written += static_cast<size_t>(n);
        if (n < 0 && errno != EAGAIN && errno != EINTR)
          written = input.size();  // it stopped reading
        if (written == input.size()) CloseFd(&in.write_end);
        continue;
      }
      const bool is_out = fds[i].fd == out.read_end;
      char buffer[65536];
      const ssize_t n = read(fds[i].fd, buffer, sizeof(buffer));
      if (n > 0) {
        (is_out ? result.standard_output : result.standard_error).append(buffer, n);
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        CloseFd(is_out ? &out.read_end : &err.read_end);
      }
    }
  }
  CloseFd(&in.write_end);
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, " did not finish within ", absl::FormatDuration(timeout), "; killed"));
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

}  // namespace paramserver
