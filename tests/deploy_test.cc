// The release and the EC2 launcher, run for real against stand-ins: the tarball from
// deploy/package.sh installs into an empty prefix and its binaries run, its systemd units
// verify, and deploy/ec2/launch.sh makes the right AWS CLI calls for 2 servers and 4
// workers, both as a dry run and against a stand-in `aws` that records its arguments.
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "catch2/catch.hpp"
#include "common/testing/local_cluster.h"
#include "common/testing/temp_dir.h"

namespace paramserver {
namespace {

struct Result {
  int code = -1;
  std::string output;
};

// Runs a shell command line; returns its exit code and its stdout and stderr.
Result Shell(const TempDir& dir, const std::string& command) {
  static int runs = 0;
  const std::string out = dir.File(absl::StrCat("shell-", ++runs, ".out"));
  const int status = std::system(absl::StrCat("(", command, ") > '", out, "' 2>&1").c_str());
  std::ifstream in(out);
  std::stringstream text;
  text << in.rdbuf();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, text.str()};
}

std::string Root() { return RunfilePath(""); }

TEST_CASE(
    "the release tarball installs into an empty prefix; its binaries run and its units verify") {
  TempDir dir;
  Result packaged = Shell(dir, absl::StrCat("'", Root(), "/deploy/package.sh' --bin-dir '", Root(),
                                            "' --out '", dir.File("out"), "'"));
  INFO(packaged.output);
  REQUIRE(packaged.code == 0);
  const std::string tarball = packaged.output.substr(0, packaged.output.find('\n'));
  CHECK(tarball.find(dir.File("out") + "/paramserver-") == 0);
  Result unpacked = Shell(
      dir, absl::StrCat("mkdir -p '", dir.File("unpacked"), "' && tar -xzf '", tarball, "' -C '",
                        dir.File("unpacked"), "' --strip-components=1 && '", dir.File("unpacked"),
                        "/install.sh' --prefix '", dir.File("prefix"), "'"));
  INFO(unpacked.output);
  REQUIRE(unpacked.code == 0);
  const std::string prefix = dir.File("prefix");
  Result describe = Shell(dir, absl::StrCat("'", prefix, "/bin/ps_scheduler' --describe --config '",
                                            prefix, "/etc/ps/cluster.yaml'"));
  CHECK(describe.code == 0);
  CHECK(describe.output == "scheduler=127.0.0.1:0 servers=2 workers=2 failure_timeout_ms=3000\n");
  for (const char* binary : {"ps_server", "ps_worker"}) {
    // They start, read their flags and refuse a missing config with one line.
    Result absent = Shell(dir, absl::StrCat("'", prefix, "/bin/", binary, "' --config '",
                                            dir.File("absent.yaml"), "'"));
    INFO(binary << ": " << absent.output);
    CHECK(absent.code == 2);
    CHECK(absent.output ==
          absl::StrCat(binary, ": ", dir.File("absent.yaml"), ": cannot read the cluster spec\n"));
  }
  CHECK(Shell(dir, absl::StrCat("'", prefix, "/bin/psctl' --help")).code == 0);
  CHECK(Shell(dir, absl::StrCat("grep -q '^ExecStart=", prefix, "/bin/ps_server ' '", prefix,
                                "/lib/systemd/system/ps-server.service'"))
            .code == 0);
  Result version = Shell(dir, absl::StrCat("cat '", prefix, "/VERSION'"));
  CHECK(version.output.find("built ") != std::string::npos);
  // systemd's own checker, on the installed units (the user `ps` is made on the instance).
  Result verified = Shell(
      dir, absl::StrCat("cd '", prefix, "/lib/systemd/system' && systemd-analyze verify ",
                        "ps-scheduler.service ps-server.service ps-worker.service 2>&1 | ",
                        "grep -v -e \"Failed to resolve user 'ps'\" -e 'Failed to resolve group' ",
                        "-e '^$' || true"));
  INFO(verified.output);
  CHECK(verified.output.empty());
}

const char kSpec[] =
    "cluster:\n  scheduler: 127.0.0.1:7000\n  servers: 2\n  workers: 4\ntraining:\n  mode: sync\n";

std::string LaunchUp(const TempDir& dir, const std::string& extra) {
  return absl::StrCat(
      "'", Root(), "/deploy/ec2/launch.sh' up --spec '", dir.File("spec.yaml"),
      "' --name demo --ami ami-123 --vpc vpc-9 --subnet subnet-7 --instance-profile ps-node ",
      "--release-url https://releases.example/ps.tar.gz --work '", dir.File("work"), "' ", extra);
}

int Count(const std::string& text, const std::string& what) {
  int count = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++count;
  return count;
}

TEST_CASE("launch.sh --dry-run prints the AWS CLI calls for 2 servers and 4 workers") {
  TempDir dir;
  dir.WriteFile("spec.yaml", kSpec);
  Result dry = Shell(dir, LaunchUp(dir, "--dry-run --spot-workers"));
  INFO(dry.output);
  REQUIRE(dry.code == 0);
  CHECK(dry.output.find("aws ec2 create-security-group --group-name ps-demo") != std::string::npos);
  CHECK(dry.output.find("UserIdGroupPairs=\\[\\{GroupId=sg-DRYRUN\\}\\]") != std::string::npos);
  CHECK(Count(dry.output, "aws ec2 run-instances") == 3);
  CHECK(dry.output.find("--instance-type t3.medium --count 1") != std::string::npos);
  CHECK(dry.output.find("--instance-type r6i.xlarge --count 2") != std::string::npos);
  CHECK(dry.output.find("--instance-type g5.xlarge --count 4") != std::string::npos);
  CHECK(Count(dry.output, "Key=Role\\,Value=worker") == 1);
  CHECK(dry.output.find("MarketType=spot") != std::string::npos);
  CHECK(dry.output.find("--iam-instance-profile Name=ps-node") != std::string::npos);
  CHECK(dry.output.find("HttpTokens=required") != std::string::npos);  // IMDSv2 only
  // A fresh cluster token, stored encrypted in SSM from a file (not on a command line),
  // read by each instance at boot into a file only root and ps can read.
  CHECK(dry.output.find(
            "aws ssm put-parameter --name /paramserver/demo/cluster-token --type SecureString "
            "--overwrite --value file://") != std::string::npos);
  for (const char* role : {"scheduler", "server", "worker"}) {
    const std::string user_data = dir.File(absl::StrCat("work/user-data-", role, ".yaml"));
    CHECK(Shell(dir,
                "grep -q \"aws ssm get-parameter  --with-decryption --name "
                "'/paramserver/demo/cluster-token'\" '" +
                    user_data + "'")
              .code == 0);
    CHECK(Shell(dir, "grep -q 'chmod 0640 /etc/ps/cluster.token' '" + user_data + "'").code == 0);
  }
  CHECK(Shell(dir, "ls '" + dir.File("work") + "' | grep -q cluster.token").code !=
        0);  // not left behind
  // The servers' user data names the scheduler's private address (a placeholder here).
  Result server_spec =
      Shell(dir, absl::StrCat("grep 'content:' '", dir.File("work/user-data-server.yaml"),
                              "' | awk '{print $2}' | base64 -d"));
  CHECK(server_spec.output.find("  scheduler: 10.0.0.10:7000\n  servers: 2\n  workers: 4\n") !=
        std::string::npos);
  Result down =
      Shell(dir, absl::StrCat("'", Root(), "/deploy/ec2/launch.sh' down --name demo --dry-run"));
  CHECK(down.output.find("aws ec2 terminate-instances --instance-ids i-DRYRUN1 i-DRYRUN2") !=
        std::string::npos);
  CHECK(down.output.find("aws ec2 delete-security-group --group-id sg-DRYRUN") !=
        std::string::npos);
  CHECK(down.output.find("aws ssm delete-parameter --name /paramserver/demo/cluster-token") !=
        std::string::npos);
}

TEST_CASE("launch.sh against a stand-in aws: the calls, their order, and the teardown") {
  TempDir dir;
  dir.WriteFile("spec.yaml", kSpec);
  // The stand-in records every call (one line each) and answers what launch.sh reads.
  REQUIRE(Shell(dir, "mkdir -p '" + dir.File("bin") + "'").code == 0);
  const std::string fake = dir.WriteFile("bin/aws", absl::StrCat(R"(#!/bin/sh
echo "$*" >> ')",
                                                                 dir.File("aws-calls.log"), R"('
case "$*" in
  *create-security-group*) echo sg-0abc ;;
  *"Value=scheduler"*) echo 10.1.2.3 ;;
  *"Value=server"*) echo i-s1 i-s2 ;;
  *"Value=worker"*) echo i-w1 i-w2 i-w3 i-w4 ;;
  *describe-instances*) echo i-s1 i-s2 i-w1 ;;
  *describe-security-groups*) echo sg-0abc ;;
esac
)"));
  REQUIRE(Shell(dir, "chmod +x '" + fake + "'").code == 0);
  const std::string path = absl::StrCat("PATH='", dir.File("bin"), "':\"$PATH\" ");
  Result up = Shell(dir, path + LaunchUp(dir, "--region eu-west-1"));
  INFO(up.output);
  REQUIRE(up.code == 0);
  CHECK(up.output.find("scheduler       1 x t3.medium at 10.1.2.3:7000") != std::string::npos);
  CHECK(up.output.find("workers         4 x g5.xlarge: i-w1 i-w2 i-w3 i-w4") != std::string::npos);
  Result calls = Shell(dir, "cat '" + dir.File("aws-calls.log") + "'");
  INFO(calls.output);
  const std::vector<std::string> expected_order = {
      "ssm put-parameter", "create-security-group", "authorize-security-group-ingress",
      "Value=scheduler",   "Value=server",          "Value=worker"};
  size_t at = 0;
  for (const std::string& call : expected_order) {
    const size_t found = calls.output.find(call, at);
    CHECK(found != std::string::npos);
    at = found == std::string::npos ? at : found;
  }
  CHECK(Count(calls.output, "--region eu-west-1") == 6);
  // The user data reads the token in the launch's region.
  CHECK(Shell(dir, "grep -q 'aws ssm get-parameter --region eu-west-1 --with-decryption' '" +
                       dir.File("work/user-data-server.yaml") + "'")
            .code == 0);
  CHECK(calls.output.find("--security-group-ids sg-0abc") != std::string::npos);
  Result worker_spec =
      Shell(dir, absl::StrCat("grep 'content:' '", dir.File("work/user-data-worker.yaml"),
                              "' | awk '{print $2}' | base64 -d"));
  CHECK(worker_spec.output.find("  scheduler: 10.1.2.3:7000\n") != std::string::npos);
  CHECK(Shell(dir, "grep -q 'ps-worker.service' '" + dir.File("work/user-data-worker.yaml") + "'")
            .code == 0);

  Result down =
      Shell(dir, path + absl::StrCat("'", Root(), "/deploy/ec2/launch.sh' down --name demo"));
  INFO(down.output);
  CHECK(down.code == 0);
  Result all = Shell(dir, "cat '" + dir.File("aws-calls.log") + "'");
  CHECK(all.output.find("ec2 terminate-instances --instance-ids i-s1 i-s2 i-w1") !=
        std::string::npos);
  CHECK(all.output.find("ec2 wait instance-terminated --instance-ids i-s1 i-s2 i-w1") !=
        std::string::npos);
  CHECK(all.output.find("ec2 delete-security-group --group-id sg-0abc") != std::string::npos);
  CHECK(all.output.find("ssm delete-parameter --name /paramserver/demo/cluster-token") !=
        std::string::npos);
  // Refusals name what is missing.
  Result incomplete =
      Shell(dir, absl::StrCat("'", Root(), "/deploy/ec2/launch.sh' up --name demo --spec '",
                              dir.File("spec.yaml"), "'"));
  CHECK(incomplete.code == 2);
  CHECK(incomplete.output == "launch.sh: --ami is required\n");
}

}  // namespace
}  // namespace paramserver
