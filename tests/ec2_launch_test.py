#!/usr/bin/python3
"""deploy/ec2/launch.py run for real: its help and refusals, its dry run (botocore builds
and validates every call, a before-call handler prints and answers it), and whole
clusters made, scaled, watched and removed against tests/stand_ins/aws_endpoint.py, a
stand-in AWS endpoint that speaks the services' wire protocols and records every call.
The checks read the recorded calls' parameters and the state the stand-in kept.

Run by Bazel (//tests:ec2_launch_test) with Debian's python3 and python3-boto3; prints
Catch2's summary line (tests/python/runner.py) so that tests/run.sh counts each case.
"""
import base64
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join(ROOT, "deploy/ec2/launch.py")
ENDPOINT = os.path.join(ROOT, "tests/stand_ins/aws_endpoint.py")
SPEC = """\
cluster:
  scheduler: 127.0.0.1:7000
  servers: 2
  workers: 4
training:
  mode: sync
checkpoint:
  dir: s3://ps-ckpt/jobs/demo
output:
  weights: s3://ps-out/demo/final.safetensors
"""
UP = ["up", "--name", "demo", "--region", "eu-west-1", "--vpc", "vpc-9", "--subnet", "subnet-a,subnet-b",
      "--release-url", "https://releases.example/ps.tar.gz"]


def clean_environment(**more):
    """The environment without the machine's AWS settings, plus `more`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_CONFIG_FILE="/nonexistent", AWS_SHARED_CREDENTIALS_FILE="/nonexistent",
               AWS_EC2_METADATA_DISABLED="true")
    env.update(more)
    return env


def launch(args, env=None, timeout=120):
    """(exit status, stdout, stderr) of launch.py ARGS."""
    done = subprocess.run([LAUNCH, *args], capture_output=True, text=True, timeout=timeout,
                          env=env or clean_environment())
    return done.returncode, done.stdout, done.stderr


def parse_calls(text, prefix=""):
    """[(service, operation, params, rest)] of lines "PREFIX SERVICE Operation {json}[ rest]"."""
    calls = []
    for line in text.splitlines():
        if prefix and not line.startswith(prefix):
            continue
        service, operation, rest = line[len(prefix):].split(" ", 2)
        params, end = json.JSONDecoder().raw_decode(rest)
        calls.append((service, operation, params, rest[end:].strip()))
    return calls


def calls_of(calls, service, operation):
    return [params for s, o, params, _ in calls if (s, o) == (service, operation)]


def file_in_user_data(user_data_gz, path):
    """The file a gzipped cloud-config writes at `path`, decoded."""
    with gzip.open(user_data_gz, "rt") as f:
        config = yaml.safe_load(f)
    entry = next(e for e in config["write_files"] if e["path"] == path)
    return base64.b64decode(entry["content"]).decode()


class Folder(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="ec2-launch-test.")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.spec = self.write("spec.yaml", SPEC)
        self.work = os.path.join(self.dir, "work")

    def write(self, name, text):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text)
        return path


class HelpTest(Folder):
    def test_help_texts_describe_every_option(self):
        status, out, _ = launch(["--help"])
        self.assertEqual(status, 0)
        for command in ("up", "down", "scale", "status", "policy"):
            self.assertIn(f"\n  {command} ", out)
        sys.path[:0] = [os.path.join(ROOT, "deploy/ec2"), os.path.join(ROOT, "deploy")]
        import launch_cli  # launch.py's command line: its options and flags
        all_help = ""
        for command in ("up", "down", "scale", "status", "policy"):
            status, out, _ = launch([command, "--help"])
            self.assertEqual(status, 0, command)
            self.assertTrue(out.startswith(f"usage: launch.py {command}"), out)
            all_help += out
        options = set(launch_cli.OPTIONS) | set(launch_cli.FLAGS)
        self.assertIn("--release-url", options)
        self.assertIn("--endpoint-url", options)
        for option in options - {"--spot-workers", "--worker-type"}:  # aliases
            self.assertIn(option, all_help)

    def test_refusals(self):
        status, _, err = launch(["up", "--no-such-option"])
        self.assertEqual(status, 2)
        self.assertEqual(err, "launch.py up: unknown argument --no-such-option (launch.py up --help lists them)\n")
        status, _, err = launch(["up", "--name", "demo", "--region", "eu-west-1", "--spec", self.spec])
        self.assertEqual(status, 2)
        self.assertEqual(err, "launch.py: --vpc is required (launch.py up --help lists every option)\n")
        status, _, err = launch(["frobnicate"])
        self.assertEqual(status, 2)
        self.assertTrue(err.startswith("launch.py: unknown command 'frobnicate'\nusage: launch.py COMMAND"))
        status, _, err = launch(["down", "--name", "no spaces", "--region", "eu-west-1"])
        self.assertEqual((status, err), (2, "launch.py: --name may hold letters, digits and '-' only (at most 40)\n"))


class DryRunTest(Folder):
    def dry_up(self, *extra):
        status, out, err = launch(UP + ["--spec", self.spec, "--work", self.work, "--dry-run", *extra])
        self.assertEqual(status, 0, err)
        return out, parse_calls(out, "aws ")

    def test_up_prints_the_calls_for_2_servers_and_4_gpu_workers(self):
        out, calls = self.dry_up()
        puts = calls_of(calls, "ssm", "PutParameter")
        self.assertEqual([p["Name"] for p in puts], ["/paramserver/demo/cluster-token", "/paramserver/demo/admin-token"])
        self.assertTrue(all(p["Value"] == "<64 bytes, not shown>" and p["Type"] == "SecureString" for p in puts))
        self.assertEqual(calls_of(calls, "ec2", "CreateSecurityGroup")[0]["GroupName"], "ps-demo")
        scheduler, servers = calls_of(calls, "ec2", "RunInstances")
        self.assertEqual((scheduler["InstanceType"], scheduler["MinCount"], scheduler["MaxCount"]), ("t3.medium", 1, 1))
        self.assertEqual((servers["InstanceType"], servers["MinCount"], servers["MaxCount"]), ("r6i.xlarge", 2, 2))
        self.assertEqual(servers["Placement"], {"GroupName": "ps-demo"})
        self.assertEqual(servers["SecurityGroupIds"], ["sg-DRYRUN"])  # the made-up group id, fed on
        self.assertNotIn("InstanceMarketOptions", servers)  # servers are on-demand
        group = calls_of(calls, "autoscaling", "CreateAutoScalingGroup")[0]
        self.assertEqual((group["AutoScalingGroupName"], group["MinSize"], group["MaxSize"], group["DesiredCapacity"]),
                         ("ps-demo-workers", 4, 4, 4))
        self.assertIs(group["CapacityRebalance"], True)
        self.assertIn("scheduler       1 x t3.medium (on-demand) at 10.0.0.10:7000", out)
        self.assertFalse([f for f in os.listdir(self.work) if "token" in f])  # not left behind
        # The worker's spec names the scheduler's (made-up) address.
        self.assertIn("  scheduler: 10.0.0.10:7000\n",
                      file_in_user_data(os.path.join(self.work, "user-data-worker.yaml.gz"), "/etc/ps/cluster.yaml"))

        status, out, _ = launch(["down", "--name", "demo", "--region", "eu-west-1", "--dry-run"])
        self.assertEqual(status, 0)
        down = parse_calls(out, "aws ")
        self.assertEqual(calls_of(down, "ec2", "TerminateInstances"), [{"InstanceIds": ["i-DRYRUN1", "i-DRYRUN2"]}])
        self.assertEqual(calls_of(down, "ssm", "DeleteParameters")[0]["Names"][-1], "/paramserver/demo/tls-key")

    def test_ranges_start_at_the_mins_and_the_group_scales_to_max(self):
        self.write("spec.yaml", SPEC.replace("servers: 2\n  workers: 4",
                                             "servers: {min: 2, max: 5}\n  workers: {min: 2, max: 6}"))
        out, calls = self.dry_up()
        self.assertEqual(calls_of(calls, "ec2", "RunInstances")[1]["MinCount"], 2)
        group = calls_of(calls, "autoscaling", "CreateAutoScalingGroup")[0]
        self.assertEqual((group["MinSize"], group["MaxSize"], group["DesiredCapacity"]), (2, 6, 2))
        self.assertIn("capacity rebalancing, scales to 6)", out)

    def test_a_flow_style_cluster_section_is_accepted(self):
        self.write("spec.yaml", "cluster: {scheduler: '127.0.0.1:7000', servers: 3, workers: {min: 1, max: 2}}\n"
                                "checkpoint: {dir: 's3://ps-ckpt/jobs/demo'}  # kept\n")
        out, calls = self.dry_up("--resume")
        self.assertEqual(calls_of(calls, "ec2", "RunInstances")[1]["MinCount"], 3)
        group = calls_of(calls, "autoscaling", "CreateAutoScalingGroup")[0]
        self.assertEqual((group["MinSize"], group["MaxSize"]), (1, 2))
        text = file_in_user_data(os.path.join(self.work, "user-data-server.yaml.gz"), "/etc/ps/cluster.yaml")
        self.assertEqual(text, "cluster: {scheduler: 10.0.0.10:7000, servers: 3, workers: {min: 1, max: 2}}\n"
                               "checkpoint: {resume: true, dir: 's3://ps-ckpt/jobs/demo'}  # kept\n")
        self.assertEqual(yaml.safe_load(text)["checkpoint"]["resume"], True)

    def test_block_style_resume_sets_checkpoint_resume_in_place(self):
        self.write("spec.yaml", SPEC.replace("  dir: s3://ps-ckpt/jobs/demo\n",
                                             "  dir: s3://ps-ckpt/jobs/demo\n  resume: false  # first run\n"))
        self.dry_up("--resume")
        text = file_in_user_data(os.path.join(self.work, "user-data-scheduler.yaml.gz"), "/etc/ps/cluster.yaml")
        self.assertIn("  scheduler: 0.0.0.0:7000\n", text)
        self.assertIn("  dir: s3://ps-ckpt/jobs/demo\n  resume: true  # first run\n", text)

    def test_policy_is_scoped_to_the_cluster(self):
        status, out, _ = launch(["policy", "--name", "demo", "--region", "eu-west-1", "--spec", self.spec,
                                 "--account", "210987654321"])
        self.assertEqual(status, 0)
        statements = {s["Sid"]: s for s in json.loads(out)["Statement"]}
        self.assertEqual(statements["ReadThisClustersSecrets"]["Resource"],
                         "arn:aws:ssm:eu-west-1:210987654321:parameter/paramserver/demo/*")
        self.assertEqual(statements["ReadWriteSpecPrefix1"]["Resource"], "arn:aws:s3:::ps-ckpt/jobs/demo/*")
        self.assertEqual(statements["ReadWriteSpecPrefix2"]["Resource"], "arn:aws:s3:::ps-out/demo/*")

    def test_a_tls_dry_run_prints_no_secret(self):
        status, out, err = launch(UP + ["--spec", self.spec, "--work", self.work, "--dry-run", "--tls"])
        self.assertEqual(status, 0, err)
        for text in (out, err):
            self.assertNotRegex(text, r"[0-9a-f]{64}")  # a token
            self.assertNotIn("-----BEGIN", text)  # a key or certificate
            self.assertNotIn("PRIVATE KEY", text)
        self.assertEqual(len(re.findall(r'"Value": "<[0-9]+ bytes, not shown>"', out)), 5)

    def test_a_spec_reaching_cluster_scheduler_through_a_merge_key_is_refused_before_any_call(self):
        self.write("spec.yaml", "base: &base\n  scheduler: 127.0.0.1:7000\n  servers: 2\n  workers: 4\n"
                                "cluster:\n  <<: *base\n")
        status, out, err = launch(UP + ["--spec", self.spec, "--work", self.work, "--dry-run"])
        self.assertEqual((status, out), (2, ""))  # not one call printed
        self.assertEqual(err, f"launch.py: {self.spec}: cluster.scheduler must be written as a value in place (not "
                              "through a YAML merge key '<<', an alias '*' or with an anchor '&'): the launcher "
                              "rewrites its text for the instances\n")
        # An anchored checkpoint.resume is refused with --resume only.
        self.write("spec.yaml", SPEC.replace("  dir: s3://ps-ckpt/jobs/demo\n",
                                             "  dir: s3://ps-ckpt/jobs/demo\n  resume: &r false\n") + "kept: *r\n")
        self.dry_up()
        status, out, err = launch(UP + ["--spec", self.spec, "--work", self.work, "--dry-run", "--resume"])
        self.assertEqual((status, out), (2, ""))
        self.assertIn("checkpoint.resume must be written as a value in place", err)
        self.assertEqual(err.count("\n"), 1)

    def test_retries_are_left_to_the_environment_and_the_profile(self):
        sys.path[:0] = [os.path.join(ROOT, "deploy/ec2"), os.path.join(ROOT, "deploy")]
        import aws_clients
        saved = {k: os.environ.get(k) for k in ("AWS_RETRY_MODE", "AWS_MAX_ATTEMPTS", "AWS_CONFIG_FILE")}
        self.addCleanup(lambda: [os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
                                 for k, v in saved.items()])
        os.environ["AWS_CONFIG_FILE"] = "/nonexistent"
        os.environ.pop("AWS_RETRY_MODE", None)
        os.environ.pop("AWS_MAX_ATTEMPTS", None)
        client = aws_clients.AwsClients("eu-west-1", dry_run=True).client("sts")
        self.assertEqual(client.meta.config.retries, {"mode": "standard"})  # the default: standard, its 3 tries
        os.environ.update(AWS_RETRY_MODE="adaptive", AWS_MAX_ATTEMPTS="7")
        client = aws_clients.AwsClients("eu-west-1", dry_run=True).client("sts")
        self.assertEqual(client.meta.config.retries, {"mode": "adaptive", "total_max_attempts": 7})
        os.environ.pop("AWS_RETRY_MODE")
        os.environ["AWS_CONFIG_FILE"] = self.write("config", "[default]\nretry_mode = legacy\nmax_attempts = 2\n")
        client = aws_clients.AwsClients("eu-west-1", dry_run=True).client("sts")
        self.assertEqual(client.meta.config.retries, {"mode": "legacy", "total_max_attempts": 7})  # env over file

    def test_botocore_still_validates_parameters_in_a_dry_run(self):
        sys.path[:0] = [os.path.join(ROOT, "deploy/ec2"), os.path.join(ROOT, "deploy")]
        import aws_clients
        printed = tempfile.TemporaryFile("w+")
        aws = aws_clients.AwsClients("eu-west-1", dry_run=True, out=printed)
        with self.assertRaises(aws_clients.ERRORS):  # SSM's command ids have 36 characters
            aws.client("ssm").get_command_invocation(CommandId="short", InstanceId="i-1")
        aws.client("logs").delete_log_group(logGroupName="/paramserver/x")
        printed.seek(0)
        self.assertEqual(printed.read(), 'aws logs DeleteLogGroup {"logGroupName": "/paramserver/x"}\n')


class StandInTest(Folder):
    """Against tests/stand_ins/aws_endpoint.py, started per test on an ephemeral port."""

    def setUp(self):
        super().setUp()
        self.state = os.path.join(self.dir, "aws")
        os.makedirs(self.state)
        port_file = os.path.join(self.dir, "port")
        self.endpoint = subprocess.Popen([sys.executable, ENDPOINT, "--port-file", port_file],
                                         env=clean_environment(AWS_STANDIN_ROOT=self.state))
        self.addCleanup(self.stop_endpoint)
        deadline = time.monotonic() + 30
        while not os.path.exists(port_file):
            self.assertIsNone(self.endpoint.poll(), "the stand-in endpoint exited")
            self.assertLess(time.monotonic(), deadline, "the stand-in endpoint did not start in 30 s")
            time.sleep(0.05)
        with open(port_file) as f:
            self.url = f"http://127.0.0.1:{f.read().strip()}"
        self.env = clean_environment(AWS_ACCESS_KEY_ID="AKIASTANDIN", AWS_SECRET_ACCESS_KEY="standin-secret")

    def stop_endpoint(self):
        self.endpoint.send_signal(signal.SIGKILL)
        self.endpoint.wait(timeout=30)

    def run_launch(self, *args):
        return launch([*args, "--region", "eu-west-1", "--endpoint-url", self.url], env=self.env)

    def calls(self):
        with open(os.path.join(self.state, "calls.log")) as f:
            return parse_calls(f.read())

    def read_state(self, name):
        with open(os.path.join(self.state, name)) as f:
            return f.read()

    def read_bytes(self, name):
        with open(os.path.join(self.state, name), "rb") as f:
            return f.read()

    def up(self, *extra, name="demo", work=None):
        status, out, err = self.run_launch(UP[0], "--name", name, *UP[5:], "--spec", self.spec,
                                           "--work", work or self.work, *extra)
        self.assertEqual(status, 0, err)
        self.up_output = out + err
        return out

    def test_up_scale_status_down(self):
        out = self.up("--worker-types", "g5.xlarge,g6.xlarge", "--tls")
        self.assertIn("scheduler       1 x t3.medium (on-demand) at 10.1.2.3:7000", out)
        self.assertIn("servers         2 x r6i.xlarge (on-demand, placement group ps-demo): i-0server1 i-0server2", out)
        self.assertIn("workers         4 x g5.xlarge or g6.xlarge (spot, group ps-demo-workers, capacity rebalancing)",
                      out)
        calls = self.calls()
        self.assertFalse([c for c in calls if c[3]], "every call answered")
        self.check_call_order(calls)
        self.check_secrets()
        self.check_role()
        self.check_network_and_instances(calls)
        self.check_workers_group(calls)
        self.check_user_data()
        self.check_scale()
        self.check_status()
        self.check_down()

    def check_call_order(self, calls):
        # In order: the secrets, the role, the network, the servers, the workers' group.
        order = [(s, o, p.get("Name") or p.get("RoleName") or p.get("GroupName") or p.get("logGroupName") or
                  next((t["Value"] for spec in p.get("TagSpecifications", []) for t in spec["Tags"]
                        if t["Key"] == "Role"), None)) for s, o, p, _ in calls]
        expected = [("ssm", "PutParameter", "/paramserver/demo/cluster-token"),
                    ("ssm", "PutParameter", "/paramserver/demo/tls-key"),
                    ("iam", "CreateRole", "ps-demo-node"), ("iam", "PutRolePolicy", "ps-demo-node"),
                    ("iam", "AddRoleToInstanceProfile", "ps-demo-node"), ("iam", "GetInstanceProfile", None),
                    ("ec2", "CreateSecurityGroup", "ps-demo"), ("ec2", "CreatePlacementGroup", "ps-demo"),
                    ("logs", "CreateLogGroup", "/paramserver/demo"), ("ec2", "RunInstances", "scheduler"),
                    ("ec2", "RunInstances", "server"), ("ec2", "CreateLaunchTemplate", None),
                    ("autoscaling", "CreateAutoScalingGroup", None)]
        at = 0
        for service, operation, name in expected:
            found = [i for i in range(at, len(order)) if order[i][:2] == (service, operation)
                     and (name is None or order[i][2] == name)]
            self.assertTrue(found, f"{service} {operation} {name} after call {at}")
            at = found[0]

    def check_secrets(self):
        # In SSM (the stand-in's store), made here: 64 hex digits, a CA and its certificate.
        stored = os.path.join(self.state, "ssm", "%paramserver%demo%")
        self.assertRegex(self.read_state("ssm/%paramserver%demo%cluster-token"), r"^[0-9a-f]{64}$")
        verified = subprocess.run(["openssl", "verify", "-CAfile", stored + "tls-ca", stored + "tls-cert"],
                                  capture_output=True, text=True)
        self.assertIn(": OK", verified.stdout)
        self.assertFalse([f for f in os.listdir(self.work) if re.search(r"token|tls-|\.key", f)])
        with open(os.path.join(self.state, "calls.log")) as f:  # the secrets were never recorded
            logged = f.read()
        for secret in ("cluster-token", "admin-token", "tls-key"):  # nor printed
            value = self.read_state(f"ssm/%paramserver%demo%{secret}")
            self.assertNotIn(value.strip(), logged)
            self.assertNotIn(value.strip(), self.up_output)
        self.assertNotIn("PRIVATE KEY", self.up_output)

    def check_role(self):
        # The policy as IAM got it: this cluster's parameters only, KMS through SSM only, the
        # spec's S3 prefixes, its log group; the trust: EC2 only.
        role = json.loads(self.read_state("iam.json"))["roles"]["ps-demo-node"]
        self.assertEqual(role["trust"]["Statement"][0]["Principal"], {"Service": "ec2.amazonaws.com"})
        self.assertEqual(role["attached"], ["arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"])
        statements = role["policies"]["ps-demo-node"]["Statement"]
        for statement in statements:  # nothing granted on everything but the two agent lookups and metrics
            if statement["Resource"] == "*":
                self.assertIn(statement["Sid"], ("PutParamserverMetrics", "CloudWatchAgentLookups"))
        by_sid = {s["Sid"]: s for s in statements}
        self.assertEqual(by_sid["ReadThisClustersSecrets"]["Resource"],
                         "arn:aws:ssm:eu-west-1:123456789012:parameter/paramserver/demo/*")
        self.assertEqual(by_sid["DecryptThroughSsmOnly"]["Condition"]["StringEquals"]["kms:ViaService"],
                         "ssm.eu-west-1.amazonaws.com")
        s3 = {s["Resource"] for s in statements if s["Sid"].startswith("ReadWrite")}
        self.assertEqual(s3, {"arn:aws:s3:::ps-ckpt/jobs/demo/*", "arn:aws:s3:::ps-out/demo/*"})
        self.assertIn("arn:aws:logs:eu-west-1:123456789012:log-group:/paramserver/demo:*",
                      by_sid["WriteThisClustersLogs"]["Resource"])
        with open(os.path.join(self.work, "policy.json")) as f:
            self.assertEqual(json.load(f), role["policies"]["ps-demo-node"])

    def check_network_and_instances(self, calls):
        ingress = calls_of(calls, "ec2", "AuthorizeSecurityGroupIngress")[0]
        self.assertEqual([(p["FromPort"], p["ToPort"], p["UserIdGroupPairs"]) for p in ingress["IpPermissions"]],
                         [(7000, 7002, [{"GroupId": "sg-0standin"}]), (9100, 9102, [{"GroupId": "sg-0standin"}])])
        scheduler, servers = calls_of(calls, "ec2", "RunInstances")
        for run in (scheduler, servers):
            self.assertEqual(run["MetadataOptions"]["HttpTokens"], "required")
            self.assertEqual(run["IamInstanceProfile"], {"Name": "ps-demo-node"})
            self.assertEqual((run["SubnetId"], run["SecurityGroupIds"]), ("subnet-a", ["sg-0standin"]))
            self.assertEqual(run["ImageId"], "ami-0debian12standin")  # the newest Debian 12, looked up
        self.assertEqual(servers["Placement"], {"GroupName": "ps-demo"})
        self.assertEqual(calls_of(calls, "logs", "PutRetentionPolicy"),
                         [{"logGroupName": "/paramserver/demo", "retentionInDays": 14}])

    def check_workers_group(self, calls):
        # Spot only, two instance types, from the launch template, over both subnets.
        group = calls_of(calls, "autoscaling", "CreateAutoScalingGroup")[0]
        mixed = group["MixedInstancesPolicy"]
        self.assertEqual(mixed["InstancesDistribution"]["OnDemandPercentageAboveBaseCapacity"], 0)
        self.assertEqual(mixed["LaunchTemplate"]["Overrides"], [{"InstanceType": "g5.xlarge"},
                                                                {"InstanceType": "g6.xlarge"}])
        self.assertEqual(mixed["LaunchTemplate"]["LaunchTemplateSpecification"]["LaunchTemplateName"], "ps-demo-worker")
        self.assertEqual((group["VPCZoneIdentifier"], group["CapacityRebalance"]), ("subnet-a,subnet-b", True))
        template = calls_of(calls, "ec2", "CreateLaunchTemplate")[0]["LaunchTemplateData"]
        self.assertEqual(template["MetadataOptions"]["HttpTokens"], "required")
        self.assertEqual(template["IamInstanceProfile"], {"Name": "ps-demo-node"})
        # The user data EC2 got in the template (base64 of gzip): the worker's, as written.
        kept = json.loads(self.read_state("ec2.json"))["launch_templates"]["ps-demo-worker"]
        received = base64.b64decode(kept["UserData"])
        with open(os.path.join(self.work, "user-data-worker.yaml.gz"), "rb") as f:
            self.assertEqual(received, f.read())
        with open(os.path.join(self.work, "user-data-worker.yaml"), "rb") as f:
            self.assertEqual(gzip.decompress(received), f.read())

    def check_user_data(self):
        # The workers' user data (in the launch template) installs the driver and the
        # runtime, and names the scheduler's private address.
        worker = os.path.join(self.work, "user-data-worker.yaml.gz")
        bootstrap = file_in_user_data(worker, "/usr/local/sbin/ps-bootstrap")
        self.assertIn("apt-get install -y --no-install-recommends nvidia-open", bootstrap)
        self.assertIn("cuda-cudart-13-0 libcublas-13-0", bootstrap)
        env = file_in_user_data(worker, "/etc/ps/bootstrap.env")
        for line in ("ROLE=worker", "GPU=1", "TLS=1", "PARAMETERS=/paramserver/demo"):
            self.assertIn(line + "\n", env)
        self.assertIn("  scheduler: 10.1.2.3:7000\n", file_in_user_data(worker, "/etc/ps/cluster.yaml"))
        server = os.path.join(self.work, "user-data-server.yaml.gz")
        self.assertIn("GPU=0\n", file_in_user_data(server, "/etc/ps/bootstrap.env"))
        self.assertLess(os.path.getsize(worker), 16384)  # EC2's limit on user data
        with open(server, "rb") as f:  # what EC2 got for the servers, byte for byte
            self.assertEqual(f.read(), self.read_bytes("last-user-data"))

    def check_scale(self):
        status, out, _ = self.run_launch("scale", "--name", "demo", "--workers", "2")
        self.assertEqual(status, 0)
        self.assertIn("workers 4 -> 2 (of 4 ranks)", out)
        self.assertEqual(calls_of(self.calls(), "autoscaling", "UpdateAutoScalingGroup"),
                         [{"AutoScalingGroupName": "ps-demo-workers", "MinSize": 2, "DesiredCapacity": 2}])
        status, _, err = self.run_launch("scale", "--name", "demo", "--workers", "5")
        self.assertEqual(status, 2)
        self.assertIn("the spec has 4 worker ranks (cluster.workers, a range's max)", err)

        # --servers: more starts instances like the running ones, with their user data.
        self.write("aws/instances.txt", "i-0scheduler\tscheduler\tt3.medium\ton-demand\trunning\t10.1.2.3\tdemo\n"
                                        "i-0s1\tserver\tc6i.large\ton-demand\trunning\t10.1.0.11\tdemo\n"
                                        "i-0s2\tserver\tc6i.large\ton-demand\trunning\t10.1.0.12\tdemo\n"
                                        "i-0w1\tworker\tg5.xlarge\tspot\trunning\t10.1.9.9\tdemo\n")
        with gzip.open(os.path.join(self.state, "user-data-server.yaml.gz"), "wb") as f:
            f.write(b"#cloud-config server\n")
        status, out, err = self.run_launch("scale", "--name", "demo", "--servers", "3")
        self.assertEqual(status, 0, err)
        self.assertIn("servers 2 -> 3: started i-0server3 (on-demand c6i.large, like i-0s1)", out)
        run = calls_of(self.calls(), "ec2", "RunInstances")[-1]
        self.assertEqual((run["InstanceType"], run["MinCount"], run["ImageId"]), ("c6i.large", 1, "ami-0debian12standin"))
        self.assertIn({"Key": "Role", "Value": "server"}, run["TagSpecifications"][0]["Tags"])
        self.assertEqual(run["Placement"], {"GroupName": "ps-demo"})
        self.assertEqual(run["IamInstanceProfile"], {"Arn": "arn:aws:iam::123456789012:instance-profile/ps-demo-node"})
        self.assertEqual(self.read_bytes("last-user-data"), self.read_bytes("user-data-server.yaml.gz"))
        # Fewer: psctl scale on the scheduler drains, then the drained instances end.
        self.write("aws/psctl-status.txt", "scale: draining ps-1 (its shards move at epoch 7)\nscale: 1 live servers\n"
                                           "NODE  ROLE    ADDRESS          HEALTH   LAST HEARTBEAT\n"
                                           "ps-0  server  10.1.0.11:7001   alive    0.1 s ago\n"
                                           "ps-1  server  10.1.0.12:7001   drained  4.2 s ago\n")
        status, out, err = self.run_launch("scale", "--name", "demo", "--servers", "1")
        self.assertEqual(status, 0, err)
        self.assertIn("servers 3 -> 1: draining on the scheduler (psctl scale)", out)
        self.assertIn("terminated i-0s2 (drained)", out)
        calls = self.calls()
        self.assertEqual(calls_of(calls, "ec2", "TerminateInstances")[-1], {"InstanceIds": ["i-0s2"]})
        sent = calls_of(calls, "ssm", "SendCommand")[-1]
        self.assertEqual((sent["InstanceIds"], sent["DocumentName"]), (["i-0scheduler"], "AWS-RunShellScript"))
        self.assertIn("--servers 1 scale", sent["Parameters"]["commands"][0])
        status, _, _ = self.run_launch("scale", "--name", "demo", "--servers", "2", "--workers", "2")
        self.assertEqual(status, 2)

    def check_status(self):
        self.write("aws/instances.txt", "i-0scheduler\tscheduler\tt3.medium\ton-demand\trunning\t10.1.2.3\tdemo\n"
                                        "i-0w1\tworker\tg5.xlarge\tspot\trunning\t10.1.9.9\tdemo\n")
        self.write("aws/psctl-status.txt", "training\nstep 798 of 3750 (21%), ETA 2 min 10 s")
        status, out, err = self.run_launch("status", "--name", "demo")
        self.assertEqual(status, 0, err)
        self.assertRegex(out, r"i-0w1 +worker +g5.xlarge +spot +running +10.1.9.9")
        self.assertRegex(out, r"i-0scheduler +scheduler +t3.medium +on-demand +running")
        # The group as `scale --workers 2` left it.
        self.assertIn("workers' group ps-demo-workers: 2 in service of 2 wanted (max 4)", out)
        self.assertIn("  step 798 of 3750 (21%), ETA 2 min 10 s", out)
        self.assertEqual(calls_of(self.calls(), "ssm", "SendCommand")[-1]["InstanceIds"], ["i-0scheduler"])

    def check_down(self):
        status, out, err = self.run_launch("down", "--name", "demo")
        self.assertEqual(status, 0, err)
        self.assertNotIn("not everything went", out)
        calls = self.calls()
        self.assertEqual(calls_of(calls, "ec2", "TerminateInstances")[-1], {"InstanceIds": ["i-0scheduler", "i-0w1"]})
        self.assertEqual(calls_of(calls, "ssm", "DeleteParameters")[-1]["Names"],
                         [f"/paramserver/demo/{s}" for s in ("cluster-token", "admin-token", "tls-ca", "tls-cert",
                                                             "tls-key")])
        # Nothing up made is left: no secret, role, group, template, log group.
        self.assertEqual(os.listdir(os.path.join(self.state, "ssm")), [])
        self.assertEqual(json.loads(self.read_state("iam.json")), {"profiles": {}, "roles": {}})
        self.assertEqual(json.loads(self.read_state("ec2.json")),
                         {"launch_templates": {}, "placement_groups": [], "security_groups": {}})
        self.assertEqual(json.loads(self.read_state("logs.json")), {})
        self.assertEqual(json.loads(self.read_state("autoscaling.json")), {})
        self.assertNotIn("\trunning\t", self.read_state("instances.txt"))
        # A second down finds nothing and says what did not go.
        status, out, _ = self.run_launch("down", "--name", "demo")
        self.assertEqual(status, 0)
        self.assertIn("not everything went", out)
        self.assertIn("delete the role: An error occurred (NoSuchEntity)", out)

    def test_resume_needs_a_checkpoint_in_s3(self):
        os.makedirs(os.path.join(self.state, "s3/ps-ckpt/jobs/demo"))
        status, _, err = self.run_launch(*UP[:3], *UP[5:], "--spec", self.spec, "--work", self.work, "--resume")
        self.assertEqual(status, 2)
        self.assertEqual(err, "launch.py: --resume: s3://ps-ckpt/jobs/demo/ holds no checkpoint "
                              "(shard-N-step-S.ckpt) to resume from\n")
        self.assertEqual(calls_of(self.calls(), "s3", "ListObjectsV2"),
                         [{"Bucket": "ps-ckpt", "Delimiter": "/", "Prefix": "jobs/demo/"}])
        self.assertEqual(len(self.calls()), 1)  # refused before anything was made
        self.write("aws/s3/ps-ckpt/jobs/demo/shard-0-step-300.ckpt", "checkpoint")
        out = self.up("--resume")
        self.assertIn("resumes from    the newest complete checkpoint in s3://ps-ckpt/jobs/demo", out)
        self.assertIn("  resume: true\n", file_in_user_data(os.path.join(self.work, "user-data-server.yaml.gz"),
                                                            "/etc/ps/cluster.yaml"))

    def test_resume_from_a_buckets_root_lists_its_own_files(self):
        for checkpoints in ("s3://ps-root/", "s3://ps-root"):
            self.write("spec.yaml", SPEC.replace("s3://ps-ckpt/jobs/demo", checkpoints))
            os.makedirs(os.path.join(self.state, "s3/ps-root/jobs/old"), exist_ok=True)
            self.write("aws/s3/ps-root/jobs/old/shard-0-step-100.ckpt", "a folder's, not the root's")
            status, _, err = self.run_launch(*UP[:3], *UP[5:], "--spec", self.spec, "--work", self.work, "--resume")
            self.assertEqual(status, 2, err)
            self.assertEqual(err, f"launch.py: --resume: {checkpoints.rstrip('/')}/ holds no checkpoint "
                                  "(shard-N-step-S.ckpt) to resume from\n")
            self.assertEqual(calls_of(self.calls(), "s3", "ListObjectsV2")[-1], {"Bucket": "ps-root", "Delimiter": "/"})
        self.write("aws/s3/ps-root/shard-0-step-300.ckpt", "checkpoint")
        out = self.up("--resume")
        self.assertIn(f"resumes from    the newest complete checkpoint in {checkpoints}", out)
        self.assertEqual(len(calls_of(self.calls(), "s3", "ListObjectsV2")), 3)

    def test_resume_names_why_the_listing_failed(self):
        self.write("spec.yaml", SPEC.replace("s3://ps-ckpt/jobs/demo", "s3://no-such-bucket/jobs"))
        status, _, err = self.run_launch(*UP[:3], *UP[5:], "--spec", self.spec, "--work", self.work, "--resume")
        self.assertEqual((status, err), (1, "launch.py: --resume: cannot list s3://no-such-bucket/jobs: An error "
                                            "occurred (NoSuchBucket) when calling the ListObjectsV2 operation: The "
                                            "specified bucket does not exist\n"))
        os.makedirs(os.path.join(self.state, "s3/ps-ckpt/jobs/demo"))
        self.write("spec.yaml", SPEC)
        self.write("aws/refusals.txt", "s3 ListObjectsV2 AccessDenied Access Denied\n")
        status, _, err = self.run_launch(*UP[:3], *UP[5:], "--spec", self.spec, "--work", self.work, "--resume")
        self.assertEqual((status, err), (1, "launch.py: --resume: cannot list s3://ps-ckpt/jobs/demo: An error "
                                            "occurred (AccessDenied) when calling the ListObjectsV2 operation: "
                                            "Access Denied\n"))
        self.assertEqual([c[:2] for c in self.calls()], [("s3", "ListObjectsV2")] * 2)

    def test_a_merge_key_spec_and_an_unwritable_work_folder_make_no_call(self):
        self.write("spec.yaml", "base: &base {scheduler: '127.0.0.1:7000', servers: 2, workers: 4}\n"
                                "cluster:\n  <<: *base\n")
        status, out, err = self.run_launch(*UP[:3], *UP[5:], "--spec", self.spec, "--work", self.work)
        self.assertEqual((status, out), (2, ""))
        self.assertRegex(err, r"^launch.py: .*spec.yaml: cluster.scheduler must be written as a value in place "
                              r"\(not through a YAML merge key '<<'.*\n$")
        self.write("spec.yaml", SPEC)
        not_a_folder = self.write("file", "")
        status, out, err = self.run_launch(*UP[:3], *UP[5:], "--spec", self.spec, "--work", not_a_folder + "/work")
        self.assertEqual((status, out), (2, ""))
        self.assertEqual(err, f"launch.py: --work {not_a_folder}/work: cannot write there (Not a directory)\n")
        self.assertFalse(os.path.exists(os.path.join(self.state, "calls.log")))  # no AWS call made

    def test_run_instances_is_retried_while_a_new_profile_spreads(self):
        self.write("aws/profile-propagation-refusals", "1\n")
        out = self.up()
        self.assertIn("scheduler       1 x t3.medium (on-demand) at 10.1.2.3:7000", out)
        runs = [(next(t["Value"] for t in p["TagSpecifications"][0]["Tags"] if t["Key"] == "Role"), rest)
                for s, o, p, rest in self.calls() if (s, o) == ("ec2", "RunInstances")]
        self.assertEqual(runs, [("scheduler", "REFUSED InvalidParameterValue"), ("scheduler", ""), ("server", "")])

    def test_another_clusters_instances_are_neither_listed_nor_removed(self):
        self.up(name="other", work=os.path.join(self.dir, "work-other"))
        self.up()
        other = [row.split("\t") for row in self.read_state("instances.txt").splitlines() if row.endswith("\tother")]
        self.assertEqual([(row[0], row[1], row[4]) for row in other],
                         [("i-0scheduler", "scheduler", "running"), ("i-0server1", "server", "running"),
                          ("i-0server2", "server", "running")])
        status, out, err = self.run_launch("status", "--name", "demo", "--no-job")
        self.assertEqual(status, 0, err)
        self.assertEqual(re.findall(r"^(i-\S+)", out, re.M), ["i-0scheduler2", "i-0server3", "i-0server4"])
        status, out, err = self.run_launch("down", "--name", "demo")
        self.assertEqual(status, 0, err)
        self.assertNotIn("not everything went", out)
        self.assertEqual(calls_of(self.calls(), "ec2", "TerminateInstances"),
                         [{"InstanceIds": ["i-0scheduler2", "i-0server3", "i-0server4"]}])
        rows = {row.split("\t")[0]: row.split("\t")[4] for row in self.read_state("instances.txt").splitlines()}
        self.assertEqual([rows[i] for i in ("i-0scheduler", "i-0server1", "i-0server2")], ["running"] * 3)
        self.assertEqual(list(json.loads(self.read_state("iam.json"))["roles"]), ["ps-other-node"])
        self.assertEqual(list(json.loads(self.read_state("ec2.json"))["security_groups"]), ["ps-other"])
        status, out, _ = self.run_launch("status", "--name", "other", "--no-job")
        self.assertEqual(re.findall(r"^(i-\S+)", out, re.M), ["i-0scheduler", "i-0server1", "i-0server2"])

    def test_down_goes_on_when_the_instances_cannot_be_listed(self):
        self.up()
        self.write("aws/refusals.txt", "ec2 DescribeInstances UnauthorizedOperation You are not authorized to "
                                       "perform this operation.\n")
        status, out, err = self.run_launch("down", "--name", "demo")
        self.assertEqual(status, 0, err)
        self.assertIn("  find the instances: An error occurred (UnauthorizedOperation) when calling the "
                      "DescribeInstances operation: You are not authorized to perform this operation.", out)
        self.assertEqual(os.listdir(os.path.join(self.state, "ssm")), [])  # the clean-up went on
        self.assertEqual(json.loads(self.read_state("iam.json")), {"profiles": {}, "roles": {}})
        self.assertFalse(calls_of(self.calls(), "ec2", "TerminateInstances"))

    def test_calls_need_credentials_and_unknown_calls_are_refused(self):
        status, _, err = launch(["status", "--name", "demo", "--region", "eu-west-1", "--endpoint-url", self.url])
        self.assertEqual(status, 1)
        self.assertIn("launch.py: Unable to locate credentials", err)
        sys.path[:0] = [os.path.join(ROOT, "deploy/ec2")]
        os.environ.update(AWS_ACCESS_KEY_ID="AKIASTANDIN", AWS_SECRET_ACCESS_KEY="standin-secret")
        self.addCleanup(lambda: [os.environ.pop(k, None) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")])
        import aws_clients
        aws = aws_clients.AwsClients("eu-west-1", self.url)
        with self.assertRaisesRegex(aws_clients.ERRORS[0], "InvalidAction"):
            aws.client("ec2").create_vpc(CidrBlock="10.0.0.0/16")
        with self.assertRaisesRegex(aws_clients.ERRORS[0], "UnknownOperationException"):
            aws.client("ssm").list_documents()
        self.assertEqual([(s, o, rest) for s, o, _, rest in self.calls()],
                         [("ec2", "CreateVpc", "UNANSWERED"), ("ssm", "ListDocuments", "UNANSWERED")])


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(ROOT, "tests/python"))
    import runner  # noqa: E402  (tests/python/runner.py: Catch2's summary line)
    sys.exit(runner.main(["__main__"]))
