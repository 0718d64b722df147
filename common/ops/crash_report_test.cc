// The crash report in a child process that really crashes: a fault at a bad address, an
// abort(), and a signal another process sends. Each child dies of its signal (no core
// dump: RLIMIT_CORE 0) with the report on its stderr.
#include "common/ops/crash_report.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "catch2/catch.hpp"
#include "common/testing/temp_dir.h"

namespace paramserver {
namespace {

struct Crash {
  int signal = 0;      // what the child died of; 0 if it did not die of a signal in time
  std::string report;  // its stderr
};

// Forks a child that writes stderr to a file, installs the report and runs `crash`,
// while this process runs `meanwhile(child, stderr_path)` (when given); waits for it at
// most 20 s.
Crash RunCrashing(const std::function<void()>& crash,
                  const std::function<void(pid_t, const std::string&)>& meanwhile = nullptr) {
  TempDir dir;
  const std::string stderr_path = dir.File("stderr.txt");
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    const rlimit no_core{0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    const int fd = open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || dup2(fd, STDERR_FILENO) < 0) _exit(100);
    InstallCrashReport();
    crash();
    _exit(101);  // it did not crash
  }
  if (meanwhile) meanwhile(child, stderr_path);
  Crash result;
  int status = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (waitpid(child, &status, WNOHANG) == 0) {
    if (absl::Now() > deadline) {
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      FAIL("the crashing child did not end within 20 s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  result.report = ReadFileOrEmpty(stderr_path);
  return result;
}

// A frame of this binary, as addr2line takes it ("/path/crash_report_test(+0x...)").
bool HasOwnFrame(const std::string& report) {
  return report.find("crash_report_test(+0x") != std::string::npos;
}

TEST_CASE("a fault is reported with its address and stack, and the process dies of it") {
  const Crash crash = RunCrashing([] {
    // Read from a volatile: the compiler cannot see the address (nor warn about it).
    volatile uintptr_t address = 16;
    *reinterpret_cast<volatile int*>(address) = 1;
  });
  INFO(crash.report);
  CHECK(crash.signal == SIGSEGV);
  CHECK(crash.report.find("*** SIGSEGV received at address 0x10; the stack of the thread") !=
        std::string::npos);
  CHECK(HasOwnFrame(crash.report));
  CHECK(crash.report.find("*** end of the stack\n") != std::string::npos);
}

TEST_CASE("an abort() is reported with its stack, and the process dies of SIGABRT") {
  const Crash crash = RunCrashing([] { std::abort(); });
  INFO(crash.report);
  CHECK(crash.signal == SIGABRT);
  CHECK(crash.report.find("*** SIGABRT received; the stack of the thread") != std::string::npos);
  CHECK(crash.report.find("abort") != std::string::npos);  // libc's frame
  CHECK(HasOwnFrame(crash.report));
  CHECK(crash.report.find("*** end of the stack\n") != std::string::npos);
}

TEST_CASE("a signal sent by another process names the sender") {
  const Crash crash = RunCrashing(
      [] {
        const char ready[] = "ready\n";
        if (write(STDERR_FILENO, ready, sizeof(ready) - 1) < 0) _exit(102);
        while (true) pause();
      },
      [](pid_t child, const std::string& stderr_path) {
        const absl::Time deadline = absl::Now() + absl::Seconds(20);
        while (ReadFileOrEmpty(stderr_path).find("ready") == std::string::npos &&
               absl::Now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        kill(child, SIGBUS);
      });
  INFO(crash.report);
  CHECK(crash.signal == SIGBUS);
  CHECK(crash.report.find(absl::StrCat("*** SIGBUS received from process ", getpid(),
                                       "; the stack of the thread")) != std::string::npos);
  CHECK(HasOwnFrame(crash.report));
  CHECK(crash.report.find("*** end of the stack\n") != std::string::npos);
}

}  // namespace
}  // namespace paramserver
