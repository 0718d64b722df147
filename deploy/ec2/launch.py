#!/usr/bin/python3
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
This file holds the commands down, scale, status and policy, and main; beside it lie the
command line (launch_cli.py), what `up` makes as data: policies, tags, user data, TLS
material (launch_documents.py), and the `up` command (launch_up.py).
"""
import base64
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# deploy/cluster_spec.py beside deploy/ec2/ in the repository; in the release both lie
# in share/paramserver/.
sys.path[:0] = [HERE, os.path.dirname(HERE)]
import aws_clients  # noqa: E402  (deploy/ec2/aws_clients.py)
import cluster_spec  # noqa: E402  (deploy/cluster_spec.py)
from launch_cli import PROGRAM, Failure, fail, load_spec, parse_command_line  # noqa: E402
from launch_documents import (SECRETS, SSM_CORE, account_id, policy_document,  # noqa: E402
                              tag_specification)
from launch_up import run_up  # noqa: E402

PSCTL = "PSCTL_CLUSTER_TOKEN_FILE=/etc/ps/cluster.token /opt/paramserver/bin/psctl --scheduler 127.0.0.1:7000"
TLS_FLAGS = ("--tls_ca /etc/ps/tls/ca.pem --tls_cert /etc/ps/tls/node.pem "
             "--tls_key /etc/ps/tls/node.key --tls_server_name paramserver")


def run_policy(settings, aws):
    if not settings.spec:
        fail("--spec is required")
    spec = load_spec(settings.spec)
    print(json.dumps(policy_document(settings, spec, account_id(settings, aws)), indent=2))


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

    def attempt_to(what, function, *args, **params):
        """function(*args, **params), or None with `what` and the error noted in failed."""
        try:
            return function(*args, **params)
        except aws.errors as e:
            failed.append(f"{what}: {e}")
            return None

    def attempt(what, service, operation, **params):
        return attempt_to(what, lambda: getattr(aws.client(service), operation)(**params))

    attempt("delete the workers' group", "autoscaling", "delete_auto_scaling_group",
            AutoScalingGroupName=settings.asg_name, ForceDelete=True)
    found = attempt_to("find the instances", cluster_instances, settings, aws,
                       ["pending", "running", "stopping", "stopped"])
    ids = [i["InstanceId"] for i in found or []]
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
        # Each a failure (exit 1): the server, not the command line, lacks it.
        for what, present in (("image and instance type", template.get("ImageId") and template.get("InstanceType")),
                              ("subnet", template.get("SubnetId")),
                              ("security group", (template.get("SecurityGroups") or [{}])[0].get("GroupId")),
                              ("instance profile", (template.get("IamInstanceProfile") or {}).get("Arn"))):
            if not present:
                fail(f"server {template_id} has no {what} to start another like it", 1)
        user_data = ec2.describe_instance_attribute(InstanceId=template_id, Attribute="userData")
        encoded = user_data.get("UserData", {}).get("Value")
        if not encoded:
            fail(f"cannot read the user data of server {template_id}", 1)
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


def main(argv):
    try:
        settings = parse_command_line(argv)
        aws = aws_clients.AwsClients(settings.region, settings.endpoint_url, settings.dry_run)
        {"up": run_up, "down": run_down, "scale": run_scale, "status": run_status,
         "policy": run_policy}[settings.command](settings, aws)
        return 0
    except Failure as e:
        print(f"{PROGRAM}: {e}", file=sys.stderr)
        return e.status
    except aws_clients.ERRORS as e:  # an AWS call failed: its service's words
        print(f"{PROGRAM}: {e}", file=sys.stderr)
        return 1
    except cluster_spec.SpecError as e:  # the spec, wherever it was read
        print(f"{PROGRAM}: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a file or folder it could not write or read
        where = f"{e.filename}: " if e.filename else ""
        print(f"{PROGRAM}: {where}{e.strerror or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROGRAM}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
