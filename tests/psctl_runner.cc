#include "tests/psctl_runner.h"

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/testing/local_cluster.h"

namespace paramserver {

Result Psctl(const TempDir& dir, const std::string& scheduler,
             const std::vector<std::string>& args) {
  static int runs = 0;
  std::vector<std::string> argv = {RunfilePath("psctl/psctl"), "--scheduler", scheduler};
  argv.insert(argv.end(), args.begin(), args.end());
  absl::StatusOr<ChildProcess> child =
      ChildProcess::Start(argv, dir.File(absl::StrCat("psctl-", ++runs, ".log")));
  REQUIRE(child.ok());
  absl::StatusOr<int> code = child->WaitForExit(absl::Now() + absl::Seconds(30));
  REQUIRE(code.ok());
  return {*code, child->ReadLog()};
}

}  // namespace paramserver
