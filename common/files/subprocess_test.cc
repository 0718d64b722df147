#include "common/files/subprocess.h"

#include <csignal>
#include <string>

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

TEST_CASE("a command's outputs and exit status come back; its input is fed to it") {
  absl::StatusOr<CommandResult> echoed =
      RunCommand({"sh", "-c", "cat; echo oops >&2; exit 3"}, "hello\n", absl::Seconds(10));
  REQUIRE(echoed.ok());
  CHECK(echoed->exit_code == 3);
  CHECK(echoed->standard_output == "hello\n");
  CHECK(echoed->standard_error == "oops\n");
}

TEST_CASE("large inputs and outputs flow at once without stalling on a full pipe") {
  const std::string big(4 << 20, 'x');  // far beyond a pipe's 64 KiB
  absl::StatusOr<CommandResult> copied = RunCommand({"cat"}, big, absl::Seconds(30));
  REQUIRE(copied.ok());
  CHECK(copied->exit_code == 0);
  CHECK(copied->standard_output == big);
}

TEST_CASE("a command that exits before reading its input does not kill the caller") {
  // More than a pipe holds, so that a write comes after the reader is gone: EPIPE, and
  // without care a SIGPIPE that ends this process.
  const std::string big(4 << 20, 'x');
  absl::StatusOr<CommandResult> refused =
      RunCommand({"sh", "-c", "echo no such bucket >&2; exit 1"}, big, absl::Seconds(30));
  REQUIRE(refused.ok());
  CHECK(refused->exit_code == 1);
  CHECK(refused->standard_error == "no such bucket\n");
  // Nothing was left pending to end the process later either.
  sigset_t pending;
  sigpending(&pending);
  CHECK(sigismember(&pending, SIGPIPE) == 0);
}

TEST_CASE("a command past its deadline is killed; a missing one is UNAVAILABLE") {
  absl::StatusOr<CommandResult> slow = RunCommand({"sleep", "30"}, "", absl::Milliseconds(200));
  CHECK(slow.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(std::string(slow.status().message()).find("sleep 30 did not finish within 200ms") == 0);
  absl::StatusOr<CommandResult> missing =
      RunCommand({"no-such-program-here"}, "", absl::Seconds(5));
  CHECK(missing.status().code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(missing.status().message()).find("is it installed and on PATH?") !=
        std::string::npos);
}

}  // namespace
}  // namespace paramserver
