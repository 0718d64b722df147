#include "common/ops/crash_report.h"

#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace paramserver {
namespace {

constexpr int kReportedSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
constexpr int kMostFrames = 64;
// The longest a report may take (a stderr pipe nobody reads, a lock the unwinder waits
// for): then SIGALRM's default action ends the process all the same.
constexpr unsigned kReportSeconds = 10;

// Everything below runs inside a signal handler: only async-signal-safe calls (write,
// backtrace once preloaded, alarm, signal, raise, syscall), no allocation, no locks of
// this file's.

void WriteToStderr(const char* text, size_t size) {
  while (size > 0) {
    const ssize_t written = write(STDERR_FILENO, text, size);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return;
    text += written;
    size -= static_cast<size_t>(written);
  }
}

void WriteToStderr(const char* text) { WriteToStderr(text, std::strlen(text)); }

void WriteNumberToStderr(uintptr_t value, int base) {
  char digits[2 + 3 * sizeof(value)];
  size_t at = sizeof(digits);
  do {
    digits[--at] = "0123456789abcdef"[value % base];
    value /= base;
  } while (value != 0);
  if (base == 16) {
    digits[--at] = 'x';
    digits[--at] = '0';
  }
  WriteToStderr(digits + at, sizeof(digits) - at);
}

const char* SignalName(int signal) {
  switch (signal) {
    case SIGSEGV:
      return "SIGSEGV";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGILL:
      return "SIGILL";
    case SIGABRT:
      return "SIGABRT";
    default:
      return "a signal";
  }
}

// Ends the process with `signal`'s default action: raised again, it is pending until
// the handler returns (before a faulting instruction could run again).
void DieOf(int signal) {
  ::signal(signal, SIG_DFL);
  raise(signal);
}

void ReportCrash(int signal, siginfo_t* info, void* /*context*/) {
  // One report. A fault inside it (in backtrace, say) takes its default action at once:
  // the reported signals are held while it is written (sa_mask), and the kernel does not
  // hold back a fault. Here: another thread crashing meanwhile, which waits for the
  // report within its bound, or one of the held signals delivered to this thread after
  // the report (the process is ending).
  static std::atomic<long> reporting_thread{0};
  const long self = syscall(SYS_gettid);
  long none = 0;
  if (!reporting_thread.compare_exchange_strong(none, self)) {
    if (none != self) sleep(kReportSeconds + 1);
    DieOf(signal);
    return;
  }
  alarm(kReportSeconds);
  const bool sent = info != nullptr && info->si_code <= 0;  // kill(), raise(), abort()
  WriteToStderr("*** ");
  WriteToStderr(SignalName(signal));
  WriteToStderr(" received");
  if (sent && info->si_pid != 0 && info->si_pid != getpid()) {  // another process's
    WriteToStderr(" from process ");
    WriteNumberToStderr(static_cast<uintptr_t>(info->si_pid), 10);
  } else if (!sent && signal != SIGABRT && info != nullptr) {
    WriteToStderr(" at address ");
    WriteNumberToStderr(reinterpret_cast<uintptr_t>(info->si_addr), 16);
  }
  WriteToStderr(
      "; the stack of the thread it reached (addr2line -Cfe BINARY 0xOFFSET names a frame):\n");
  void* frames[kMostFrames];
  const int count = backtrace(frames, kMostFrames);
  backtrace_symbols_fd(frames, count, STDERR_FILENO);
  WriteToStderr("*** end of the stack\n");
  DieOf(signal);
}

}  // namespace

void InstallCrashReport() {
  static std::atomic<bool> installed{false};
  if (installed.exchange(true)) return;
  // backtrace() loads libgcc's unwinder on its first call, which allocates: do it now,
  // not inside the handler.
  void* frame;
  backtrace(&frame, 1);
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_sigaction = ReportCrash;
  action.sa_flags = SA_SIGINFO;
  // While a report is written the other reported signals wait: one the kernel cannot
  // hold back (a fault inside the report itself) takes its default action instead.
  sigemptyset(&action.sa_mask);
  for (int signal : kReportedSignals) sigaddset(&action.sa_mask, signal);
  for (int signal : kReportedSignals) sigaction(signal, &action, nullptr);
}

}  // namespace paramserver
