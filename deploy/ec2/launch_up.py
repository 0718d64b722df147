"""The `up` command of deploy/ec2/launch.py: its options checked, --resume's checkpoint
looked for, then the cluster made in order: the secrets, the instances' role, the
network, the log group, the scheduler and the servers, and the workers' launch template
and Auto Scaling group; then a summary of what was made and how to watch and stop it.
"""
import base64
import json
import os
import re
import secrets
import sys
import tempfile
import time

import cluster_spec  # deploy/cluster_spec.py (launch.py puts its folder on sys.path)
from launch_cli import PROGRAM, fail, load_spec
from launch_documents import (SECRETS, SSM_CORE, TRUST_POLICY, account_id, make_tls_material,
                              policy_document, render_user_data, tag_specification, tags, write_json)


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
    if settings.resume and not cluster_spec.checkpoint_dir(spec).startswith("s3://"):
        fail("--resume: checkpoint.dir must be an s3:// prefix (the instances' own disks are lost with them); "
             f"{settings.spec} has '{cluster_spec.checkpoint_dir(spec)}'")
    # The spec the instances get, rendered now (the address does not change whether it
    # can be): one the launcher cannot rewrite is refused (SpecError: main's one line,
    # exit 2) before any AWS call, not after the secrets and the role were made.
    cluster_spec.rendered_text(spec, "0.0.0.0:7000", settings.resume)
    relative = cluster_spec.relative_output_paths(spec)
    if relative:
        named = " ".join(f"{key} {path}" for key, path in relative)
        print(f"{PROGRAM}: warning: {settings.spec} names relative output paths ({named}); on the instances "
              "they resolve under /etc/ps, which the units cannot write: give /var/lib/ps/... or s3://... "
              "(the daemons refuse them at start)", file=sys.stderr)
    return spec


def check_resume(settings, spec, aws):
    """The spec's checkpoint.dir (s3://, check_up_options made sure), once a listing of
    that folder (its own files, as `aws s3 ls` lists them) shows a checkpoint."""
    checkpoints = cluster_spec.checkpoint_dir(spec)
    # Completeness (every shard at one step) is the scheduler's to check at start.
    bucket, _, prefix = checkpoints[len("s3://"):].rstrip("/").partition("/")
    listing = {"Bucket": bucket, "Delimiter": "/"}
    if prefix:  # a bucket's root is listed without one
        listing["Prefix"] = prefix + "/"
    try:
        pages = aws.client("s3").get_paginator("list_objects_v2").paginate(**listing)
        found = any(re.fullmatch(r"shard-[0-9]+-step-[0-9]+\.ckpt", o["Key"].rpartition("/")[2])
                    for page in pages for o in page.get("Contents", []))
    except aws.errors as e:  # AccessDenied, NoSuchBucket, no credentials: that, not "no checkpoint"
        fail(f"--resume: cannot list {checkpoints}: {e}", 1)
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
    try:  # the user data and policies go here: found unwritable now, not after the secrets were made
        if not settings.work:
            settings.work = tempfile.mkdtemp(prefix=f"ps-{settings.name}.")
        os.makedirs(settings.work, exist_ok=True)
        with tempfile.TemporaryFile(dir=settings.work):
            pass
    except OSError as e:
        fail(f"--work {settings.work or tempfile.gettempdir()}: cannot write there ({e.strerror or e})")
    # The secrets: made here, sent to SSM encrypted (step 1), never written to disk.
    values = {"cluster-token": secrets.token_hex(32), "admin-token": secrets.token_hex(32)}
    if settings.tls:
        values.update(make_tls_material(settings))
    account = account_id(settings, aws)
    ec2 = aws.client("ec2")
    ami = settings.ami
    if ami == "debian-12":
        images = ec2.describe_images(Owners=["136693071363"], Filters=[
            {"Name": "name", "Values": ["debian-12-amd64-*"]}, {"Name": "state", "Values": ["available"]}])["Images"]
        if not images:
            fail(f"found no Debian 12 AMI in {settings.region}; give --ami")
        ami = max(images, key=lambda image: image.get("CreationDate", ""))["ImageId"]

    # 1. The secrets, made above.
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
