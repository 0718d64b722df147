#include "common/ops/cpu_features.h"

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace paramserver {
namespace {

CpuFeatures ProbeCpu() {
  CpuFeatures features;
#if defined(__x86_64__)
  __builtin_cpu_init();
  features.avx = __builtin_cpu_supports("avx");
  features.avx2 = __builtin_cpu_supports("avx2");
  features.avx512f = __builtin_cpu_supports("avx512f");
  features.fma = __builtin_cpu_supports("fma");
  features.avx512cd = __builtin_cpu_supports("avx512cd");
  features.avx512bw = __builtin_cpu_supports("avx512bw");
  features.avx512dq = __builtin_cpu_supports("avx512dq");
  features.avx512vl = __builtin_cpu_supports("avx512vl");
  unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
  features.f16c =
      features.avx && __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
#endif
  return features;
}

}  // namespace

CpuFeatures UsableCpuFeatures() {
  static const CpuFeatures probed = ProbeCpu();
  const char* baseline = std::getenv("PS_CPU_BASELINE");
  if (baseline != nullptr && std::strcmp(baseline, "1") == 0) return CpuFeatures{};
  return probed;
}

}  // namespace paramserver
