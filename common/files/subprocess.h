// Running a helper program (the AWS CLI) to completion: its arguments, what to feed its
// standard input, and a deadline after which it is killed. Used where a maintained tool
// does the work better than code of ours would (common/files/s3_file_system).
#ifndef PARAMSERVER_COMMON_FILES_SUBPROCESS_H_
#define PARAMSERVER_COMMON_FILES_SUBPROCESS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace paramserver {

struct CommandResult {
  int exit_code = -1;  // the program's exit status; 128 + N if killed by signal N
  std::string standard_output;
  std::string standard_error;
};

// Runs argv[0] (looked up on PATH) with `argv`, writes `input` to its standard input
// (then closes it) and collects both outputs, concurrently (no pipe can fill and stall
// it). Past `timeout` the program is killed (SIGKILL) and DEADLINE_EXCEEDED returned,
// naming the command. UNAVAILABLE if it cannot be started (e.g. not installed). A
// program that runs and fails is not an error here: see exit_code.
absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv,
                                         absl::string_view input, absl::Duration timeout);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_FILES_SUBPROCESS_H_
