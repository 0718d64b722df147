// The release, run for real: the tarball from deploy/package.sh installs into an empty
// prefix and its binaries run, its systemd units verify, and the EC2 launcher it carries
// runs from there. The launcher's calls are tested in tests/ec2_launch_test.py.
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
  // A setting only the model shows wrong is refused there too, before any daemon starts:
  // a parameter group's pattern that names no tensor of the MLP.
  {
    std::ofstream spec(dir.File("groups.yaml"));
    spec << "cluster: {scheduler: '127.0.0.1:0'}\n"
         << "training:\n  optimizer: {type: adamw, groups: [{params: ['*.bias', '*norm*'], "
            "weight_decay: 0.0}]}\n";
  }
  Result groups = Shell(dir, absl::StrCat("'", prefix, "/bin/ps_scheduler' --describe --config '",
                                          dir.File("groups.yaml"), "'"));
  CHECK(groups.code == 2);
  CHECK(groups.output ==
        "ps_scheduler: training.optimizer.groups: group 0's pattern '*norm*' matches no tensor "
        "of the model (its tensors: fc1.weight, fc1.bias, fc2.weight, fc2.bias)\n");
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
  // A model.type torch job: the installed ps_worker runs worker.command in the spec's
  // folder, with the installed Python package first on PYTHONPATH and the spec's path.
  REQUIRE(Shell(dir, absl::StrCat("mkdir -p '", dir.File("job"), "'")).code == 0);
  {
    std::ofstream spec(dir.File("job/job.yaml"));
    spec << "cluster: {scheduler: '127.0.0.1:1'}\nmodel: {type: torch}\n"
         << "worker: {command: [/bin/sh, -c, 'echo $(pwd) $PARAMSERVER_CONFIG $PYTHONPATH']}\n";
  }
  Result script = Shell(
      dir, absl::StrCat("'", prefix, "/bin/ps_worker' --config '", dir.File("job/job.yaml"), "'"));
  INFO(script.output);
  CHECK(script.code == 0);
  CHECK(script.output ==
        absl::StrCat(dir.File("job"), " ", dir.File("job/job.yaml"), " ", prefix, "/python\n"));
  CHECK(Shell(dir, absl::StrCat("test -s '", prefix, "/python/paramserver/_native.so'")).code == 0);
  CHECK(Shell(dir, absl::StrCat("grep -q '^ExecStart=", prefix, "/bin/ps_server ' '", prefix,
                                "/lib/systemd/system/ps-server.service'"))
            .code == 0);
  // The EC2 boot script and the launcher travel with the release; the launcher finds its
  // modules (launch_cli.py, launch_documents.py, launch_up.py, aws_clients.py,
  // cluster_spec.py) beside it: `policy` imports every one of them.
  CHECK(Shell(dir, absl::StrCat("test -x '", prefix, "/share/paramserver/ps-bootstrap.sh'")).code ==
        0);
  Result launcher = Shell(dir, absl::StrCat("'", prefix, "/share/paramserver/launch.py' policy ",
                                            "--name demo --region eu-west-1 --account 1 --spec '",
                                            prefix, "/etc/ps/cluster.yaml'"));
  INFO(launcher.output);
  CHECK(launcher.code == 0);
  CHECK(launcher.output.find("arn:aws:ssm:eu-west-1:1:parameter/paramserver/demo/*") !=
        std::string::npos);
  Result version = Shell(dir, absl::StrCat("cat '", prefix, "/VERSION'"));
  CHECK(version.output.find("built ") != std::string::npos);
  // systemd's own checker, on the installed units (the user `ps` is made on the instance).
  Result verified = Shell(
      dir, absl::StrCat("cd '", prefix, "/lib/systemd/system' && systemd-analyze verify ",
                        "ps-scheduler.service ps-server.service ps-worker.service ",
                        "ps-journal-export.service 2>&1 | ",
                        "grep -v -e \"Failed to resolve user 'ps'\" -e 'Failed to resolve group' ",
                        "-e '^$' || true"));
  INFO(verified.output);
  CHECK(verified.output.empty());
}

}  // namespace
}  // namespace paramserver
