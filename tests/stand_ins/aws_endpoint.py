#!/usr/bin/python3
"""A stand-in AWS endpoint for tests: an HTTP server on 127.0.0.1 that boto3 talks to
(deploy/ec2/launch.py --endpoint-url http://127.0.0.1:PORT) in AWS's own wire protocols,
as botocore sends them:
  - ec2 and query (form-encoded POST, Action=...): ec2, iam, sts, autoscaling;
  - JSON 1.1 (X-Amz-Target): ssm, logs;
  - S3 REST, path-style: ListObjectsV2.
The service is the one named in the Authorization header's credential scope
(.../REGION/SERVICE/aws4_request); an unsigned request is refused. Requests are read, and
answers written, from botocore's own service models (input and output shapes), so every
answer is one botocore really parses.

It records every call, one line each, in $AWS_STANDIN_ROOT/calls.log:
    SERVICE Operation {"Param": ..., ...}        (the API's parameter names, keys sorted)
with secrets (ssm PutParameter's Value) and user data replaced by their size. A call it
does not answer is recorded with " UNANSWERED" and refused (HTTP 400, the protocol's
error body), so a new call is never silently "done".

State lives under $AWS_STANDIN_ROOT where the CLI stand-in (tests/stand_ins/aws), which
the daemons use for s3 and ssm, keeps it:
  ssm/%paramserver%NAME%SECRET   a parameter's value ('/' written as '%')
  s3/BUCKET/KEY                  an object (a bucket exists when its folder does)
  last-user-data                 the user data (decoded) of the latest RunInstances
  user-data-server.yaml.gz       if present: every instance's user data (DescribeInstanceAttribute)
  instances.txt                  "ID ROLE TYPE MARKET STATE ADDRESS" rows, tab-separated;
                                 RunInstances adds, TerminateInstances ends them
  psctl-status.txt               what an SSM command on the scheduler prints (default: training)
  iam.json, ec2.json, logs.json, autoscaling.json   roles, instance profiles, security
                                 and placement groups, launch templates, log groups, Auto
                                 Scaling groups ([min, max, desired], all in service)
Ids: sg-0standin, lt-0standin, ami-0debian12standin, i-0scheduler at 10.1.2.3, i-0serverN
at 10.1.0.1N (N counting on from the servers in instances.txt), account 123456789012.

usage: aws_endpoint.py --port-file FILE    (FILE gets the port once it listens)
"""
import base64
import http.server
import json
import os
import re
import sys
import threading
import traceback
import urllib.parse
import xml.etree.ElementTree as ElementTree

import botocore.session

ACCOUNT = "123456789012"
SCHEDULER_ADDRESS = "10.1.2.3"
COMMAND_ID = "5a4d1e00-0000-4000-8000-000000000001"  # SSM wants 36 characters


class AwsError(Exception):
    """An error answer: the service's code and message, HTTP 400 unless given."""

    def __init__(self, code, message, status=400):
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


# ---------------------------------------------------------------- wire formats


def ec2_name(shape, default):
    if "queryName" in shape.serialization:
        return shape.serialization["queryName"]
    name = shape.serialization.get("name")
    return name[0].upper() + name[1:] if name else default


def parse_query(flat, shape, ec2, prefix=""):
    """The API parameters of a form-encoded query/ec2 request (`flat`: wire name ->
    value), read by `shape` the way botocore's QuerySerializer/EC2Serializer wrote them."""
    def present(at):
        return at in flat or any(key.startswith(at + ".") for key in flat)

    kind = shape.type_name
    if kind == "structure":
        out = {}
        for name, member in shape.members.items():
            wire = ec2_name(member, name) if ec2 else member.serialization.get("name", name)
            at = f"{prefix}.{wire}" if prefix else wire
            if present(at):
                out[name] = parse_query(flat, member, ec2, at)
        return out
    if kind == "list":
        if flat.get(prefix) == "":
            return []
        if ec2:
            items_at = prefix
        elif shape.serialization.get("flattened"):
            items_at = prefix
            if shape.member.serialization.get("name"):
                items_at = ".".join(prefix.split(".")[:-1] + [shape.member.serialization["name"]])
        else:
            items_at = f"{prefix}.{shape.member.serialization.get('name', 'member')}"
        items, i = [], 1
        while present(f"{items_at}.{i}"):
            items.append(parse_query(flat, shape.member, ec2, f"{items_at}.{i}"))
            i += 1
        return items
    if kind == "map":
        entries = prefix if shape.serialization.get("flattened") else f"{prefix}.entry"
        key_name = shape.key.serialization.get("name", "key")
        value_name = shape.value.serialization.get("name", "value")
        out, i = {}, 1
        while f"{entries}.{i}.{key_name}" in flat:
            out[flat[f"{entries}.{i}.{key_name}"]] = parse_query(flat, shape.value, ec2, f"{entries}.{i}.{value_name}")
            i += 1
        return out
    value = flat.get(prefix, "")
    if kind == "boolean":
        return value == "true"
    if kind in ("integer", "long"):
        return int(value)
    if kind in ("float", "double"):
        return float(value)
    return value  # string, blob (base64), timestamp (ISO 8601) as sent


def scalar_text(value, shape):
    if shape.type_name == "boolean":
        return "true" if value else "false"
    if shape.type_name == "timestamp":
        return value if isinstance(value, str) else value.strftime("%Y-%m-%dT%H:%M:%S.000Z")
    if shape.type_name == "blob":
        return base64.b64encode(value).decode() if isinstance(value, bytes) else value
    return str(value)


def to_xml(parent, name, value, shape, ec2):
    """`value` (an API answer shaped by `shape`) as XML element `name` under `parent`:
    lists as <item> (ec2) or <member> (query, unless the model names the member or
    flattens the list), members under their serialization names."""
    element = ElementTree.SubElement(parent, name)
    fill_xml(element, value, shape, ec2)


def fill_xml(element, value, shape, ec2):
    kind = shape.type_name
    if kind == "structure":
        for member_name, member in shape.members.items():
            if member_name not in value or "location" in member.serialization:
                continue
            item = value[member_name]
            if member.type_name == "list" and member.serialization.get("flattened"):
                tag = member.member.serialization.get("name") or member.serialization.get("name", member_name)
                for entry in item:
                    to_xml(element, tag, entry, member.member, ec2)
            else:
                to_xml(element, member.serialization.get("name", member_name), item, member, ec2)
    elif kind == "list":
        tag = "item" if ec2 else shape.member.serialization.get("name", "member")
        for entry in value:
            to_xml(element, tag, entry, shape.member, ec2)
    elif kind == "map":
        for key, item in value.items():
            entry = ElementTree.SubElement(element, "entry")
            to_xml(entry, shape.key.serialization.get("name", "key"), key, shape.key, ec2)
            to_xml(entry, shape.value.serialization.get("name", "value"), item, shape.value, ec2)
    else:
        element.text = scalar_text(value, shape)


def xml_answer(service_model, operation_model, answer):
    """The body of a query/ec2/rest-xml answer."""
    namespace = service_model.metadata.get("xmlNamespace") or "https://standin.example/"
    if isinstance(namespace, dict):  # rest-xml: {"uri": ...}
        namespace = namespace.get("uri", "https://standin.example/")
    protocol = service_model.protocol
    shape = operation_model.output_shape
    if protocol == "rest-xml":
        root = ElementTree.Element(shape.serialization.get("name", shape.name) if shape else "Response",
                                   xmlns=namespace)
        if shape is not None:
            fill_xml(root, answer, shape, False)
    else:
        root = ElementTree.Element(f"{operation_model.name}Response", xmlns=namespace)
        holder = root
        if shape is not None and protocol == "query":
            holder = ElementTree.SubElement(root, shape.serialization.get("resultWrapper", f"{operation_model.name}Result"))
        if shape is not None:
            fill_xml(holder, answer, shape, protocol == "ec2")
        if protocol == "ec2":
            ElementTree.SubElement(root, "requestId").text = "standin-request"
        else:
            metadata = ElementTree.SubElement(root, "ResponseMetadata")
            ElementTree.SubElement(metadata, "RequestId").text = "standin-request"
    return ElementTree.tostring(root, encoding="utf-8", xml_declaration=True)


def error_body(protocol, error):
    """(content type, body) of an error answer in `protocol`."""
    if protocol == "json":
        return "application/x-amz-json-1.1", json.dumps({"__type": error.code, "message": error.message}).encode()
    if protocol == "ec2":
        root = ElementTree.Element("Response")
        detail = ElementTree.SubElement(ElementTree.SubElement(root, "Errors"), "Error")
        ElementTree.SubElement(root, "RequestID").text = "standin-request"
    elif protocol == "rest-xml":
        root = detail = ElementTree.Element("Error")
    else:
        root = ElementTree.Element("ErrorResponse")
        detail = ElementTree.SubElement(root, "Error")
        ElementTree.SubElement(detail, "Type").text = "Sender"
        ElementTree.SubElement(root, "RequestId").text = "standin-request"
    ElementTree.SubElement(detail, "Code").text = error.code
    ElementTree.SubElement(detail, "Message").text = error.message
    return "text/xml", ElementTree.tostring(root, encoding="utf-8", xml_declaration=True)


# ---------------------------------------------------------------- state and answers


class StandIn:
    """The services' state under `root`, and one method per answered operation, named
    SERVICE_Operation, taking the call's parameters and returning its answer."""

    def __init__(self, root):
        self.root = root
        os.makedirs(os.path.join(root, "s3"), exist_ok=True)
        os.makedirs(os.path.join(root, "ssm"), exist_ok=True)

    def path(self, *parts):
        return os.path.join(self.root, *parts)

    def read_json(self, name, empty):
        try:
            with open(self.path(name)) as f:
                return json.load(f)
        except FileNotFoundError:
            return empty

    def write_json(self, name, value):
        with open(self.path(name), "w") as f:
            json.dump(value, f, indent=1, sort_keys=True)

    def instance_rows(self):
        try:
            with open(self.path("instances.txt")) as f:
                return [line.rstrip("\n").split("\t") for line in f if line.strip()]
        except FileNotFoundError:
            return []

    def write_instance_rows(self, rows):
        with open(self.path("instances.txt"), "w") as f:
            f.writelines("\t".join(row) + "\n" for row in rows)

    # sts
    def sts_GetCallerIdentity(self, params):
        return {"Account": ACCOUNT, "Arn": f"arn:aws:iam::{ACCOUNT}:user/standin", "UserId": "AIDASTANDIN"}

    # ssm
    def ssm_file(self, name):
        return self.path("ssm", name.replace("/", "%"))

    def ssm_PutParameter(self, params):
        file = self.ssm_file(params["Name"])
        if os.path.exists(file) and not params.get("Overwrite"):
            raise AwsError("ParameterAlreadyExists", f"The parameter {params['Name']} already exists.")
        with open(file, "w") as f:
            f.write(params["Value"])
        return {"Version": 1, "Tier": "Standard"}

    def ssm_GetParameter(self, params):
        file = self.ssm_file(params["Name"])
        if not os.path.exists(file):
            raise AwsError("ParameterNotFound", "")
        with open(file) as f:
            return {"Parameter": {"Name": params["Name"], "Type": "SecureString", "Value": f.read(), "Version": 1}}

    def ssm_DeleteParameters(self, params):
        deleted, invalid = [], []
        for name in params["Names"]:
            file = self.ssm_file(name)
            (deleted if os.path.exists(file) else invalid).append(name)
            if os.path.exists(file):
                os.remove(file)
        return {"DeletedParameters": deleted, "InvalidParameters": invalid}

    def ssm_SendCommand(self, params):
        return {"Command": {"CommandId": COMMAND_ID, "DocumentName": params["DocumentName"],
                            "InstanceIds": params.get("InstanceIds", []), "Status": "Pending"}}

    def ssm_GetCommandInvocation(self, params):
        try:
            with open(self.path("psctl-status.txt")) as f:
                output = f.read()
        except FileNotFoundError:
            output = "training\n"
        return {"CommandId": params["CommandId"], "InstanceId": params["InstanceId"], "Status": "Success",
                "StatusDetails": "Success", "ResponseCode": 0, "StandardOutputContent": output}

    # iam
    def iam_state(self):
        return self.read_json("iam.json", {"roles": {}, "profiles": {}})

    def iam_role(self, state, name):
        if name not in state["roles"]:
            raise AwsError("NoSuchEntity", f"The role with name {name} cannot be found.", 404)
        return state["roles"][name]

    def iam_profile(self, state, name):
        if name not in state["profiles"]:
            raise AwsError("NoSuchEntity", f"Instance Profile {name} cannot be found.", 404)
        return state["profiles"][name]

    def role_answer(self, name):
        return {"Path": "/", "RoleName": name, "RoleId": "AROASTANDIN", "Arn": f"arn:aws:iam::{ACCOUNT}:role/{name}",
                "CreateDate": "2026-11-30T12:00:00Z"}

    def profile_answer(self, name, state):
        return {"Path": "/", "InstanceProfileName": name, "InstanceProfileId": "AIPASTANDIN",
                "Arn": f"arn:aws:iam::{ACCOUNT}:instance-profile/{name}", "CreateDate": "2026-11-30T12:00:00Z",
                "Roles": [self.role_answer(r) for r in state["profiles"].get(name, [])]}

    def iam_CreateRole(self, params):
        state = self.iam_state()
        if params["RoleName"] in state["roles"]:
            raise AwsError("EntityAlreadyExists", f"Role with name {params['RoleName']} already exists.", 409)
        state["roles"][params["RoleName"]] = {"trust": json.loads(params["AssumeRolePolicyDocument"]),
                                              "policies": {}, "attached": []}
        self.write_json("iam.json", state)
        return {"Role": self.role_answer(params["RoleName"])}

    def iam_PutRolePolicy(self, params):
        state = self.iam_state()
        self.iam_role(state, params["RoleName"])["policies"][params["PolicyName"]] = json.loads(params["PolicyDocument"])
        self.write_json("iam.json", state)
        return {}

    def iam_DeleteRolePolicy(self, params):
        state = self.iam_state()
        policies = self.iam_role(state, params["RoleName"])["policies"]
        if policies.pop(params["PolicyName"], None) is None:
            raise AwsError("NoSuchEntity", f"The role policy with name {params['PolicyName']} cannot be found.", 404)
        self.write_json("iam.json", state)
        return {}

    def iam_AttachRolePolicy(self, params):
        state = self.iam_state()
        self.iam_role(state, params["RoleName"])["attached"].append(params["PolicyArn"])
        self.write_json("iam.json", state)
        return {}

    def iam_DetachRolePolicy(self, params):
        state = self.iam_state()
        attached = self.iam_role(state, params["RoleName"])["attached"]
        if params["PolicyArn"] not in attached:
            raise AwsError("NoSuchEntity", f"Policy {params['PolicyArn']} was not found.", 404)
        attached.remove(params["PolicyArn"])
        self.write_json("iam.json", state)
        return {}

    def iam_DeleteRole(self, params):
        state = self.iam_state()
        role = self.iam_role(state, params["RoleName"])
        if role["policies"] or role["attached"] or any(params["RoleName"] in r for r in state["profiles"].values()):
            raise AwsError("DeleteConflict", "Cannot delete entity, must remove policies and profiles first.", 409)
        del state["roles"][params["RoleName"]]
        self.write_json("iam.json", state)
        return {}

    def iam_CreateInstanceProfile(self, params):
        state = self.iam_state()
        state["profiles"][params["InstanceProfileName"]] = []
        self.write_json("iam.json", state)
        return {"InstanceProfile": self.profile_answer(params["InstanceProfileName"], state)}

    def iam_GetInstanceProfile(self, params):
        state = self.iam_state()
        self.iam_profile(state, params["InstanceProfileName"])
        return {"InstanceProfile": self.profile_answer(params["InstanceProfileName"], state)}

    def iam_AddRoleToInstanceProfile(self, params):
        state = self.iam_state()
        self.iam_role(state, params["RoleName"])
        self.iam_profile(state, params["InstanceProfileName"]).append(params["RoleName"])
        self.write_json("iam.json", state)
        return {}

    def iam_RemoveRoleFromInstanceProfile(self, params):
        state = self.iam_state()
        roles = self.iam_profile(state, params["InstanceProfileName"])
        if params["RoleName"] not in roles:
            raise AwsError("NoSuchEntity", f"Role {params['RoleName']} is not in the instance profile.", 404)
        roles.remove(params["RoleName"])
        self.write_json("iam.json", state)
        return {}

    def iam_DeleteInstanceProfile(self, params):
        state = self.iam_state()
        if self.iam_profile(state, params["InstanceProfileName"]):
            raise AwsError("DeleteConflict", "Cannot delete entity, must remove roles from instance profile first.", 409)
        del state["profiles"][params["InstanceProfileName"]]
        self.write_json("iam.json", state)
        return {}

    # ec2
    def ec2_state(self):
        return self.read_json("ec2.json", {"security_groups": {}, "placement_groups": [], "launch_templates": []})

    def ec2_DescribeImages(self, params):
        return {"Images": [{"ImageId": "ami-0debian12standin", "Name": "debian-12-amd64-20261130-standin",
                            "CreationDate": "2026-11-30T12:00:00.000Z", "State": "available"}]}

    def ec2_CreateSecurityGroup(self, params):
        state = self.ec2_state()
        if params["GroupName"] in state["security_groups"]:
            raise AwsError("InvalidGroup.Duplicate", f"The security group '{params['GroupName']}' already exists")
        state["security_groups"][params["GroupName"]] = "sg-0standin"
        self.write_json("ec2.json", state)
        return {"GroupId": "sg-0standin"}

    def ec2_AuthorizeSecurityGroupIngress(self, params):
        if params["GroupId"] not in self.ec2_state()["security_groups"].values():
            raise AwsError("InvalidGroup.NotFound", f"The security group '{params['GroupId']}' does not exist")
        return {"Return": True}

    def ec2_DescribeSecurityGroups(self, params):
        names = [v for f in params.get("Filters", []) if f["Name"] == "group-name" for v in f["Values"]]
        return {"SecurityGroups": [{"GroupId": group_id, "GroupName": name}
                                   for name, group_id in self.ec2_state()["security_groups"].items()
                                   if not names or name in names]}

    def ec2_DeleteSecurityGroup(self, params):
        state = self.ec2_state()
        names = [n for n, g in state["security_groups"].items() if g == params["GroupId"]]
        if not names:
            raise AwsError("InvalidGroup.NotFound", f"The security group '{params['GroupId']}' does not exist")
        del state["security_groups"][names[0]]
        self.write_json("ec2.json", state)
        return {}

    def ec2_CreatePlacementGroup(self, params):
        state = self.ec2_state()
        state["placement_groups"].append(params["GroupName"])
        self.write_json("ec2.json", state)
        return {}

    def ec2_DeletePlacementGroup(self, params):
        state = self.ec2_state()
        if params["GroupName"] not in state["placement_groups"]:
            raise AwsError("InvalidPlacementGroup.Unknown", f"The Placement Group '{params['GroupName']}' is unknown.")
        state["placement_groups"].remove(params["GroupName"])
        self.write_json("ec2.json", state)
        return {}

    def ec2_CreateLaunchTemplate(self, params):
        state = self.ec2_state()
        state["launch_templates"].append(params["LaunchTemplateName"])
        self.write_json("ec2.json", state)
        return {"LaunchTemplate": {"LaunchTemplateId": "lt-0standin", "LaunchTemplateName": params["LaunchTemplateName"]}}

    def ec2_DeleteLaunchTemplate(self, params):
        state = self.ec2_state()
        if params["LaunchTemplateName"] not in state["launch_templates"]:
            raise AwsError("InvalidLaunchTemplateName.NotFoundException", "The specified launch template does not exist.")
        state["launch_templates"].remove(params["LaunchTemplateName"])
        self.write_json("ec2.json", state)
        return {"LaunchTemplate": {"LaunchTemplateId": "lt-0standin", "LaunchTemplateName": params["LaunchTemplateName"]}}

    def ec2_RunInstances(self, params):
        if "UserData" in params:  # kept as handed over (launch.py removes nothing it needs)
            with open(self.path("last-user-data"), "wb") as f:
                f.write(base64.b64decode(params["UserData"]))
        role = next((t["Value"] for spec in params.get("TagSpecifications", [])
                     for t in spec.get("Tags", []) if t["Key"] == "Role"), "")
        if role == "scheduler":
            made = [("i-0scheduler", SCHEDULER_ADDRESS)]
        else:
            first = 1 + sum(1 for row in self.instance_rows() if row[1] == role)
            made = [(f"i-0{role or 'unknown'}{n}", f"10.1.0.1{n}") for n in range(first, first + params["MinCount"])]
        self.write_instance_rows(self.instance_rows() + [[i, role, params.get("InstanceType", ""), "on-demand", "running",
                                                          address] for i, address in made])
        return {"ReservationId": "r-0standin", "OwnerId": ACCOUNT, "Instances": [
            {"InstanceId": i, "PrivateIpAddress": address, "InstanceType": params.get("InstanceType"),
             "ImageId": params["ImageId"], "State": {"Name": "pending", "Code": 0}} for i, address in made]}

    def ec2_DescribeInstances(self, params):
        rows = self.instance_rows() or [["i-0scheduler", "scheduler", "t3.medium", "on-demand", "running",
                                         SCHEDULER_ADDRESS]]
        for f in params.get("Filters", []):
            column = {"tag:Role": 1, "instance-state-name": 4}.get(f["Name"])
            if column is not None:
                rows = [row for row in rows if row[column] in f["Values"]]
        if params.get("InstanceIds"):
            rows = [row for row in rows if row[0] in params["InstanceIds"]]
            if not rows:
                raise AwsError("InvalidInstanceID.NotFound", f"The instance IDs '{params['InstanceIds']}' do not exist")
        placement = (self.ec2_state()["placement_groups"] or [""])[0]
        instances = []
        for instance_id, role, instance_type, market, state, address in (row[:6] for row in rows):
            instance = {"InstanceId": instance_id, "InstanceType": instance_type, "State": {"Name": state},
                        "PrivateIpAddress": address, "ImageId": "ami-0debian12standin", "SubnetId": "subnet-0standin",
                        "SecurityGroups": [{"GroupId": "sg-0standin", "GroupName": "ps-standin"}],
                        "IamInstanceProfile": {"Arn": f"arn:aws:iam::{ACCOUNT}:instance-profile/ps-demo-node"},
                        "Tags": [{"Key": "Role", "Value": role}]}
            if market == "spot":
                instance["InstanceLifecycle"] = "spot"
            if role == "server" and placement:
                instance["Placement"] = {"GroupName": placement}
            instances.append(instance)
        return {"Reservations": [{"ReservationId": "r-0standin", "Instances": instances}] if instances else []}

    def ec2_TerminateInstances(self, params):
        rows = self.instance_rows()
        for row in rows:
            if row[0] in params["InstanceIds"]:
                row[4] = "terminated"
        self.write_instance_rows(rows)
        return {"TerminatingInstances": [{"InstanceId": i, "CurrentState": {"Name": "shutting-down"}}
                                         for i in params["InstanceIds"]]}

    def ec2_DescribeInstanceAttribute(self, params):
        # A server's user data: the one a test left, or a bare cloud-config.
        try:
            with open(self.path("user-data-server.yaml.gz"), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = b"#cloud-config\n"
        return {"InstanceId": params["InstanceId"], "UserData": {"Value": base64.b64encode(data).decode()}}

    # autoscaling: groups by name, [min, max, desired]; every wanted instance is in service
    def autoscaling_group(self, groups, name):
        if name not in groups:
            raise AwsError("ValidationError", f"AutoScalingGroup name not found - {name}")
        return groups[name]

    def autoscaling_CreateAutoScalingGroup(self, params):
        groups, name = self.read_json("autoscaling.json", {}), params["AutoScalingGroupName"]
        if name in groups:
            raise AwsError("AlreadyExists", f"AutoScalingGroup by this name already exists - {name}")
        groups[name] = [params["MinSize"], params["MaxSize"], params.get("DesiredCapacity", params["MinSize"])]
        self.write_json("autoscaling.json", groups)
        return {}

    def autoscaling_UpdateAutoScalingGroup(self, params):
        groups, name = self.read_json("autoscaling.json", {}), params["AutoScalingGroupName"]
        low, high, desired = self.autoscaling_group(groups, name)
        low, high = params.get("MinSize", low), params.get("MaxSize", high)
        desired = params.get("DesiredCapacity", desired)
        if not low <= desired <= high:
            raise AwsError("ValidationError", f"Desired capacity:{desired} must be between the specified min size:{low} "
                           f"and max size:{high}")
        groups[name] = [low, high, desired]
        self.write_json("autoscaling.json", groups)
        return {}

    def autoscaling_DeleteAutoScalingGroup(self, params):
        groups, name = self.read_json("autoscaling.json", {}), params["AutoScalingGroupName"]
        self.autoscaling_group(groups, name)
        del groups[name]
        self.write_json("autoscaling.json", groups)
        return {}

    def autoscaling_DescribeAutoScalingGroups(self, params):
        groups = self.read_json("autoscaling.json", {})
        names = params.get("AutoScalingGroupNames") or list(groups)
        return {"AutoScalingGroups": [{
            "AutoScalingGroupName": name, "MinSize": low, "MaxSize": high, "DesiredCapacity": desired,
            "DefaultCooldown": 300, "AvailabilityZones": ["eu-west-1a"], "HealthCheckType": "EC2",
            "CreatedTime": "2026-11-30T12:00:00Z",
            "Instances": [{"InstanceId": f"i-0worker{n}", "AvailabilityZone": "eu-west-1a", "LifecycleState": "InService",
                           "HealthStatus": "Healthy", "ProtectedFromScaleIn": False} for n in range(1, desired + 1)]}
            for name in names if name in groups for low, high, desired in [groups[name]]]}

    # logs
    def logs_CreateLogGroup(self, params):
        groups = self.read_json("logs.json", {})
        if params["logGroupName"] in groups:
            raise AwsError("ResourceAlreadyExistsException", "The specified log group already exists")
        groups[params["logGroupName"]] = {"tags": params.get("tags", {})}
        self.write_json("logs.json", groups)
        return {}

    def logs_PutRetentionPolicy(self, params):
        groups = self.read_json("logs.json", {})
        if params["logGroupName"] not in groups:
            raise AwsError("ResourceNotFoundException", "The specified log group does not exist.")
        groups[params["logGroupName"]]["retentionInDays"] = params["retentionInDays"]
        self.write_json("logs.json", groups)
        return {}

    def logs_DeleteLogGroup(self, params):
        groups = self.read_json("logs.json", {})
        if groups.pop(params["logGroupName"], None) is None:
            raise AwsError("ResourceNotFoundException", "The specified log group does not exist.")
        self.write_json("logs.json", groups)
        return {}

    # s3
    def s3_ListObjectsV2(self, params):
        bucket = self.path("s3", params["Bucket"])
        if not os.path.isdir(bucket):
            raise AwsError("NoSuchBucket", "The specified bucket does not exist", 404)
        prefix = params.get("Prefix", "")
        keys = sorted(os.path.relpath(os.path.join(folder, name), bucket)
                      for folder, _, names in os.walk(bucket) for name in names)
        contents = [{"Key": key, "Size": os.path.getsize(os.path.join(bucket, key)), "ETag": '"standin"',
                     "LastModified": "2026-11-30T12:00:00.000Z", "StorageClass": "STANDARD"}
                    for key in keys if key.startswith(prefix)]
        return {"IsTruncated": False, "Name": params["Bucket"], "Prefix": prefix, "KeyCount": len(contents),
                "MaxKeys": 1000, "Contents": contents}


# ---------------------------------------------------------------- the server


def printable(service, operation, params):
    """The parameters as recorded: secrets and user data replaced by their size, no
    idempotency token."""
    def visit(value, key=""):
        if key == "UserData" and isinstance(value, str):
            return f"<{len(value)} bytes>"
        if isinstance(value, dict):
            return {k: visit(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [visit(v) for v in value]
        return value

    shown = visit(params)
    shown.pop("ClientToken", None)  # botocore's random idempotency token: not stable
    if (service, operation) == ("ssm", "PutParameter"):
        shown["Value"] = f"<{len(params.get('Value', ''))} bytes>"
    return shown


class Handler(http.server.BaseHTTPRequestHandler):
    stand_in = None  # set by main
    lock = threading.Lock()
    session = botocore.session.get_session()

    def log_message(self, *args):  # quiet: calls.log says what happened
        pass

    def do_GET(self):
        self.handle_call()

    def do_POST(self):
        self.handle_call()

    def do_PUT(self):
        self.handle_call()

    def do_DELETE(self):
        self.handle_call()

    def do_HEAD(self):
        self.handle_call()

    def handle_call(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        scope = re.search(r"Credential=[^/]+/[^/]+/[^/]+/([^/]+)/aws4_request", self.headers.get("Authorization", ""))
        protocol = "query"
        with self.lock:
            try:
                if not scope:
                    raise AwsError("MissingAuthenticationToken", "Request is missing Authentication Token", 403)
                service = scope.group(1)
                model = self.session.get_service_model(service)
                protocol = model.protocol
                operation, params = self.read_request(model, body)
                answer = self.answer(model, service, operation, params)
            except Exception as e:  # noqa: BLE001  (a bug here answers, not hangs the caller)
                error = e if isinstance(e, AwsError) else AwsError("StandInFailure", f"{type(e).__name__}: {e}")
                if not isinstance(e, AwsError):
                    traceback.print_exc()
                content_type, payload = error_body(protocol, error)
                self.reply(error.status, content_type, payload)
                return
        self.reply(200, *answer)

    def read_request(self, model, body):
        """(operation name, API parameters) of the request, in the service's protocol."""
        if model.protocol in ("query", "ec2"):
            flat = dict(urllib.parse.parse_qsl(body.decode(), keep_blank_values=True))
            name = flat.pop("Action", "")
            flat.pop("Version", None)
            if name not in model.operation_names:
                raise AwsError("InvalidAction", f"The action {name} is not valid for this web service.")
            shape = model.operation_model(name).input_shape
            return name, parse_query(flat, shape, model.protocol == "ec2") if shape else {}
        if model.protocol == "json":
            name = self.headers.get("X-Amz-Target", "").rpartition(".")[2]
            if name not in model.operation_names:
                raise AwsError("UnknownOperationException", f"Unknown operation {name}")
            return name, json.loads(body or b"{}")
        # S3 REST, path-style: the bucket, then the key.
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        bucket, _, key = url.path.lstrip("/").partition("/")
        if self.command == "GET" and bucket and not key and query.get("list-type") == "2":
            params = {"Bucket": bucket}
            for wire, name in (("prefix", "Prefix"), ("delimiter", "Delimiter"), ("continuation-token", "ContinuationToken")):
                if wire in query:
                    params[name] = query[wire]
            return "ListObjectsV2", params
        return f"{self.command} {url.path}", dict(query)

    def answer(self, model, service, operation, params):
        """(content type, body) of the answer; records the call."""
        method = getattr(self.stand_in, f"{service}_{operation}", None)
        line = f"{service} {operation} {json.dumps(printable(service, operation, params), sort_keys=True)}"
        with open(self.stand_in.path("calls.log"), "a") as log:
            log.write(line + ("" if method else " UNANSWERED") + "\n")
        if method is None:
            raise AwsError("InvalidAction" if model.protocol != "json" else "UnknownOperationException",
                           f"the stand-in does not answer {service} {operation}")
        result = method(params)
        operation_model = model.operation_model(operation)
        if model.protocol == "json":
            return "application/x-amz-json-1.1", json.dumps(result, default=str).encode()
        return "text/xml", xml_answer(model, operation_model, result)

    def reply(self, status, content_type, payload):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("x-amzn-RequestId", "standin-request")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)


def main(argv):
    if len(argv) != 2 or argv[0] != "--port-file":
        sys.exit("usage: aws_endpoint.py --port-file FILE")
    root = os.environ.get("AWS_STANDIN_ROOT")
    if not root:
        sys.exit("aws_endpoint.py: the stand-in needs AWS_STANDIN_ROOT")
    Handler.stand_in = StandIn(root)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with open(argv[1] + ".tmp", "w") as f:  # whole, or not at all: a reader polls for it
        f.write(f"{server.server_address[1]}\n")
    os.rename(argv[1] + ".tmp", argv[1])
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
