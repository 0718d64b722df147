#include "common/ops/crash_report.h"

#include <execinfo.h>
#include <signal.h>
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

// Everything below runs inside a signal handler: only async-signal-safe calls (write,
// backtrace once preloaded, signal, raise), no allocation, no locks.

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

void WriteHexToStderr(uintptr_t value) {
  char digits[2 + 2 * sizeof(value)];
  size_t at = sizeof(digits);
  do {
    digits[--at] = "0123456789abcdef"[value & 0xf];
    value >>= 4;
  } while (value != 0);
  digits[--at] = 'x';
  digits[--at] = '0';
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

void ReportCrash(int signal, siginfo_t* info, void* /*context*/) {
  // One report: a second thread crashing meanwhile waits for the first to end the process.
  static std::atomic<bool> reporting{false};
  if (reporting.exchange(true)) {
    while (true) pause();
  }
  WriteToStderr("*** ");
  WriteToStderr(SignalName(signal));
  WriteToStderr(" received");
  if (signal != SIGABRT && info != nullptr && info->si_code > 0) {  // > 0: raised by the kernel
    WriteToStderr(" at address ");
    WriteHexToStderr(reinterpret_cast<uintptr_t>(info->si_addr));
  }
  WriteToStderr("; the crashing thread's stack (addr2line -Cfie BINARY +OFFSET names a frame):\n");
  void* frames[kMostFrames];
  const int count = backtrace(frames, kMostFrames);
  backtrace_symbols_fd(frames, count, STDERR_FILENO);
  WriteToStderr("*** end of the stack\n");
  // Die of the signal itself: the default action, re-raised (a fault would recur anyway).
  ::signal(signal, SIG_DFL);
  raise(signal);
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
  sigemptyset(&action.sa_mask);
  for (int signal : kReportedSignals) sigaction(signal, &action, nullptr);
}

}  // namespace paramserver
