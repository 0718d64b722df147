// Which of OpenBLAS's kernels a CPU worker computes with, and a restart that mends the
// choice where OpenBLAS gets it wrong.
//
// Debian 12's OpenBLAS (0.3.21, built with DYNAMIC_ARCH) picks its kernels as it loads,
// by the CPU's vendor, family and model number. On a model newer than it knows (Intel
// family 6 model 207, Emerald Rapids, as cloud VMs present it) it falls back to its
// oldest x86-64 kernels, Prescott's (SSE3), whatever the CPU can do: the worker's
// backend then computes a step 3.5x slower than with its SkylakeX (AVX-512) kernels on
// the same CPU (docs/PERFORMANCE.md, "OpenBLAS's kernels"). OpenBLAS reads
// OPENBLAS_CORETYPE only as it loads, before main(), so the worker sets it and runs
// itself again.
#ifndef PARAMSERVER_WORKER_BLAS_KERNELS_H_
#define PARAMSERVER_WORKER_BLAS_KERNELS_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace paramserver {

// The widest vector instructions OpenBLAS's x86-64 kernels use that this CPU (and its
// operating system, which must save the registers) supports.
enum class X86VectorLevel {
  kNone,    // below AVX, or not x86-64
  kAvx,     // OpenBLAS's Sandybridge kernels
  kAvx2,    // with FMA: its Haswell kernels
  kAvx512,  // F, CD, BW, DQ and VL: its SkylakeX kernels
};

X86VectorLevel HostVectorLevel();

// The OPENBLAS_CORETYPE that brings OpenBLAS's kernels up to `level` where it chose
// `chosen_core` (openblas_get_corename(), any case) from among its cores without AVX,
// which is what it falls back to on a CPU it does not know: "SkylakeX", "Haswell" or
// "Sandybridge". nullopt where its choice already uses AVX or better (its choice for a
// CPU it knows stands, even below `level`), or `level` is kNone.
std::optional<std::string> OpenBlasCoreToForce(absl::string_view chosen_core, X86VectorLevel level);

// The core OpenBLAS runs this process's kernels for (openblas_get_corename()).
std::string OpenBlasCore();

// The first thing ps_worker's main does: where OPENBLAS_CORETYPE is unset (a user's
// setting always stands) and OpenBlasCoreToForce names a core for `chosen_core` on this
// CPU, sets OPENBLAS_CORETYPE to it, notes `chosen_core` for TakeBlasKernelsRestartNote,
// and executes the same command again: /proc/self/exe, by its path (the process keeps
// its name), with /proc/self/cmdline (a worker started through the dynamic loader,
// `ld-linux-x86-64.so.2 --library-path DIRS ps_worker ...`, is started through it
// again), which must end with `argv`. The same process, pid and open files. Returns OK
// where there is nothing to change; an error where it could not restart (the command
// line unreadable or not ending with `argv`, the exec failed; nothing changed): the
// worker goes on with OpenBLAS's choice. `chosen_core` is
// OpenBlasCore() but for the tests, which give another to exercise the restart on a
// CPU OpenBLAS knows.
absl::Status MaybeRestartWithBetterBlasKernels(int argc, char** argv,
                                               absl::string_view chosen_core);

// Right after MaybeRestartWithBetterBlasKernels, before any thread of ours starts (the
// variables are read by nothing but OpenBLAS as it loads): in a process
// a restart started, takes the variables it set out of the environment (OpenBLAS has
// read its own), so that nothing this worker starts (a torch job's script, whose
// PyTorch uses the same OpenBLAS) inherits them, and keeps OpenBLAS's own choice for
// BlasKernelsDescription. Returns whether a restart started this process.
bool TakeBlasKernelsRestartNote();

// The kernels this process computes with, for the worker's log: "OpenBLAS's SkylakeX
// kernels", and after a restart "... (OpenBLAS chose its Prescott kernels, which lack
// this CPU's AVX-512: it does not know this CPU; set OPENBLAS_CORETYPE to choose)".
std::string BlasKernelsDescription();

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_BLAS_KERNELS_H_
