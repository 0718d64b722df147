"""The command line of deploy/ec2/launch.py: the usage texts (the program's and each
command's), the options and flags and the setting each fills, Settings (the parsed
command line, with the cluster's resource names derived from --name), parse_command_line,
and Failure, the refusal every module of the launcher raises ("launch.py: MESSAGE", exit
status 2, or 1 for a failure on the way), with load_spec, which refuses a --spec it cannot read.
"""
import os
import re
import sys

import cluster_spec  # deploy/cluster_spec.py (launch.py puts its folder on sys.path)

PROGRAM = "launch.py"

USAGE = """\
usage: launch.py COMMAND [OPTIONS]     (launch.py COMMAND --help for its options)

Commands:
  up      start a cluster from a spec: secrets, IAM, network, scheduler, servers, workers
  down    remove everything `up` made for a cluster, its secrets included
  scale   change the number of workers (the Auto Scaling group's size) or of servers
  status  the cluster's instances, their roles and health, and the job's progress
  policy  print the IAM policy the instances need (for --instance-profile)

Every command takes --name NAME (the cluster), --region R (default: AWS_REGION or
AWS_DEFAULT_REGION), --dry-run (print the AWS calls, make none) and --endpoint-url URL
(send every AWS call to URL, e.g. LocalStack or a private endpoint; S3 then uses
path-style addressing). Credentials: wherever boto3 finds them (AWS_PROFILE, the
environment, ~/.aws, SSO, an instance role); a dry run needs none.
"""

UP_USAGE = """\
usage: launch.py up --spec FILE --name NAME --release-url URL --vpc VPC --subnet SUBNET[,SUBNET...]
                    [options]

Required:
  --spec FILE              the cluster spec (YAML); its cluster.servers and cluster.workers
                           set the counts, its s3:// paths the S3 access the instances get
  --name NAME              the cluster's name (letters, digits, '-'): tags, resource names
  --release-url URL        where instances download the release (deploy/package.sh's tarball)
  --vpc VPC                the VPC
  --subnet S[,S...]        subnets that reach the internet (through a NAT gateway, or
                           public ones with --public-ip); the scheduler and the servers go in
                           the first, the workers' group spreads over all

Instances:
  --ami AMI                the image (default debian-12: the newest official Debian 12
                           amd64 AMI, owner 136693071363, looked up in the region)
  --scheduler-type T       default t3.medium
  --server-type T          default r6i.xlarge (on-demand; in a cluster placement group
                           unless the family is burstable t*)
  --worker-types T[,T...]  default g5.xlarge; several types let the group find spot capacity
                           (GPU families g*/p* also get the NVIDIA driver)
  --worker-market M        spot (default) or on-demand
  --public-ip              give every instance a public address (subnets without NAT)
  --key-name KEY           an EC2 key pair for SSH (SSM sessions need none)

Resuming a lost job:
  --resume                 start the job from the newest complete checkpoint in the spec's
                           checkpoint.dir (it must be s3://: the instances' disks go with
                           them) instead of from scratch: the spec the instances get says
                           checkpoint.resume: true. Refused when the prefix holds no
                           checkpoint. For a job whose every instance was lost (a spot
                           reclaim of the fleet, a zone outage, `down` at night)

Access and operations:
  --instance-profile P     use this existing instance profile instead of creating
                           ps-NAME-node (give it what `launch.py policy` prints)
  --tls                    also make a CA and a certificate (openssl) and run every
                           connection with mutual TLS
  --log-retention-days N   the log group's retention (default 14)
  --region R               the region (default AWS_REGION or AWS_DEFAULT_REGION)
  --endpoint-url URL       send every AWS call to URL (LocalStack, a private endpoint)
  --work DIR               keep the rendered user data and policies here
  --dry-run                print the AWS calls instead of making them
"""

DOWN_USAGE = """\
usage: launch.py down --name NAME [--region R] [--keep-logs] [--dry-run] [--endpoint-url URL]

Deletes the workers' group and launch template, terminates the scheduler and servers,
and deletes the placement group, the security group, the log group (not with
--keep-logs), the SSM parameters (the tokens and TLS material) and the IAM role and
instance profile. Objects in S3 (checkpoints, weights) are left alone.
"""

SCALE_USAGE = """\
usage: launch.py scale --name NAME --workers N [--region R] [--dry-run] [--endpoint-url URL]
       launch.py scale --name NAME --servers N [--region R] [--dry-run] [--endpoint-url URL]

Sets the workers' Auto Scaling group to N instances (0 <= N <= the spec's cluster.workers,
or its max for a range {min, max}: the group's maximum; the group's minimum follows N).
What the job does:
  fewer workers  the removed ones leave the job; sync steps complete without them (with
                 data.sharding: dynamic their leases' rest goes to the others; with fixed
                 ranges their share of the data is skipped), async and ssp go on
  more workers   each new one takes a vacant rank (a worker that left or died), or a new
                 rank up to the range's max, and trains at once: sync steps average over
                 the workers present (the effective batch grows)
A worker beyond cluster.workers' max has no rank to take: the scheduler turns it away.

--servers N adds or removes servers (on-demand instances) while the job trains:
  more servers   starts instances like the running servers (their image, type, subnet,
                 security group, role, placement group and user data); each joins the
                 job in a new slot, up to the spec's cluster.servers max ({min, max}),
                 and takes a fair share of the shards live (a server beyond the max is
                 turned away and exits)
  fewer servers  runs `psctl scale --servers N` on the scheduler (SSM Run Command): the
                 highest-ranked servers are drained one after the other, their shards
                 moving with their state; then terminates the instances that left
"""

STATUS_USAGE = """\
usage: launch.py status --name NAME [--region R] [--no-job] [--dry-run] [--endpoint-url URL]

Lists the cluster's instances (id, role, type, spot or on-demand, state, private address),
the workers' group (desired and in service), and the job's progress: `psctl status` run on
the scheduler instance through SSM Run Command (skipped with --no-job).
"""

POLICY_USAGE = """\
usage: launch.py policy --name NAME --spec FILE [--region R] [--account ID] [--endpoint-url URL]

Prints the IAM policy (JSON) an instance profile of this cluster needs: its SSM
parameters, KMS decryption through SSM, the spec's s3:// prefixes, its log group and
CloudWatch metrics. `up` attaches it to the role it makes.
"""

COMMAND_USAGES = {"up": UP_USAGE, "down": DOWN_USAGE, "scale": SCALE_USAGE,
                  "status": STATUS_USAGE, "policy": POLICY_USAGE}

# Options that take a value, and the setting each fills; then the flags.
OPTIONS = {
    "--spec": "spec", "--name": "name", "--ami": "ami", "--vpc": "vpc", "--subnet": "subnets",
    "--instance-profile": "profile", "--release-url": "release_url",
    "--scheduler-type": "scheduler_type", "--server-type": "server_type",
    "--worker-types": "worker_types", "--worker-type": "worker_types",
    "--worker-market": "worker_market", "--key-name": "key_name",
    "--log-retention-days": "log_retention", "--workers": "workers_wanted",
    "--servers": "servers_wanted", "--account": "account", "--region": "region",
    "--work": "work", "--endpoint-url": "endpoint_url",
}
FLAGS = {
    "--spot-workers": ("worker_market", "spot"), "--public-ip": ("public_ip", True),
    "--tls": ("tls", True), "--resume": ("resume", True), "--keep-logs": ("keep_logs", True),
    "--no-job": ("job", False), "--dry-run": ("dry_run", True),
}


class Failure(Exception):
    """A refusal or a failure, printed as "launch.py: MESSAGE": exit status 2 for the
    operator's input (an option, the spec), 1 for what failed on the way (a tool, a file,
    the cluster's own state)."""

    def __init__(self, message, status=2):
        super().__init__(message)
        self.status = status


def fail(message, status=2):
    raise Failure(message, status)


class Settings:
    """The command line, parsed."""

    def __init__(self, command):
        self.command = command
        self.spec = self.name = self.vpc = self.subnets = self.profile = ""
        self.release_url = self.key_name = self.work = self.account = self.endpoint_url = ""
        self.ami = "debian-12"
        self.region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or ""
        self.scheduler_type, self.server_type = "t3.medium", "r6i.xlarge"
        self.worker_types, self.worker_market = "g5.xlarge", "spot"
        self.log_retention = "14"
        self.workers_wanted = self.servers_wanted = ""
        self.dry_run = self.tls = self.public_ip = self.keep_logs = self.resume = False
        self.job = True

    def names(self):
        """The cluster's resource names, all derived from --name."""
        self.parameters = f"/paramserver/{self.name}"
        self.role_name = f"ps-{self.name}-node"
        self.group_name = f"ps-{self.name}"
        self.template_name = f"ps-{self.name}-worker"
        self.asg_name = f"ps-{self.name}-workers"
        self.log_group = f"/paramserver/{self.name}"


def parse_command_line(argv):
    """Settings from argv; prints the usage and exits for --help or a bad command."""
    command = argv[0] if argv else ""
    if command in ("-h", "--help", "help"):
        sys.stdout.write(USAGE)
        sys.exit(0)
    if not command:
        sys.stderr.write(USAGE)
        sys.exit(2)
    if command not in COMMAND_USAGES:
        sys.stderr.write(f"{PROGRAM}: unknown command '{command}'\n" + USAGE)
        sys.exit(2)
    settings = Settings(command)
    args = argv[1:]
    while args:
        arg = args.pop(0)
        if arg in ("-h", "--help"):
            sys.stdout.write(COMMAND_USAGES[command])
            sys.exit(0)
        elif arg in OPTIONS:
            if not args:
                fail(f"{arg} needs a value ({PROGRAM} {command} --help lists them)")
            setattr(settings, OPTIONS[arg], args.pop(0))
        elif arg in FLAGS:
            setattr(settings, *FLAGS[arg])
        else:
            sys.stderr.write(f"{PROGRAM} {command}: unknown argument {arg} "
                             f"({PROGRAM} {command} --help lists them)\n")
            sys.exit(2)
    if not settings.name:
        fail("--name is required")
    if not re.fullmatch(r"[a-zA-Z0-9-]{1,40}", settings.name):
        fail("--name may hold letters, digits and '-' only (at most 40)")
    if not settings.region:
        fail("--region is required (or set AWS_REGION)")
    settings.names()
    return settings


def load_spec(path):
    if not os.access(path, os.R_OK):
        fail(f"{path}: cannot read the spec")
    try:
        return cluster_spec.load(path)
    except cluster_spec.SpecError as e:
        fail(str(e))
