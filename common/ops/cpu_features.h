// Which x86 instruction-set extensions this process may use for its per-CPU code paths
// (the Adam kernel's clones, the F16C float16 conversion, the worker's choice of
// OpenBLAS's kernels).
#ifndef PARAMSERVER_COMMON_OPS_CPU_FEATURES_H_
#define PARAMSERVER_COMMON_OPS_CPU_FEATURES_H_

namespace paramserver {

struct CpuFeatures {
  bool avx = false;
  bool avx2 = false;
  bool avx512f = false;
  bool f16c = false;
  bool fma = false;
  // AVX-512's further parts, which OpenBLAS's SkylakeX kernels also use.
  bool avx512cd = false;
  bool avx512bw = false;
  bool avx512dq = false;
  bool avx512vl = false;
};

// What the CPU has; all false when the environment sets PS_CPU_BASELINE=1, which forces
// the x86-64 baseline paths, so that a machine with AVX2 tests what a CPU without it
// runs (tests/run.sh does, once). Read at each call: cheap (the CPU is probed once).
CpuFeatures UsableCpuFeatures();

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_OPS_CPU_FEATURES_H_
