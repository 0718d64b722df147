#include "worker/blas_kernels.h"

#include <unistd.h>

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
  for (const char* known :
       {"Sandybridge", "Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids", "Excavator"}) {
    INFO(known);
    CHECK_FALSE(OpenBlasCoreToForce(known, X86VectorLevel::kAvx512).has_value());
  }
}

// Runs the probe under `environment` (a prefix for the shell: "env -u X", "X=Y", a
// loader) and returns its lines, each key=value (the last of each key), with the pids
// and names in order.
struct ProbeRun {
  std::map<std::string, std::string> facts;
  std::vector<std::string> pids;   // one a run of main
  std::vector<std::string> comms;  // the process's name in each
  std::vector<std::string> args;   // its arguments in each
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
    if (kv.first == "comm") run.comms.push_back(kv.second);
    if (kv.first == "args") run.args.push_back(kv.second);
    run.facts[kv.first] = kv.second;
  }
  return run;
}

TEST_CASE(
    "ps_worker's start runs itself again with the kernels its CPU can use where OpenBLAS did "
    "not know the CPU, and leaves a user's OPENBLAS_CORETYPE alone") {
  const ProbeRun plain = RunProbe("env -u OPENBLAS_CORETYPE", "--no_restart");
  const std::string own = plain.facts.at("own_choice");
  CHECK(plain.facts.at("restarted") == "0");
  CHECK(plain.facts.at("description") == absl::StrCat("OpenBLAS's ", own, " kernels"));
  INFO("OpenBLAS's own choice on this machine: " << own
                                                 << "; to force: " << plain.facts.at("to_force"));

  // As OpenBLAS chooses here, and as if it had not known the CPU (the restart runs on
  // any CPU with AVX, whatever OpenBLAS knows of it).
  // An argument with a space and an empty one must come through the restart as they were.
  const std::string kept_args = "--keep 'two words' ''";
  std::vector<std::string> loaders = {""};
  constexpr char kLoader[] = "/lib64/ld-linux-x86-64.so.2";
  if (access(kLoader, X_OK) == 0)
    loaders.push_back(std::string(kLoader) + " --library-path /none:");
  for (const std::string& flags : {kept_args, kept_args + " --pretend_openblas_chose=Prescott"}) {
    for (const std::string& loader : loaders) {
      // The loader: started through it, as tests/gpu_check.sh runs a bundle's binaries, the
      // probe is run again through it, with its options.
      INFO("flags: '" << flags << "', loader: '" << loader << "'");
      const ProbeRun run = RunProbe("env -u OPENBLAS_CORETYPE " + loader, flags);
      const std::string to_force = run.facts.at("to_force");
      if (flags == kept_args) CHECK(to_force == plain.facts.at("to_force"));
      const std::string expected_args = flags == kept_args
                                            ? "--keep|two words|"
                                            : "--keep|two words||--pretend_openblas_chose=Prescott";
      for (const std::string& args : run.args) CHECK(args == expected_args);
      CHECK(run.facts.count("restart_error") == 0);
      if (to_force == "none") {
        CHECK(run.pids.size() == 1);  // no restart
        CHECK(run.facts.at("core") == own);
        CHECK(run.facts.at("restarted") == "0");
      } else {
        REQUIRE(run.pids.size() == 2);
        CHECK(run.pids[0] == run.pids[1]);    // the same process, run again
        CHECK(run.comms[0] == run.comms[1]);  // under its own name, not "exe"
        CHECK(run.facts.at("core") == to_force);
        CHECK(run.facts.at("restarted") == "1");
        CHECK(run.facts.at("description")
                  .find(absl::StrCat("OpenBLAS's ", to_force, " kernels (OpenBLAS chose its ",
                                     run.facts.at("own_choice"),
                                     " kernels, which lack this CPU's ")) == 0);
        // Taken out of the environment: nothing the worker starts inherits it.
        CHECK(run.facts.at("coretype_after") == "unset");
      }
    }
  }

  // A user's choice stands, even a core below what the CPU has, and stays set.
  const ProbeRun chosen = RunProbe("OPENBLAS_CORETYPE=Prescott", "--pretend_openblas_chose=Core2");
  CHECK(chosen.pids.size() == 1);
  CHECK(chosen.facts.count("own_choice") == 0);
  CHECK(chosen.facts.at("core") == "Prescott");
  CHECK(chosen.facts.at("restarted") == "0");
  CHECK(chosen.facts.at("description") == "OpenBLAS's Prescott kernels");
  CHECK(chosen.facts.at("coretype_after") == "Prescott");
}

}  // namespace
}  // namespace paramserver
