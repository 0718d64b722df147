#include "worker/blas_kernels.h"

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "catch2/catch.hpp"
#include "common/testing/local_cluster.h"

namespace paramserver {
namespace {

TEST_CASE("a core without AVX is brought up to what the CPU has; any other choice stands") {
  CHECK(OpenBlasCoreToForce("Prescott", X86VectorLevel::kAvx512) == "SkylakeX");
  CHECK(OpenBlasCoreToForce("prescott", X86VectorLevel::kAvx2) == "Haswell");
  CHECK(OpenBlasCoreToForce("Nehalem", X86VectorLevel::kAvx) == "Sandybridge");
  CHECK(OpenBlasCoreToForce("Core2", X86VectorLevel::kAvx512) == "SkylakeX");
  CHECK(OpenBlasCoreToForce("Opteron(SSE3)", X86VectorLevel::kAvx2) == "Haswell");
  CHECK(OpenBlasCoreToForce("Unknown", X86VectorLevel::kAvx2) == "Haswell");
  // A CPU without AVX keeps whatever OpenBLAS picked for it.
  CHECK_FALSE(OpenBlasCoreToForce("Prescott", X86VectorLevel::kNone).has_value());
  // A choice with AVX is OpenBLAS's knowledge of the CPU, even below what the CPU has
  // (AMD's Zen 4 has AVX-512, and OpenBLAS 0.3.21 runs its Zen kernels there).
  for (const char* known : {"Sandybridge", "Haswell", "Zen", "SkylakeX", "Cooperlake",
                            "SapphireRapids", "Excavator"}) {
    INFO(known);
    CHECK_FALSE(OpenBlasCoreToForce(known, X86VectorLevel::kAvx512).has_value());
  }
}

// Runs the probe under `environment` (a prefix for the shell: "env -u X" or "X=Y") and
// returns its lines, each key=value, with the pids in order.
struct ProbeRun {
  std::map<std::string, std::string> facts;
  std::vector<std::string> pids;
};
ProbeRun RunProbe(const std::string& environment, const std::string& flags = "") {
  const std::string command =
      absl::StrCat(environment, " '", RunfilePath("worker/blas_kernels_probe"), "' ", flags);
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string out;
  char buffer[512];
  while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) out += buffer;
  REQUIRE(pclose(pipe) == 0);
  ProbeRun run;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits('=', 1));
    if (kv.first == "pid") run.pids.push_back(kv.second);
    run.facts[kv.first] = kv.second;
  }
  return run;
}

TEST_CASE(
    "ps_worker's start runs itself again with the kernels its CPU can use where OpenBLAS did "
    "not know the CPU, and leaves a user's OPENBLAS_CORETYPE alone") {
  const ProbeRun plain = RunProbe("env -u OPENBLAS_CORETYPE", "--no_restart");
  const std::string own = plain.facts.at("own_choice");
  CHECK(plain.facts.at("core") == own);
  const std::string to_force = plain.facts.at("to_force");
  INFO("OpenBLAS's own choice on this machine: " << own << "; to force: " << to_force);

  const ProbeRun started = RunProbe("env -u OPENBLAS_CORETYPE");
  if (to_force == "none") {
    CHECK(started.pids.size() == 1);  // no restart
    CHECK(started.facts.at("core") == own);
    CHECK(started.facts.at("description") == absl::StrCat("OpenBLAS's ", own, " kernels"));
  } else {
    REQUIRE(started.pids.size() == 2);
    CHECK(started.pids[0] == started.pids[1]);  // the same process, run again
    CHECK(started.facts.at("core") == to_force);
    CHECK(started.facts.at("description").find(absl::StrCat("OpenBLAS's ", to_force,
                                                            " kernels (OpenBLAS chose ", own,
                                                            ", which lacks this CPU's ")) == 0);
  }

  // A user's choice stands, even a core below what the CPU has.
  const ProbeRun chosen = RunProbe("OPENBLAS_CORETYPE=Prescott");
  CHECK(chosen.pids.size() == 1);
  CHECK(chosen.facts.count("own_choice") == 0);
  CHECK(chosen.facts.at("core") == "Prescott");
  CHECK(chosen.facts.at("description") == "OpenBLAS's Prescott kernels (OPENBLAS_CORETYPE=Prescott)");
}

}  // namespace
}  // namespace paramserver
