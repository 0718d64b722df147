#include "worker/blas_kernels.h"

#include <cblas.h>
#include <unistd.h>

#include <climits>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace paramserver {
namespace {

constexpr char kCoreTypeVariable[] = "OPENBLAS_CORETYPE";
// Set with kCoreTypeVariable by the restart, for the restarted process: the core
// OpenBLAS chose by itself (TakeBlasKernelsRestartNote takes both).
constexpr char kOwnChoiceVariable[] = "PS_WORKER_OPENBLAS_OWN_CHOICE";

// OpenBLAS's x86 cores without AVX (its corename() strings, lower case): where it names
// one of these for a CPU with AVX, it did not know the CPU.
constexpr const char* kCoresWithoutAvx[] = {
    "unknown", "katmai",    "coppermine", "northwood",     "prescott",  "banias",
    "atom",    "core2",     "penryn",     "dunnington",    "nehalem",   "athlon",
    "opteron", "barcelona", "nano",       "opteron(sse3)", "bobcat",
};

// OpenBLAS's own choice, in a process a restart started (TakeBlasKernelsRestartNote):
// written once, before any thread starts, and only read after.
std::string& OwnChoiceBeforeRestart() {
  static std::string* const own_choice = new std::string();
  return *own_choice;
}

const char* LevelName(X86VectorLevel level) {
  switch (level) {
    case X86VectorLevel::kAvx512:
      return "AVX-512";
    case X86VectorLevel::kAvx2:
      return "AVX2";
    case X86VectorLevel::kAvx:
      return "AVX";
    case X86VectorLevel::kNone:
      break;
  }
  return "no AVX";
}

}  // namespace

X86VectorLevel HostVectorLevel() {
#if defined(__x86_64__)
  // libgcc's checks include the operating system's support (XGETBV) for AVX and AVX-512.
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl")) {
    return X86VectorLevel::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return X86VectorLevel::kAvx2;
  if (__builtin_cpu_supports("avx")) return X86VectorLevel::kAvx;
#endif
  return X86VectorLevel::kNone;
}

std::optional<std::string> OpenBlasCoreToForce(absl::string_view chosen_core,
                                               X86VectorLevel level) {
  const std::string chosen = absl::AsciiStrToLower(chosen_core);
  bool without_avx = false;
  for (const char* core : kCoresWithoutAvx) without_avx = without_avx || chosen == core;
  if (!without_avx) return std::nullopt;
  switch (level) {
    case X86VectorLevel::kAvx512:
      return "SkylakeX";
    case X86VectorLevel::kAvx2:
      return "Haswell";
    case X86VectorLevel::kAvx:
      return "Sandybridge";
    case X86VectorLevel::kNone:
      break;
  }
  return std::nullopt;
}

std::string OpenBlasCore() {
  const char* core = openblas_get_corename();
  return core != nullptr ? core : "unknown";
}

namespace {

// The command this process was started with (/proc/self/cmdline), where it ends with
// argv[0..argc), else argv.
std::vector<std::string> CommandToRunAgain(int argc, char** argv) {
  std::vector<std::string> command;
  {
    std::ifstream cmdline("/proc/self/cmdline", std::ios::binary);  // closed before the exec
    std::string arg;
    while (std::getline(cmdline, arg, '\0')) command.push_back(arg);
  }
  const std::vector<std::string> args(argv, argv + argc);
  const bool ends_with_args =
      command.size() >= args.size() &&
      std::equal(args.begin(), args.end(), command.end() - static_cast<ptrdiff_t>(args.size()));
  return ends_with_args && !args.empty() ? command : args;
}

// The path /proc/self/exe names: executed by it, the process keeps its name (executed
// as /proc/self/exe, it would be called "exe").
std::string ExecutablePath() {
  char path[PATH_MAX];
  const ssize_t length = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (length <= 0) return "/proc/self/exe";
  const std::string resolved(path, static_cast<size_t>(length));
  // A binary replaced since it started: only the link still reaches it.
  return absl::EndsWith(resolved, " (deleted)") ? "/proc/self/exe" : resolved;
}

}  // namespace

absl::Status MaybeRestartWithBetterBlasKernels(int argc, char** argv,
                                               absl::string_view chosen_core) {
  if (std::getenv(kCoreTypeVariable) != nullptr) return absl::OkStatus();  // the user's, or ours
  const std::optional<std::string> better =
      OpenBlasCoreToForce(chosen_core, HostVectorLevel());
  if (!better.has_value()) return absl::OkStatus();
  const std::string chosen(chosen_core);
  const std::string executable = ExecutablePath();
  std::vector<std::string> command = CommandToRunAgain(argc, argv);
  std::vector<char*> command_argv;
  for (std::string& arg : command) command_argv.push_back(arg.data());
  command_argv.push_back(nullptr);
  if (setenv(kCoreTypeVariable, better->c_str(), 1) != 0 ||
      setenv(kOwnChoiceVariable, chosen.c_str(), 1) != 0) {
    unsetenv(kCoreTypeVariable);
    return absl::InternalError("could not set OPENBLAS_CORETYPE in the environment");
  }
  execv(executable.c_str(), command_argv.data());
  const int error = errno;  // only on failure
  unsetenv(kCoreTypeVariable);
  unsetenv(kOwnChoiceVariable);
  return absl::UnavailableError(absl::StrCat(
      "could not run again (", executable, ") with OPENBLAS_CORETYPE=", *better, ": ",
      std::strerror(error), "; computing with OpenBLAS's ", chosen,
      " kernels, which do not use this CPU's ", LevelName(HostVectorLevel())));
}

bool TakeBlasKernelsRestartNote() {
  const char* own_choice = std::getenv(kOwnChoiceVariable);
  if (own_choice == nullptr) return false;
  OwnChoiceBeforeRestart() = own_choice;
  unsetenv(kOwnChoiceVariable);
  unsetenv(kCoreTypeVariable);
  return true;
}

std::string BlasKernelsDescription() {
  std::string description = absl::StrCat("OpenBLAS's ", OpenBlasCore(), " kernels");
  if (!OwnChoiceBeforeRestart().empty()) {
    absl::StrAppend(&description, " (OpenBLAS chose its ", OwnChoiceBeforeRestart(),
                    " kernels, which lack this CPU's ", LevelName(HostVectorLevel()),
                    ": it does not know this CPU; set OPENBLAS_CORETYPE to choose)");
  }
  return description;
}

}  // namespace paramserver
