#!/usr/bin/env python3
"""Launches, resizes, watches and tears down one paramserver cluster on EC2 with boto3
(Debian's python3-boto3). `launch.py --help` and `launch.py COMMAND --help` describe every
option; docs/DEPLOY_EC2.md walks through a whole job. What `up` makes, all named after
--name and tagged Cluster=<name>, and what `down` removes again:
  - SSM Parameter Store SecureStrings /paramserver/<name>/: cluster-token, admin-token,
    and with --tls tls-ca, tls-cert, tls-key (made here, sent to SSM in the request body,
    never written to a file or a command line; read at boot by each instance's role);
  - an IAM role and instance profile ps-<name>-node whose policy grants exactly: those
    parameters, KMS decryption through SSM only, the spec's s3:// prefixes, this
    cluster's log group, CloudWatch metrics in the paramserver namespaces, and SSM
    sessions (AmazonSSMManagedInstanceCore, for port forwarding and `status`);
  - a security group ps-<name> opening the cluster's ports to its members only;
  - a cluster placement group ps-<name> for the servers (where the family allows one);
  - a CloudWatch log group /paramserver/<name>;
  - the scheduler and `cluster.servers` servers: on-demand instances;
  - a launch template ps-<name>-worker and an Auto Scaling group ps-<name>-workers of
    `cluster.workers` workers: spot by default (mixed instance types, capacity
    rebalancing), so a reclaimed worker is replaced and the newcomer takes its rank.
Each instance boots with deploy/ec2/cloud-init.yaml.tmpl and deploy/ec2/ps-bootstrap.sh.
--dry-run prints each AWS call (service, operation, its parameters as JSON) instead of
sending it: botocore validates and serializes the call, then a before-call handler
answers it (deploy/ec2/aws_clients.py); where one call's output feeds a later one, a
made-up value stands in for it (sg-DRYRUN, 10.0.0.10).
"""
import base64
import gzip
import json
import os
import re
import secrets
import shlex
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# deploy/cluster_spec.py beside deploy/ec2/ in the repository; in the release both lie
# in share/paramserver/.
sys.path[:0] = [HERE, os.path.dirname(HERE)]
import aws_clients  # noqa: E402  (deploy/ec2/aws_clients.py)
import cluster_spec  # noqa: E402  (deploy/cluster_spec.py)

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
SECRETS = ("cluster-token", "admin-token", "tls-ca", "tls-cert", "tls-key")
SSM_CORE = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"
PSCTL = "PSCTL_CLUSTER_TOKEN_FILE=/etc/ps/cluster.token /opt/paramserver/bin/psctl --scheduler 127.0.0.1:7000"
TLS_FLAGS = ("--tls_ca /etc/ps/tls/ca.pem --tls_cert /etc/ps/tls/node.pem "
             "--tls_key /etc/ps/tls/node.key --tls_server_name paramserver")


class Failure(Exception):
    """A refusal: printed as "launch.py: MESSAGE", exit status 2."""


def fail(message):
    raise Failure(message)


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


# ---------------------------------------------------------------- what up makes, as data


def policy_document(settings, spec, account):
    """The IAM policy of this cluster's instances."""
    region, log_group = settings.region, settings.log_group
    statements = [
        {"Sid": "ReadThisClustersSecrets", "Effect": "Allow", "Action": "ssm:GetParameter",
         "Resource": f"arn:aws:ssm:{region}:{account}:parameter{settings.parameters}/*"},
        {"Sid": "DecryptThroughSsmOnly", "Effect": "Allow", "Action": "kms:Decrypt",
         "Resource": f"arn:aws:kms:{region}:{account}:key/*",
         "Condition": {"StringEquals": {"kms:ViaService": f"ssm.{region}.amazonaws.com"}}},
        {"Sid": "WriteThisClustersLogs", "Effect": "Allow",
         "Action": ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams",
                    "logs:CreateLogGroup"],
         "Resource": [f"arn:aws:logs:{region}:{account}:log-group:{log_group}:*",
                      f"arn:aws:logs:{region}:{account}:log-group:{log_group}/prometheus:*"]},
        {"Sid": "PutParamserverMetrics", "Effect": "Allow", "Action": "cloudwatch:PutMetricData",
         "Resource": "*", "Condition": {"StringLike": {"cloudwatch:namespace": "paramserver*"}}},
        {"Sid": "CloudWatchAgentLookups", "Effect": "Allow",
         "Action": ["ec2:DescribeTags", "ec2:DescribeVolumes"], "Resource": "*"},
    ]
    for n, (mode, bucket, prefix) in enumerate(cluster_spec.s3_prefixes(spec), 1):
        write = mode == "write"
        statements.append(
            {"Sid": f"ListSpecPrefix{n}", "Effect": "Allow", "Action": "s3:ListBucket",
             "Resource": f"arn:aws:s3:::{bucket}",
             "Condition": {"StringLike": {"s3:prefix": [prefix, f"{prefix}/*"]}}})
        statements.append(
            {"Sid": f"{'ReadWrite' if write else 'Read'}SpecPrefix{n}", "Effect": "Allow",
             "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"] if write else ["s3:GetObject"],
             "Resource": f"arn:aws:s3:::{bucket}/{prefix + '/' if prefix else ''}*"})
    return {"Version": "2012-10-17", "Statement": statements}


TRUST_POLICY = {"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}


def tags(settings, **more):
    return [{"Key": "Cluster", "Value": settings.name}] + [{"Key": k, "Value": v} for k, v in more.items()]


def tag_specification(settings, resource_type, **more):
    return [{"ResourceType": resource_type, "Tags": tags(settings, **more)}]


def is_gpu_type(instance_type):
    return re.match(r"(g[0-9]|p[0-9])", instance_type) is not None


def render_user_data(settings, spec, role, scheduler_address):
    """The gzipped cloud-config of `role` (its spec naming the scheduler at
    `scheduler_address`), also written to WORK/user-data-ROLE.yaml(.gz)."""
    port = {"scheduler": 9100, "server": 9101, "worker": 9102}[role]
    gpu = role == "worker" and any(is_gpu_type(t) for t in settings.worker_types.split(","))
    env = (f"CLUSTER={settings.name}\nROLE={role}\nREGION={settings.region}\n"
           f"RELEASE_URL={shlex.quote(settings.release_url)}\nPARAMETERS={settings.parameters}\n"
           f"GPU={int(gpu)}\nTLS={int(settings.tls)}\nLOG_GROUP={settings.log_group}\nMETRICS_PORT={port}\n")

    def b64(data):
        return base64.b64encode(data if isinstance(data, bytes) else data.encode()).decode()

    with open(os.path.join(HERE, "ps-bootstrap.sh"), "rb") as f:
        bootstrap = f.read()
    with open(os.path.join(HERE, "cloud-init.yaml.tmpl")) as f:
        text = f.read()
    spec_text = cluster_spec.rendered_text(spec, scheduler_address, settings.resume)
    text = (text.replace("@BOOTSTRAP_ENV_B64@", b64(env)).replace("@CLUSTER_YAML_B64@", b64(spec_text))
            .replace("@BOOTSTRAP_B64@", b64(bootstrap)))
    path = os.path.join(settings.work, f"user-data-{role}.yaml")
    with open(path, "w") as f:
        f.write(text)
    # EC2 takes at most 16 KB of user data: cloud-init reads it gzipped as well.
    data = gzip.compress(text.encode(), compresslevel=9, mtime=0)
    with open(path + ".gz", "wb") as f:
        f.write(data)
    return data


def write_json(settings, name, document):
    with open(os.path.join(settings.work, name), "w") as f:
        json.dump(document, f, indent=2)
        f.write("\n")


def make_tls_material(settings):
    """A CA and a certificate for the name paramserver: {tls-ca, tls-cert, tls-key}."""
    with tempfile.TemporaryDirectory() as folder:  # mode 0700, removed with its keys
        def openssl(*args):
            subprocess.run(["openssl", *args], cwd=folder, check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        openssl("req", "-x509", "-newkey", "rsa:3072", "-nodes", "-days", "365",
                "-subj", f"/CN=paramserver {settings.name} CA", "-keyout", "ca.key", "-out", "ca.pem")
        openssl("req", "-newkey", "rsa:3072", "-nodes", "-subj", "/CN=paramserver",
                "-keyout", "node.key", "-out", "node.csr")
        with open(os.path.join(folder, "node.ext"), "w") as f:
            f.write("subjectAltName=DNS:paramserver\nextendedKeyUsage=serverAuth,clientAuth\n")
        openssl("x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "365", "-extfile", "node.ext", "-out", "node.pem")
        material = {}
        for name, file_name in (("tls-ca", "ca.pem"), ("tls-cert", "node.pem"), ("tls-key", "node.key")):
            with open(os.path.join(folder, file_name)) as f:
                material[name] = f.read()
        return material


# ---------------------------------------------------------------- commands


def account_id(settings, aws):
    return settings.account or aws.client("sts").get_caller_identity()["Account"]


def run_policy(settings, aws):
    if not settings.spec:
        fail("--spec is required")
    spec = load_spec(settings.spec)
    print(json.dumps(policy_document(settings, spec, account_id(settings, aws)), indent=2))


def load_spec(path):
    if not os.access(path, os.R_OK):
        fail(f"{path}: cannot read the spec")
    try:
        return cluster_spec.load(path)
    except cluster_spec.SpecError as e:
        fail(str(e))


def cluster_instances(settings, aws, states, role=None):
    """The cluster's instances in `states` (of `role`), as the API describes them."""
    filters = [{"Name": "tag:Cluster", "Values": [settings.name]}]
    if role:
        filters.append({"Name": "tag:Role", "Values": [role]})
    filters.append({"Name": "instance-state-name", "Values": list(states)})
    found = []
    for page in aws.client("ec2").get_paginator("describe_instances").paginate(Filters=filters):
        for reservation in page.get("Reservations", []):
            found.extend(reservation.get("Instances", []))
    return found


def role_of(instance):
    return next((t["Value"] for t in instance.get("Tags", []) if t["Key"] == "Role"), "")


def run_on_scheduler(settings, aws, command, comment, attempts):
    """(status, output) of `command` run on the scheduler through SSM Run Command, polled
    once a second up to `attempts` times."""
    running = cluster_instances(settings, aws, ["running"], "scheduler")
    if not running:
        fail(f"no running scheduler instance in cluster {settings.name}")
    scheduler = running[0]["InstanceId"]
    ssm = aws.client("ssm")
    command_id = ssm.send_command(InstanceIds=[scheduler], DocumentName="AWS-RunShellScript",
                                  Comment=comment, Parameters={"commands": [command]})["Command"]["CommandId"]
    status, output = "", ""
    for _ in range(attempts):
        try:
            answer = ssm.get_command_invocation(CommandId=command_id, InstanceId=scheduler)
            status, output = answer.get("Status", ""), answer.get("StandardOutputContent", "")
        except aws.client_error as e:  # InvocationDoesNotExist, just after send_command
            status, output = "", str(e)
        if status not in ("Pending", "InProgress", "Delayed", ""):
            break
        if not settings.dry_run:
            time.sleep(1)
    return status, output


def run_down(settings, aws):
    failed = []

    def attempt(what, service, operation, **params):
        try:
            return getattr(aws.client(service), operation)(**params)
        except aws.errors as e:
            failed.append(f"{what}: {e}")
            return None

    attempt("delete the workers' group", "autoscaling", "delete_auto_scaling_group",
            AutoScalingGroupName=settings.asg_name, ForceDelete=True)
    ids = [i["InstanceId"] for i in cluster_instances(settings, aws, ["pending", "running", "stopping", "stopped"])]
    if ids:
        if attempt("terminate the instances", "ec2", "terminate_instances", InstanceIds=ids) is not None:
            try:
                aws.client("ec2").get_waiter("instance_terminated").wait(InstanceIds=ids)
            except aws.errors as e:
                failed.append(f"wait for them to end: {e}")
    attempt("delete the launch template", "ec2", "delete_launch_template", LaunchTemplateName=settings.template_name)
    attempt("delete the placement group", "ec2", "delete_placement_group", GroupName=settings.group_name)
    groups = attempt("find the security group", "ec2", "describe_security_groups",
                     Filters=[{"Name": "group-name", "Values": [settings.group_name]}])
    for group in (groups or {}).get("SecurityGroups", []):
        attempt("delete the security group", "ec2", "delete_security_group", GroupId=group["GroupId"])
    attempt("delete the secrets", "ssm", "delete_parameters",
            Names=[f"{settings.parameters}/{secret}" for secret in SECRETS])
    role = settings.role_name
    attempt("detach SSM sessions from the role", "iam", "detach_role_policy", RoleName=role, PolicyArn=SSM_CORE)
    attempt("delete the role's policy", "iam", "delete_role_policy", RoleName=role, PolicyName=role)
    attempt("take the role out of the instance profile", "iam", "remove_role_from_instance_profile",
            InstanceProfileName=role, RoleName=role)
    attempt("delete the instance profile", "iam", "delete_instance_profile", InstanceProfileName=role)
    attempt("delete the role", "iam", "delete_role", RoleName=role)
    if not settings.keep_logs:
        attempt("delete the log group", "logs", "delete_log_group", logGroupName=settings.log_group)
    print(f"cluster {settings.name}: removed the workers' group {settings.asg_name}, "
          f"instances [{' '.join(ids)}], the launch template,")
    print(f"  placement and security groups, the secrets under {settings.parameters}, the role "
          f"{role}{'' if settings.keep_logs else ', the log group ' + settings.log_group}")
    if failed:
        print("not everything went (a resource `up` did not make, e.g. with --instance-profile, is expected here):")
        for line in failed:
            print(f"  {line}")


def run_scale_servers(settings, aws):
    if settings.workers_wanted:
        fail("scale takes --workers or --servers, not both")
    if not settings.servers_wanted.isdigit() or int(settings.servers_wanted) < 1:
        fail("--servers N needs a count >= 1")
    wanted = int(settings.servers_wanted)
    servers = cluster_instances(settings, aws, ["pending", "running"], "server")
    count = len(servers)
    if count == 0:
        fail(f"no running server instance in cluster {settings.name} (is the cluster up?)")
    ec2 = aws.client("ec2")
    if wanted > count:
        # Like the first running server: its launch settings and user data.
        template_id = servers[0]["InstanceId"]
        described = ec2.describe_instances(InstanceIds=[template_id])["Reservations"]
        template = described[0]["Instances"][0] if described and described[0].get("Instances") else {}
        if not template.get("ImageId") or not template.get("InstanceType"):
            fail(f"cannot read the launch settings of server {template_id}")
        user_data = ec2.describe_instance_attribute(InstanceId=template_id, Attribute="userData")
        encoded = user_data.get("UserData", {}).get("Value")
        if not encoded:
            fail(f"cannot read the user data of server {template_id}")
        group = template["SecurityGroups"][0]["GroupId"]
        params = dict(ImageId=template["ImageId"], InstanceType=template["InstanceType"],
                      MinCount=wanted - count, MaxCount=wanted - count,
                      IamInstanceProfile={"Arn": template["IamInstanceProfile"]["Arn"]},
                      MetadataOptions={"HttpTokens": "required", "HttpEndpoint": "enabled"},
                      TagSpecifications=tag_specification(settings, "instance", Role="server",
                                                          Name=f"ps-{settings.name}-server"),
                      UserData=base64.b64decode(encoded))
        if template.get("PublicIpAddress"):
            params["NetworkInterfaces"] = [{"DeviceIndex": 0, "SubnetId": template["SubnetId"],
                                            "Groups": [group], "AssociatePublicIpAddress": True}]
        else:
            params.update(SubnetId=template["SubnetId"], SecurityGroupIds=[group])
        if template.get("KeyName"):
            params["KeyName"] = template["KeyName"]
        if (template.get("Placement") or {}).get("GroupName"):
            params["Placement"] = {"GroupName": template["Placement"]["GroupName"]}
        started = [i["InstanceId"] for i in ec2.run_instances(**params)["Instances"]]
        print(f"cluster {settings.name}: servers {count} -> {wanted}: started {' '.join(started)} "
              f"(on-demand {template['InstanceType']}, like {template_id})")
        print("  each joins in a new slot, up to cluster.servers' max, and takes a fair share of the shards live")
    elif wanted < count:
        psctl = f"{PSCTL} --token-file /etc/ps/admin.token"
        tls = f"if [ -d /etc/ps/tls ]; then t='{TLS_FLAGS}'; fi"
        print(f"cluster {settings.name}: servers {count} -> {wanted}: draining on the scheduler (psctl scale)")
        # `nodes` runs even if the scale stopped partway: whatever was drained is terminated.
        command = f"{tls}; {psctl} $t --servers {wanted} scale 2>&1; {psctl} $t nodes"
        status, output = run_on_scheduler(settings, aws, command, f"{PROGRAM} scale", 600)
        if status != "Success":
            fail(f"on the scheduler: {command}: {status or 'no answer'} {output}".rstrip())
        for line in output.splitlines():
            print(f"  {line}")
        # The drained servers' addresses (psctl nodes: NAME ROLE ADDRESS HEALTH ...), then
        # the instances at them.
        drained = {fields[2].split(":")[0] for fields in (line.split() for line in output.splitlines())
                   if len(fields) >= 4 and fields[1] == "server" and fields[3] == "drained"}
        ids = [s["InstanceId"] for s in servers if s.get("PrivateIpAddress") in drained]
        if ids:
            ec2.terminate_instances(InstanceIds=ids)
            print(f"  terminated {' '.join(ids)} (drained)")
    else:
        print(f"cluster {settings.name}: {count} servers already")


def run_scale(settings, aws):
    if settings.servers_wanted:
        return run_scale_servers(settings, aws)
    if not settings.workers_wanted.isdigit():
        fail("--workers N or --servers N is required (a count)")
    wanted = int(settings.workers_wanted)
    autoscaling = aws.client("autoscaling")
    groups = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[settings.asg_name])["AutoScalingGroups"]
    if not groups:
        fail(f"no workers' group {settings.asg_name} in {settings.region} (is the cluster up?)")
    most, desired = groups[0]["MaxSize"], groups[0]["DesiredCapacity"]
    if wanted > most:
        fail(f"the spec has {most} worker ranks (cluster.workers, a range's max); a worker beyond them "
             "has no rank to take and would be turned away")
    autoscaling.update_auto_scaling_group(AutoScalingGroupName=settings.asg_name, MinSize=wanted,
                                          DesiredCapacity=wanted)
    print(f"cluster {settings.name}: workers {desired} -> {wanted} (of {most} ranks)")
    if wanted < desired:
        print("  the removed workers leave the job; sync steps complete without them, skipping their share of the data")
    elif wanted > desired:
        print("  each new worker takes a vacant rank, or a new one up to cluster.workers' max, and trains at once "
              "(sync: each step's mean is over the workers present)")


def run_status(settings, aws):
    instances = cluster_instances(settings, aws, ["pending", "running", "stopping", "stopped"])
    rows = sorted(([i["InstanceId"], role_of(i), i.get("InstanceType", ""), i.get("InstanceLifecycle", "on-demand"),
                    i.get("State", {}).get("Name", ""), i.get("PrivateIpAddress", "")] for i in instances),
                  key=lambda row: (row[1], row[0]))
    print(f"cluster {settings.name} ({settings.region})")
    table = [["INSTANCE", "ROLE", "TYPE", "MARKET", "STATE", "ADDRESS"]] + rows
    widths = [max(len(row[c]) for row in table) for c in range(6)]
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    try:
        groups = aws.client("autoscaling").describe_auto_scaling_groups(
            AutoScalingGroupNames=[settings.asg_name])["AutoScalingGroups"]
    except aws.errors:
        groups = []
    if groups:
        group = groups[0]
        in_service = sum(1 for i in group.get("Instances", []) if i.get("LifecycleState") == "InService")
        print(f"workers' group {settings.asg_name}: {in_service} in service of {group['DesiredCapacity']} "
              f"wanted (max {group['MaxSize']})")
    else:
        print(f"workers' group {settings.asg_name}: ? in service of ? wanted (max ?)")
    scheduler = next((row[0] for row in rows if row[1] == "scheduler" and row[4] == "running"), None)
    if settings.job and scheduler:
        command = (f"if [ -d /etc/ps/tls ]; then {PSCTL} {TLS_FLAGS} status; else {PSCTL} status; fi")
        _, output = run_on_scheduler(settings, aws, command, f"{PROGRAM} status", 30)
        print("job (psctl status on the scheduler):")
        for line in output.splitlines() or [""]:
            print(f"  {line}")


def check_up_options(settings):
    for option, value in (("--spec", settings.spec), ("--vpc", settings.vpc), ("--subnet", settings.subnets),
                          ("--release-url", settings.release_url)):
        if not value:
            fail(f"{option} is required ({PROGRAM} up --help lists every option)")
    spec = load_spec(settings.spec)
    if settings.worker_market not in ("spot", "on-demand"):
        fail(f"--worker-market is spot or on-demand, not {settings.worker_market}")
    if not settings.log_retention.isdigit():
        fail(f"--log-retention-days needs a number of days, not {settings.log_retention}")
    if cluster_spec.scheduler(spec) is None:
        fail(f"{settings.spec}: cluster.scheduler is required (the launcher fills in the scheduler's address there)")
    relative = cluster_spec.relative_output_paths(spec)
    if relative:
        named = " ".join(f"{key} {path}" for key, path in relative)
        print(f"{PROGRAM}: warning: {settings.spec} names relative output paths ({named}); on the instances "
              "they resolve under /etc/ps, which the units cannot write: give /var/lib/ps/... or s3://... "
              "(the daemons refuse them at start)", file=sys.stderr)
    return spec


def check_resume(settings, spec, aws):
    checkpoints = cluster_spec.checkpoint_dir(spec)
    if not checkpoints.startswith("s3://"):
        fail("--resume: checkpoint.dir must be an s3:// prefix (the instances' own disks are lost with them); "
             f"{settings.spec} has '{checkpoints}'")
    # Completeness (every shard at one step) is the scheduler's to check at start.
    bucket, _, prefix = checkpoints[len("s3://"):].rstrip("/").partition("/")
    found = False
    try:
        pages = aws.client("s3").get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
        found = any(re.fullmatch(r"shard-[0-9]+-step-[0-9]+\.ckpt", o["Key"].rpartition("/")[2])
                    for page in pages for o in page.get("Contents", []))
    except aws.errors:
        pass
    if not found and not settings.dry_run:
        fail(f"--resume: {checkpoints.rstrip('/')}/ holds no checkpoint (shard-N-step-S.ckpt) to resume from")
    return checkpoints


def run_instances(settings, aws, **params):
    """ec2 RunInstances, retried while IAM has not yet spread a new instance profile (it
    takes a few seconds after it exists: "Invalid IAM Instance Profile name")."""
    for attempt in range(8):
        try:
            return aws.client("ec2").run_instances(**params)["Instances"]
        except aws.client_error as e:
            if "Invalid IAM Instance Profile" not in str(e) or attempt == 7:
                raise
            time.sleep(5)


def run_up(settings, aws):
    spec = check_up_options(settings)
    servers, workers, workers_max = cluster_spec.servers(spec), cluster_spec.workers(spec), cluster_spec.max_workers(spec)
    subnets, worker_types = settings.subnets.split(","), settings.worker_types.split(",")
    checkpoints = check_resume(settings, spec, aws) if settings.resume else ""
    if not settings.work:
        settings.work = tempfile.mkdtemp(prefix=f"ps-{settings.name}.")
    os.makedirs(settings.work, exist_ok=True)
    account = account_id(settings, aws)
    ec2 = aws.client("ec2")
    ami = settings.ami
    if ami == "debian-12":
        images = ec2.describe_images(Owners=["136693071363"], Filters=[
            {"Name": "name", "Values": ["debian-12-amd64-*"]}, {"Name": "state", "Values": ["available"]}])["Images"]
        if not images:
            fail(f"found no Debian 12 AMI in {settings.region}; give --ami")
        ami = max(images, key=lambda image: image.get("CreationDate", ""))["ImageId"]

    # 1. The secrets: made here, sent to SSM encrypted, never written to disk.
    values = {"cluster-token": secrets.token_hex(32), "admin-token": secrets.token_hex(32)}
    if settings.tls:
        values.update(make_tls_material(settings))
    for secret, value in values.items():
        aws.client("ssm").put_parameter(Name=f"{settings.parameters}/{secret}", Type="SecureString",
                                        Overwrite=True, Value=value)
    del values

    # 2. The instances' role, scoped to this cluster.
    profile_made = not settings.profile
    if profile_made:
        settings.profile = role = settings.role_name
        policy = policy_document(settings, spec, account)
        write_json(settings, "policy.json", policy)
        iam = aws.client("iam")
        iam.create_role(RoleName=role, AssumeRolePolicyDocument=json.dumps(TRUST_POLICY), Tags=tags(settings))
        iam.put_role_policy(RoleName=role, PolicyName=role, PolicyDocument=json.dumps(policy))
        iam.attach_role_policy(RoleName=role, PolicyArn=SSM_CORE)
        iam.create_instance_profile(InstanceProfileName=role)
        iam.add_role_to_instance_profile(InstanceProfileName=role, RoleName=role)
        iam.get_waiter("instance_profile_exists").wait(InstanceProfileName=role)

    # 3. The network: the cluster's ports open to its members only.
    group = ec2.create_security_group(
        GroupName=settings.group_name, Description=f"paramserver cluster {settings.name}: its ports, open only "
        "to its members", VpcId=settings.vpc, TagSpecifications=tag_specification(settings, "security-group"))["GroupId"]
    ec2.authorize_security_group_ingress(GroupId=group, IpPermissions=[
        {"IpProtocol": "tcp", "FromPort": low, "ToPort": high, "UserIdGroupPairs": [{"GroupId": group}]}
        for low, high in ((7000, 7002), (9100, 9102))])
    placement = not settings.server_type.startswith("t")
    if placement:
        ec2.create_placement_group(GroupName=settings.group_name, Strategy="cluster",
                                   TagSpecifications=tag_specification(settings, "placement-group"))
    logs = aws.client("logs")
    logs.create_log_group(logGroupName=settings.log_group, tags={"Cluster": settings.name})
    logs.put_retention_policy(logGroupName=settings.log_group, retentionInDays=int(settings.log_retention))

    # 4. The scheduler and the servers: on-demand.
    def instance_params(role, instance_type, count):
        params = dict(ImageId=ami, InstanceType=instance_type, MinCount=count, MaxCount=count,
                      IamInstanceProfile={"Name": settings.profile},
                      MetadataOptions={"HttpTokens": "required", "HttpEndpoint": "enabled"},
                      TagSpecifications=tag_specification(settings, "instance", Role=role,
                                                          Name=f"ps-{settings.name}-{role}"))
        if settings.public_ip:
            params["NetworkInterfaces"] = [{"DeviceIndex": 0, "SubnetId": subnets[0], "Groups": [group],
                                            "AssociatePublicIpAddress": True}]
        else:
            params.update(SubnetId=subnets[0], SecurityGroupIds=[group])
        if settings.key_name:
            params["KeyName"] = settings.key_name
        return params

    scheduler = run_instances(settings, aws, **instance_params("scheduler", settings.scheduler_type, 1),
                              UserData=render_user_data(settings, spec, "scheduler", "0.0.0.0:7000"))
    scheduler_address = f"{scheduler[0]['PrivateIpAddress']}:7000"
    server_params = instance_params("server", settings.server_type, servers)
    if placement:
        server_params["Placement"] = {"GroupName": settings.group_name}
    server_ids = [i["InstanceId"] for i in run_instances(
        settings, aws, **server_params, UserData=render_user_data(settings, spec, "server", scheduler_address))]

    # 5. The workers: a launch template and an Auto Scaling group over every subnet.
    worker_user_data = render_user_data(settings, spec, "worker", scheduler_address)
    template = {"ImageId": ami, "InstanceType": worker_types[0], "IamInstanceProfile": {"Name": settings.profile},
                "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
                "UserData": base64.b64encode(worker_user_data).decode(),
                "TagSpecifications": tag_specification(settings, "instance", Role="worker",
                                                       Name=f"ps-{settings.name}-worker")}
    if settings.public_ip:
        template["NetworkInterfaces"] = [{"DeviceIndex": 0, "AssociatePublicIpAddress": True, "Groups": [group]}]
    else:
        template["SecurityGroupIds"] = [group]
    if settings.key_name:
        template["KeyName"] = settings.key_name
    write_json(settings, "launch-template.json", template)
    ec2.create_launch_template(LaunchTemplateName=settings.template_name, LaunchTemplateData=template,
                               TagSpecifications=tag_specification(settings, "launch-template"))
    mixed = {"LaunchTemplate": {"LaunchTemplateSpecification": {"LaunchTemplateName": settings.template_name,
                                                                "Version": "$Latest"},
                                "Overrides": [{"InstanceType": t} for t in worker_types]},
             "InstancesDistribution": {"OnDemandBaseCapacity": 0,
                                       "OnDemandPercentageAboveBaseCapacity":
                                           100 if settings.worker_market == "on-demand" else 0,
                                       "SpotAllocationStrategy": "price-capacity-optimized"}}
    write_json(settings, "mixed-instances.json", mixed)
    aws.client("autoscaling").create_auto_scaling_group(
        AutoScalingGroupName=settings.asg_name, MinSize=workers, MaxSize=workers_max, DesiredCapacity=workers,
        VPCZoneIdentifier=settings.subnets, CapacityRebalance=True, MixedInstancesPolicy=mixed,
        Tags=[{"ResourceId": settings.asg_name, "ResourceType": "auto-scaling-group", "Key": "Cluster",
               "Value": settings.name, "PropagateAtLaunch": True}])

    made = f" (made here; its policy: {settings.work}/policy.json)" if profile_made else ""
    region, name = settings.region, settings.name
    lines = [
        f"cluster {name} started in {region} (user data, policy and templates in {settings.work}):",
        f"  secrets         SSM SecureStrings {settings.parameters}/{{{','.join(SECRETS if settings.tls else SECRETS[:2])}}}",
        f"  instance role   {settings.profile}{made}",
        f"  security group  {group} (tcp 7000-7002 and 9100-9102 from its members only)",
        f"  scheduler       1 x {settings.scheduler_type} (on-demand) at {scheduler_address}",
        f"  servers         {servers} x {settings.server_type} (on-demand"
        f"{', placement group ' + settings.group_name if placement else ''}): {' '.join(server_ids)}",
        f"  workers         {workers} x {' or '.join(worker_types)} ({settings.worker_market}, group "
        f"{settings.asg_name}, capacity rebalancing{f', scales to {workers_max}' if workers_max > workers else ''})",
        f"  logs            CloudWatch log group {settings.log_group}; metrics in the namespaces paramserver, "
        "paramserver/host"]
    if settings.resume:
        lines.append(f"  resumes from    the newest complete checkpoint in {checkpoints}")
    lines += [
        f"watch it:  deploy/ec2/launch.py status --name {name} --region {region}",
        f"admin:     aws ssm get-parameter --region {region} --with-decryption --name "
        f"{settings.parameters}/admin-token --query Parameter.Value --output text > admin.token",
        f"stop it:   deploy/ec2/launch.py down --name {name} --region {region}"]
    print("\n".join(lines))


def main(argv):
    try:
        settings = parse_command_line(argv)
        aws = aws_clients.AwsClients(settings.region, settings.endpoint_url, settings.dry_run)
        {"up": run_up, "down": run_down, "scale": run_scale, "status": run_status,
         "policy": run_policy}[settings.command](settings, aws)
        return 0
    except Failure as e:
        print(f"{PROGRAM}: {e}", file=sys.stderr)
        return 2
    except aws_clients.ERRORS as e:  # an AWS call failed: its service's words
        print(f"{PROGRAM}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
