// For worker/blas_kernels_test, and bench/run.sh (which runs every process of the bench,
// the peers' PyTorch included, on the core it prints): does what ps_worker's main does
// about OpenBLAS's kernels, then prints one line a fact:
//   pid=N                once per run of main (twice, with one pid, after a restart)
//   comm=NAME            the process's name (/proc/self/comm), once per run
//   args=A|B|...         its arguments after argv[0], once per run
//   own_choice=CORE      OpenBLAS's pick in the first run (or the pretended one)
//   to_force=CORE|none   what OpenBlasCoreToForce makes of it on this CPU
//   core=CORE            the kernels this process computes with in the end
//   restarted=0|1        TakeBlasKernelsRestartNote()
//   description=...      BlasKernelsDescription()
//   coretype_after=...   OPENBLAS_CORETYPE once the note is taken (unset: "unset")
// --no_restart leaves out the restart; --pretend_openblas_chose=CORE restarts as if
// OpenBLAS had chosen CORE (to exercise the restart on a CPU OpenBLAS knows).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "worker/blas_kernels.h"

int main(int argc, char** argv) {
  std::string comm;
  std::getline(std::ifstream("/proc/self/comm"), comm);
  std::string args;
  for (int i = 1; i < argc; ++i) args += std::string(i > 1 ? "|" : "") + argv[i];
  std::printf("pid=%d\ncomm=%s\nargs=%s\n", static_cast<int>(getpid()), comm.c_str(), args.c_str());
  bool restart = true;
  std::string chosen = paramserver::OpenBlasCore();
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--no_restart") == 0) restart = false;
    constexpr char kPretend[] = "--pretend_openblas_chose=";
    if (std::strncmp(argv[i], kPretend, sizeof(kPretend) - 1) == 0)
      chosen = argv[i] + sizeof(kPretend) - 1;
  }
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr) {
    const std::optional<std::string> to_force =
        paramserver::OpenBlasCoreToForce(chosen, paramserver::HostVectorLevel());
    std::printf("own_choice=%s\nto_force=%s\n", chosen.c_str(),
                to_force.has_value() ? to_force->c_str() : "none");
  }
  std::fflush(stdout);  // before a restart replaces this process's buffers
  if (restart) {
    const absl::Status restarted =
        paramserver::MaybeRestartWithBetterBlasKernels(argc, argv, chosen);
    if (!restarted.ok()) std::printf("restart_error=%s\n", restarted.ToString().c_str());
  }
  const bool restarted = paramserver::TakeBlasKernelsRestartNote();
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  std::printf("core=%s\nrestarted=%d\ndescription=%s\ncoretype_after=%s\n",
              paramserver::OpenBlasCore().c_str(), restarted ? 1 : 0,
              paramserver::BlasKernelsDescription().c_str(),
              coretype != nullptr ? coretype : "unset");
  return 0;
}
