#include "worker/blas_kernels.h"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/ops/cpu_features.h"

namespace paramserver {
namespace {

constexpr char kCoreTypeVariable[] = "OPENBLAS_CORETYPE";
// Set with kCoreTypeVariable by the restart, for the restarted process: the core
// OpenBLAS chose by itself (TakeBlasKernelsRestartNote takes both).
constexpr char kOwnChoiceVariable[] = "PS_WORKER_OPENBLAS_OWN_CHOICE";

// OpenBLAS's x86 cores without AVX (its corename() strings, lower case): where it names
// one of these for a CPU with AVX, it did not know the CPU.
constexpr const char* kCoresWithoutAvx[] = {
    "unknown", "katmai",    "coppermine", "northwood",     "prescott", "banias",
    "atom",    "core2",     "penryn",     "dunnington",    "nehalem",  "athlon",
    "opteron", "barcelona", "nano",       "opteron(sse3)", "bobcat",
};

// OpenBLAS's own choice, in a process a restart started (TakeBlasKernelsRestartNote):
// written once, first thing in main, before any thread of ours starts (OpenBLAS's own
// pool, started as it loaded, never reads it), and only read after.
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
  // libgcc's checks (UsableCpuFeatures) include the operating system's support (XGETBV)
  // for AVX and AVX-512; PS_CPU_BASELINE=1 says none.
  const CpuFeatures cpu = UsableCpuFeatures();
  if (cpu.avx512f && cpu.avx512cd && cpu.avx512bw && cpu.avx512dq && cpu.avx512vl)
    return X86VectorLevel::kAvx512;
  if (cpu.avx2 && cpu.fma) return X86VectorLevel::kAvx2;
  if (cpu.avx) return X86VectorLevel::kAvx;
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

// The command this process was started with (/proc/self/cmdline, which holds the
// loader and its options where the program was started through the loader), where it
// ends with argv[0..argc); nullopt where it does not (unreadable, cut short, or changed
// by the loader's --argv0): executed then, the loader could read the program's flags as
// its own.
std::optional<std::vector<std::string>> CommandToRunAgain(int argc, char** argv) {
  std::vector<std::string> command;
  {
    std::ifstream cmdline("/proc/self/cmdline", std::ios::binary);  // closed before the exec
    std::string arg;
    while (std::getline(cmdline, arg, '\0')) command.push_back(arg);
  }
  const std::vector<std::string> args(argv, argv + argc);
  const bool ends_with_args = !args.empty() && command.size() >= args.size() &&
                              std::equal(args.begin(), args.end(),
                                         command.end() - static_cast<std::ptrdiff_t>(args.size()));
  if (!ends_with_args) return std::nullopt;
  return command;
}

// The path /proc/self/exe names: executed by it, the process keeps its name (executed
// as /proc/self/exe, it would be called "exe").
std::string ExecutablePath() {
  std::error_code error;
  const std::string resolved = std::filesystem::read_symlink("/proc/self/exe", error).string();
  // A binary replaced since it started: only the link still reaches it.
  if (error || resolved.empty() || absl::EndsWith(resolved, " (deleted)")) return "/proc/self/exe";
  return resolved;
}

}  // namespace

absl::Status MaybeRestartWithBetterBlasKernels(int argc, char** argv,
                                               absl::string_view chosen_core) {
  if (std::getenv(kCoreTypeVariable) != nullptr) return absl::OkStatus();  // the user's, or ours
  const std::optional<std::string> better = OpenBlasCoreToForce(chosen_core, HostVectorLevel());
  if (!better.has_value()) return absl::OkStatus();
  const std::string chosen(chosen_core);
  const std::string slower =
      absl::StrCat("computing with OpenBLAS's ", chosen, " kernels, which do not use this CPU's ",
                   LevelName(HostVectorLevel()));
  std::optional<std::vector<std::string>> command = CommandToRunAgain(argc, argv);
  if (!command.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "could not read this worker's command line (/proc/self/cmdline) to run it again with "
        "OPENBLAS_CORETYPE=",
        *better, "; ", slower));
  }
  const std::string executable = ExecutablePath();
  std::vector<char*> command_argv;
  for (std::string& arg : *command) command_argv.push_back(arg.data());
  command_argv.push_back(nullptr);
  if (setenv(kCoreTypeVariable, better->c_str(), 1) != 0 ||
      setenv(kOwnChoiceVariable, chosen.c_str(), 1) != 0) {
    unsetenv(kCoreTypeVariable);
    unsetenv(kOwnChoiceVariable);
    return absl::InternalError(
        absl::StrCat("could not set the environment to run again with OPENBLAS_CORETYPE=", *better,
                     "; ", slower));
  }
  execv(executable.c_str(), command_argv.data());
  const int error = errno;  // only on failure
  unsetenv(kCoreTypeVariable);
  unsetenv(kOwnChoiceVariable);
  return absl::UnavailableError(absl::StrCat("could not run again (", executable,
                                             ") with OPENBLAS_CORETYPE=", *better, ": ",
                                             std::strerror(error), "; ", slower));
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
