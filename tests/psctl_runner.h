// Runs the psctl binary against a test cluster's scheduler, for cluster tests.
#ifndef PARAMSERVER_TESTS_PSCTL_RUNNER_H_
#define PARAMSERVER_TESTS_PSCTL_RUNNER_H_

#include <string>
#include <vector>

#include "common/testing/temp_dir.h"

namespace paramserver {

struct Result {
  int code = -1;
  std::string output;  // stdout and stderr
};

// Runs `psctl --scheduler scheduler args...` to its exit (30 s at most; REQUIREs it
// started and exited), logging to a new file in `dir`.
Result Psctl(const TempDir& dir, const std::string& scheduler,
             const std::vector<std::string>& args);

}  // namespace paramserver

#endif  // PARAMSERVER_TESTS_PSCTL_RUNNER_H_
