// For worker/blas_kernels_test, and bench/run.sh (which runs every process of the bench,
// the peers' PyTorch included, on the core it prints last): does what ps_worker's main does about OpenBLAS's kernels
// (MaybeRestartWithBetterBlasKernels), then prints one line a fact:
//   pid=N                once per run of main (twice, with one pid, after a restart)
//   own_choice=CORE      OpenBLAS's own pick in the first run
//   to_force=CORE|none   what OpenBlasCoreToForce makes of it on this CPU
//   core=CORE            the kernels this process computes with in the end
//   description=...      BlasKernelsDescription()
// --no_restart leaves out the restart.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "worker/blas_kernels.h"

int main(int argc, char** argv) {
  std::printf("pid=%d\n", static_cast<int>(getpid()));
  std::fflush(stdout);  // before a restart replaces this process's buffers
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr) {
    const std::string own = paramserver::OpenBlasCore();
    const std::optional<std::string> to_force =
        paramserver::OpenBlasCoreToForce(own, paramserver::HostVectorLevel());
    std::printf("own_choice=%s\nto_force=%s\n", own.c_str(),
                to_force.has_value() ? to_force->c_str() : "none");
    std::fflush(stdout);
  }
  if (argc < 2 || std::strcmp(argv[1], "--no_restart") != 0) {
    paramserver::MaybeRestartWithBetterBlasKernels(argv);
  }
  std::printf("core=%s\ndescription=%s\n", paramserver::OpenBlasCore().c_str(),
              paramserver::BlasKernelsDescription().c_str());
  return 0;
}
