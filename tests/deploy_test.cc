// The release and the EC2 launcher, run for real against stand-ins: the tarball from
// deploy/package.sh installs into an empty prefix and its binaries run, its systemd units
// verify, and deploy/ec2/launch.sh makes the right AWS CLI calls for 2 servers and 4
// workers, both as a dry run and against the stand-in `aws` (tests/stand_ins/aws) that
// records its calls and keeps what they store (SSM parameters, S3 objects).
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
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
  // The EC2 boot script and the launcher travel with the release.
  CHECK(Shell(dir, absl::StrCat("test -x '", prefix, "/share/paramserver/ps-bootstrap.sh'")).code ==
        0);
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

const char kSpec[] =
    "cluster:\n  scheduler: 127.0.0.1:7000\n  servers: 2\n  workers: 4\ntraining:\n  mode: sync\n"
    "checkpoint:\n  dir: s3://ps-ckpt/jobs/demo\noutput:\n  weights: "
    "s3://ps-out/demo/final.safetensors\n";

std::string Launch(const std::string& command_and_options) {
  return absl::StrCat("'", Root(), "/deploy/ec2/launch.sh' ", command_and_options);
}

std::string LaunchUp(const TempDir& dir, const std::string& extra) {
  return Launch(absl::StrCat(
      "up --spec '", dir.File("spec.yaml"),
      "' --name demo --region eu-west-1 --vpc vpc-9 --subnet subnet-a,subnet-b ",
      "--release-url https://releases.example/ps.tar.gz --work '", dir.File("work"), "' ", extra));
}

int Count(const std::string& text, const std::string& what) {
  int count = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++count;
  return count;
}

// The stand-in `aws` (tests/stand_ins/aws) first on PATH, keeping its state in `dir`.
std::string WithStandInAws(const TempDir& dir) {
  const std::string aws = RunfilePath("tests/stand_ins/aws");
  return absl::StrCat("AWS_STANDIN_ROOT='", dir.File("aws"), "' PATH='",
                      aws.substr(0, aws.rfind('/')), "':\"$PATH\" ");
}

// The file inside a rendered user data (gzipped cloud-config) at `path`, decoded.
std::string FileInUserData(const TempDir& dir, const std::string& user_data,
                           const std::string& path) {
  return Shell(dir, absl::StrCat("gunzip -c '", user_data, "' | grep -A3 'path: ", path,
                                 "$' | awk '/content:/ {print $2}' | base64 -d"))
      .output;
}

TEST_CASE("launch.sh --help and every command's --help describe every option") {
  TempDir dir;
  Result help = Shell(dir, Launch("--help"));
  CHECK(help.code == 0);
  for (const char* command : {"up", "down", "scale", "status", "policy"}) {
    CHECK(help.output.find(absl::StrCat("\n  ", command, " ")) != std::string::npos);
  }
  // Every option the parser takes appears in the help of a command that uses it.
  Result options = Shell(dir, "grep -E '^    (-h \\| )?--[a-z-]+( \\| --[a-z-]+)*\\)' '" + Root() +
                                  "/deploy/ec2/launch.sh' | grep -Eo -- '--[a-z-]+' | sort -u");
  REQUIRE(options.output.find("--release-url") != std::string::npos);
  std::string all_help;
  for (const char* command : {"up", "down", "scale", "status", "policy"}) {
    Result one = Shell(dir, Launch(absl::StrCat(command, " --help")));
    INFO(command << ": " << one.output);
    CHECK(one.code == 0);
    CHECK(one.output.rfind(absl::StrCat("usage: launch.sh ", command), 0) == 0);
    all_help += one.output;
  }
  const std::vector<std::string> option_list =
      absl::StrSplit(options.output, '\n', absl::SkipEmpty());
  for (const std::string& option : option_list) {
    if (option == "--help" || option == "--spot-workers" || option == "--worker-type") continue;
    INFO(option);
    CHECK(all_help.find(option) != std::string::npos);
  }
  Result unknown = Shell(dir, Launch("up --no-such-option"));
  CHECK(unknown.code == 2);
  CHECK(unknown.output ==
        "launch.sh up: unknown argument --no-such-option (launch.sh up --help lists them)\n");
}

TEST_CASE("launch.sh up --dry-run prints the calls for a GPU cluster of 2 servers and 4 workers") {
  TempDir dir;
  dir.WriteFile("spec.yaml", kSpec);
  Result dry = Shell(dir, LaunchUp(dir, "--dry-run"));
  INFO(dry.output);
  REQUIRE(dry.code == 0);
  CHECK(Count(dry.output, "aws --region eu-west-1 ssm put-parameter --name /paramserver/demo/") ==
        2);
  CHECK(dry.output.find("aws --region eu-west-1 ec2 create-security-group --group-name ps-demo") !=
        std::string::npos);
  CHECK(Count(dry.output, "ec2 run-instances") == 2);  // the scheduler, the servers
  CHECK(dry.output.find("--instance-type t3.medium --count 1") != std::string::npos);
  CHECK(dry.output.find("--instance-type r6i.xlarge --count 2") != std::string::npos);
  CHECK(dry.output.find("--placement GroupName=ps-demo") != std::string::npos);
  CHECK(dry.output.find("MarketType=spot") == std::string::npos);  // servers are on-demand
  CHECK(dry.output.find("autoscaling create-auto-scaling-group --auto-scaling-group-name "
                        "ps-demo-workers --min-size 4 --max-size 4 --desired-capacity 4") !=
        std::string::npos);
  CHECK(dry.output.find("--capacity-rebalance") != std::string::npos);
  CHECK(Shell(dir, "ls '" + dir.File("work") + "' | grep -q token").code != 0);  // not left behind
  Result down = Shell(dir, Launch("down --name demo --region eu-west-1 --dry-run"));
  CHECK(down.output.find("aws --region eu-west-1 ec2 terminate-instances --instance-ids i-DRYRUN1 "
                         "i-DRYRUN2") != std::string::npos);
}

TEST_CASE(
    "launch.sh up --dry-run with ranges starts at the mins; the workers' group scales to max") {
  TempDir dir;
  std::string spec = kSpec;
  spec.replace(spec.find("servers: 2\n  workers: 4"), 22,
               "servers: {min: 2, max: 5}\n  workers: {min: 2, max: 6}");
  dir.WriteFile("spec.yaml", spec);
  Result dry = Shell(dir, LaunchUp(dir, "--dry-run"));
  INFO(dry.output);
  REQUIRE(dry.code == 0);
  CHECK(dry.output.find("--instance-type r6i.xlarge --count 2") != std::string::npos);
  CHECK(dry.output.find("autoscaling create-auto-scaling-group --auto-scaling-group-name "
                        "ps-demo-workers --min-size 2 --max-size 6 --desired-capacity 2") !=
        std::string::npos);
}

// Checks what `launch.sh up` says it made: the scheduler, the servers, the workers' group.
void CheckUpSummary(const Result& up) {
  CHECK(up.output.find("scheduler       1 x t3.medium (on-demand) at 10.1.2.3:7000") !=
        std::string::npos);
  CHECK(up.output.find("servers         2 x r6i.xlarge (on-demand, placement group ps-demo): "
                       "i-0server1 i-0server2") != std::string::npos);
  CHECK(up.output.find("workers         4 x g5.xlarge or g6.xlarge (spot, group ps-demo-workers, "
                       "capacity rebalancing)") != std::string::npos);
}

// Checks that the recorded AWS calls of `up` come in the order they must.
void CheckUpCallOrder(const std::string& calls) {
  // In order: the secrets, the role, the network, the servers, the workers' group.
  const std::vector<std::string> expected_order = {
      "ssm put-parameter --name /paramserver/demo/cluster-token",
      "ssm put-parameter --name /paramserver/demo/tls-key",
      "iam create-role --role-name ps-demo-node",
      "iam put-role-policy --role-name ps-demo-node",
      "iam add-role-to-instance-profile",
      "ec2 create-security-group",
      "ec2 create-placement-group --group-name ps-demo --strategy cluster",
      "logs create-log-group --log-group-name /paramserver/demo",
      "Value=scheduler",
      "Value=server",
      "ec2 create-launch-template --launch-template-name ps-demo-worker",
      "autoscaling create-auto-scaling-group --auto-scaling-group-name ps-demo-workers"};
  size_t at = 0;
  for (const std::string& call : expected_order) {
    INFO(call);
    const size_t found = calls.find(call, at);
    CHECK(found != std::string::npos);
    at = found == std::string::npos ? at : found;
  }
}

// Checks the secrets `up` stored in SSM, and that none is left in the work folder.
void CheckSecretsInSsm(const TempDir& dir) {
  // The secrets are in SSM (the stand-in's store), made here: 64 hex digits, a CA.
  const std::string stored = dir.File("aws/ssm/%paramserver%demo%");
  CHECK(std::regex_match(Shell(dir, "cat '" + stored + "cluster-token'").output,
                         std::regex("[0-9a-f]{64}")));
  CHECK(Shell(dir, "openssl verify -CAfile '" + stored + "tls-ca' '" + stored + "tls-cert'")
            .output.find(": OK") != std::string::npos);
  CHECK(Shell(dir, "ls '" + dir.File("work") + "' | grep -E -q 'token|tls-|\\.key'").code != 0);
}

// Checks the nodes' role policy `up` wrote: scoped to this cluster's resources.
void CheckRolePolicy(const TempDir& dir) {
  // The role's policy: this cluster's parameters only, KMS through SSM only, the spec's
  // S3 prefixes, its log group.
  const std::string policy = Shell(dir, "cat '" + dir.File("work/policy.json") + "'").output;
  CHECK(Shell(dir, "python3 -m json.tool '" + dir.File("work/policy.json") + "' >/dev/null").code ==
        0);
  CHECK(policy.find("\"Resource\": \"arn:aws:ssm:eu-west-1:123456789012:parameter/paramserver/"
                    "demo/*\"") != std::string::npos);
  CHECK(policy.find("\"kms:ViaService\": \"ssm.eu-west-1.amazonaws.com\"") != std::string::npos);
  CHECK(policy.find("arn:aws:s3:::ps-ckpt/jobs/demo/*") != std::string::npos);
  CHECK(policy.find("arn:aws:s3:::ps-out/demo/*") != std::string::npos);
  CHECK(policy.find("log-group:/paramserver/demo:*") != std::string::npos);
  CHECK(policy.find("\"ssm:GetParameter\",\n     \"Resource\": \"*\"") == std::string::npos);
}

// Checks the workers' group `up` made: spot only, two instance types, both subnets.
void CheckWorkersGroup(const TempDir& dir, const std::string& calls) {
  // The workers' group: spot only, two instance types, from the launch template.
  const std::string mixed =
      Shell(dir, "cat '" + dir.File("work/mixed-instances.json") + "'").output;
  CHECK(mixed.find("\"OnDemandPercentageAboveBaseCapacity\": 0") != std::string::npos);
  CHECK(mixed.find("{\"InstanceType\": \"g5.xlarge\"}, {\"InstanceType\": \"g6.xlarge\"}") !=
        std::string::npos);
  CHECK(calls.find("--vpc-zone-identifier subnet-a,subnet-b --capacity-rebalance") !=
        std::string::npos);
}

// Checks the rendered user data of the workers and the servers, and the launch template.
void CheckUserDataAndLaunchTemplate(const TempDir& dir) {
  // The workers' user data (in the launch template) installs the driver and the runtime,
  // and names the scheduler's private address.
  const std::string worker_data = dir.File("work/user-data-worker.yaml.gz");
  const std::string bootstrap = FileInUserData(dir, worker_data, "/usr/local/sbin/ps-bootstrap");
  CHECK(bootstrap.find("apt-get install -y --no-install-recommends nvidia-open") !=
        std::string::npos);
  CHECK(bootstrap.find("cuda-cudart-13-0 libcublas-13-0") != std::string::npos);
  const std::string env = FileInUserData(dir, worker_data, "/etc/ps/bootstrap.env");
  CHECK(env.find("ROLE=worker\n") != std::string::npos);
  CHECK(env.find("GPU=1\n") != std::string::npos);
  CHECK(env.find("TLS=1\n") != std::string::npos);
  CHECK(env.find("PARAMETERS=/paramserver/demo\n") != std::string::npos);
  CHECK(FileInUserData(dir, worker_data, "/etc/ps/cluster.yaml")
            .find("  scheduler: 10.1.2.3:7000\n") != std::string::npos);
  CHECK(FileInUserData(dir, dir.File("work/user-data-server.yaml.gz"), "/etc/ps/bootstrap.env")
            .find("GPU=0\n") != std::string::npos);
  const int user_data_bytes = std::stoi(Shell(dir, "stat -c %s '" + worker_data + "'").output);
  CHECK(user_data_bytes < 16384);  // EC2's limit on user data
  const std::string launch_template =
      Shell(dir, "cat '" + dir.File("work/launch-template.json") + "'").output;
  CHECK(launch_template.find("\"HttpTokens\": \"required\"") != std::string::npos);
  CHECK(launch_template.find("\"IamInstanceProfile\": {\"Name\": \"ps-demo-node\"}") !=
        std::string::npos);
}

// Checks `launch.sh scale` against the stand-in: it scales within the spec's ranks only.
void CheckScale(const TempDir& dir, const std::string& aws) {
  // scale: within the spec's ranks only.
  Result scaled = Shell(dir, aws + Launch("scale --name demo --region eu-west-1 --workers 2"));
  INFO(scaled.output);
  CHECK(scaled.code == 0);
  CHECK(scaled.output.find("workers 4 -> 2 (of 4 ranks)") != std::string::npos);
  CHECK(Shell(dir,
              "grep -q 'autoscaling update-auto-scaling-group --auto-scaling-group-name "
              "ps-demo-workers --min-size 2 --desired-capacity 2' '" +
                  dir.File("aws/calls.log") + "'")
            .code == 0);
  Result too_many = Shell(dir, aws + Launch("scale --name demo --region eu-west-1 --workers 5"));
  CHECK(too_many.code == 2);
  CHECK(too_many.output.find("the spec has 4 worker ranks (cluster.workers, a range's max)") !=
        std::string::npos);

  // --servers: more starts instances like the running ones, with their user data.
  dir.WriteFile("aws/instances.txt",
                "i-0scheduler\tscheduler\tt3.medium\ton-demand\trunning\t10.1.2.3\n"
                "i-0s1\tserver\tc6i.large\ton-demand\trunning\t10.1.0.11\n"
                "i-0s2\tserver\tc6i.large\ton-demand\trunning\t10.1.0.12\n"
                "i-0w1\tworker\tg5.xlarge\tspot\trunning\t10.1.9.9\n");
  REQUIRE(Shell(dir, "printf '#cloud-config server\\n' | gzip -c > '" +
                         dir.File("aws/user-data-server.yaml.gz") + "'")
              .code == 0);
  Result more = Shell(dir, aws + Launch("scale --name demo --region eu-west-1 --servers 3"));
  INFO(more.output);
  CHECK(more.code == 0);
  CHECK(more.output.find("servers 2 -> 3: started i-0server1") != std::string::npos);
  const std::string calls = Shell(dir, "cat '" + dir.File("aws/calls.log") + "'").output;
  const size_t run = calls.rfind("ec2 run-instances --image-id ami-0debian12standin");
  REQUIRE(run != std::string::npos);
  const std::string run_line = calls.substr(run, calls.find('\n', run) - run);
  CHECK(run_line.find("--instance-type c6i.large --count 1") != std::string::npos);
  CHECK(run_line.find("Key=Role,Value=server") != std::string::npos);
  CHECK(run_line.find("--placement GroupName=ps-demo") != std::string::npos);
  CHECK(run_line.find("--user-data fileb://") != std::string::npos);
  // The user data handed over is the running server's, byte for byte (the stand-in kept
  // it: launch.sh removes its own files).
  CHECK(Shell(dir, "cmp '" + dir.File("aws/last-user-data") + "' '" +
                       dir.File("aws/user-data-server.yaml.gz") + "'")
            .code == 0);
  // Fewer: psctl scale on the scheduler drains, then the drained instances end.
  dir.WriteFile("aws/psctl-status.txt",
                "scale: draining ps-1 (its shards move at epoch 7)\nscale: 1 live servers\n"
                "NODE  ROLE    ADDRESS          HEALTH   LAST HEARTBEAT\n"
                "ps-0  server  10.1.0.11:7001   alive    0.1 s ago\n"
                "ps-1  server  10.1.0.12:7001   drained  4.2 s ago\n");
  Result fewer = Shell(dir, aws + Launch("scale --name demo --region eu-west-1 --servers 1"));
  INFO(fewer.output);
  CHECK(fewer.code == 0);
  CHECK(fewer.output.find("servers 2 -> 1: draining on the scheduler (psctl scale)") !=
        std::string::npos);
  CHECK(fewer.output.find("terminated i-0s2 (drained)") != std::string::npos);
  CHECK(Shell(dir, "grep -q 'ec2 terminate-instances --instance-ids i-0s2 ' '" +
                       dir.File("aws/calls.log") + "'")
            .code == 0);
  CHECK(Shell(dir, "grep -q -- '--servers 1 scale' '" + dir.File("aws/calls.log") + "'").code == 0);
  Result both =
      Shell(dir, aws + Launch("scale --name demo --region eu-west-1 --servers 2 --workers 2"));
  CHECK(both.code == 2);
}

// Checks `launch.sh status` against the stand-in: instances, the group, the job's progress.
void CheckStatus(const TempDir& dir, const std::string& aws) {
  // status: instances and roles, the group, the job through SSM Run Command.
  dir.WriteFile("aws/instances.txt",
                "i-0scheduler\tscheduler\tt3.medium\ton-demand\trunning\t10.1.2.3\n"
                "i-0w1\tworker\tg5.xlarge\tspot\trunning\t10.1.9.9\n");
  dir.WriteFile("aws/psctl-status.txt", "training\nstep 798 of 3750 (21%), ETA 2 min 10 s");
  Result status = Shell(dir, aws + Launch("status --name demo --region eu-west-1"));
  INFO(status.output);
  CHECK(status.code == 0);
  CHECK(std::regex_search(status.output, std::regex("i-0w1 +worker +g5.xlarge +spot +running")));
  CHECK(status.output.find("workers' group ps-demo-workers: 4 in service of 4 wanted (max 4)") !=
        std::string::npos);
  CHECK(status.output.find("  step 798 of 3750 (21%), ETA 2 min 10 s") != std::string::npos);
  CHECK(Shell(dir, "grep -q 'ssm send-command --instance-ids i-0scheduler' '" +
                       dir.File("aws/calls.log") + "'")
            .code == 0);
}

// Checks `launch.sh down` removes everything `up` made, then that `up` needs --vpc.
void CheckDownRemovesEverything(const TempDir& dir, const std::string& aws) {
  // down: everything up made, the secrets included.
  Result down = Shell(dir, aws + Launch("down --name demo --region eu-west-1"));
  INFO(down.output);
  CHECK(down.code == 0);
  CHECK(down.output.find("not everything went") == std::string::npos);
  const std::string after = Shell(dir, "cat '" + dir.File("aws/calls.log") + "'").output;
  for (const char* removal :
       {"autoscaling delete-auto-scaling-group --auto-scaling-group-name ps-demo-workers "
        "--force-delete",
        "ec2 terminate-instances --instance-ids i-0scheduler i-0w1",
        "ec2 delete-launch-template --launch-template-name ps-demo-worker",
        "ec2 delete-placement-group --group-name ps-demo",
        "ec2 delete-security-group --group-id sg-0standin",
        "ssm delete-parameters --names /paramserver/demo/cluster-token "
        "/paramserver/demo/admin-token /paramserver/demo/tls-ca /paramserver/demo/tls-cert "
        "/paramserver/demo/tls-key",
        "iam delete-role-policy --role-name ps-demo-node", "iam delete-instance-profile",
        "iam delete-role --role-name ps-demo-node",
        "logs delete-log-group --log-group-name /paramserver/demo"}) {
    INFO(removal);
    CHECK(after.find(removal) != std::string::npos);
  }
  CHECK(Shell(dir, "ls -A '" + dir.File("aws/ssm") + "'").output.empty());  // no secret left
  Result incomplete = Shell(
      dir, Launch("up --name demo --region eu-west-1 --spec '" + dir.File("spec.yaml") + "'"));
  CHECK(incomplete.code == 2);
  CHECK(incomplete.output ==
        "launch.sh: --vpc is required (launch.sh up --help lists every option)\n");
}

TEST_CASE(
    "launch.sh up against the stand-in aws: secrets, a scoped role, servers, a spot group; down "
    "removes it all") {
  TempDir dir;
  dir.WriteFile("spec.yaml", kSpec);
  const std::string aws = WithStandInAws(dir);
  Result up = Shell(dir, aws + LaunchUp(dir, "--worker-types g5.xlarge,g6.xlarge --tls"));
  INFO(up.output);
  REQUIRE(up.code == 0);
  CheckUpSummary(up);
  const std::string calls = Shell(dir, "cat '" + dir.File("aws/calls.log") + "'").output;
  INFO(calls);
  CheckUpCallOrder(calls);
  CheckSecretsInSsm(dir);
  CheckRolePolicy(dir);
  CheckWorkersGroup(dir, calls);
  CheckUserDataAndLaunchTemplate(dir);

  CheckScale(dir, aws);
  CheckStatus(dir, aws);
  CheckDownRemovesEverything(dir, aws);
}

}  // namespace
}  // namespace paramserver
