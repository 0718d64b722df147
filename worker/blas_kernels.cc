#include "worker/blas_kernels.h"

#include <cblas.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace paramserver {
namespace {

constexpr char kCoreTypeVariable[] = "OPENBLAS_CORETYPE";
// Set with kCoreTypeVariable by the restart: the core OpenBLAS chose by itself.
constexpr char kOwnChoiceVariable[] = "PS_WORKER_OPENBLAS_OWN_CHOICE";

// OpenBLAS's x86 cores without AVX (its corename() strings, lower case): where it names
// one of these for a CPU with AVX, it did not know the CPU.
constexpr const char* kCoresWithoutAvx[] = {
    "unknown", "katmai",    "coppermine", "northwood",     "prescott",  "banias",
    "atom",    "core2",     "penryn",     "dunnington",    "nehalem",   "athlon",
    "opteron", "barcelona", "nano",       "opteron(sse3)", "bobcat",
};

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

void MaybeRestartWithBetterBlasKernels(char** argv) {
  if (std::getenv(kCoreTypeVariable) != nullptr) return;  // the user's, or ours already
  const std::string chosen = OpenBlasCore();
  const std::optional<std::string> better = OpenBlasCoreToForce(chosen, HostVectorLevel());
  if (!better.has_value()) return;
  if (setenv(kCoreTypeVariable, better->c_str(), 1) != 0 ||
      setenv(kOwnChoiceVariable, chosen.c_str(), 1) != 0) {
    return;
  }
  execv("/proc/self/exe", argv);
  const int error = errno;  // only on failure
  unsetenv(kCoreTypeVariable);
  unsetenv(kOwnChoiceVariable);
  std::fprintf(stderr,
               "ps_worker: warning: could not run again with OPENBLAS_CORETYPE=%s (%s); computing "
               "with OpenBLAS's %s kernels, which do not use this CPU's %s\n",
               better->c_str(), std::strerror(error), chosen.c_str(),
               LevelName(HostVectorLevel()));
}

std::string BlasKernelsDescription() {
  std::string description = absl::StrCat("OpenBLAS's ", OpenBlasCore(), " kernels");
  if (const char* own_choice = std::getenv(kOwnChoiceVariable); own_choice != nullptr) {
    absl::StrAppend(&description, " (OpenBLAS chose ", own_choice, ", which lacks this CPU's ",
                    LevelName(HostVectorLevel()),
                    ": it does not know this CPU; set OPENBLAS_CORETYPE to choose)");
  } else if (const char* forced = std::getenv(kCoreTypeVariable); forced != nullptr) {
    absl::StrAppend(&description, " (OPENBLAS_CORETYPE=", forced, ")");
  }
  return description;
}

}  // namespace paramserver
