"""The EC2 and Auto Scaling operations of the stand-in AWS endpoint
(tests/stand_ins/aws_endpoint.py): instances as rows of $AWS_STANDIN_ROOT/instances.txt,
"ID ROLE TYPE MARKET STATE ADDRESS CLUSTER" (RunInstances adds, with the Role and Cluster
tags it was given; TerminateInstances ends them; DescribeInstances answers only the rows
its filters match), security and placement groups and launch templates (with the data
each was made with) in ec2.json, Auto Scaling groups in autoscaling.json. Ids:
sg-0standin (sg-0standinN for the Nth group at once), lt-0standin, ami-0debian12standin,
i-0scheduler (i-0schedulerN for the Nth cluster's) at 10.1.2.3, i-0serverN at 10.1.0.1N.
A new instance profile named in RunInstances is refused as EC2 refuses one IAM has not
spread yet ("Invalid IAM Instance Profile name"), as many times as
$AWS_STANDIN_ROOT/profile-propagation-refusals said when the profile was made (aws_iam.py).
"""
import base64

from aws_iam import ACCOUNT
from aws_wire import AwsError

SCHEDULER_ADDRESS = "10.1.2.3"
# DescribeInstances' filters the stand-in applies: the row's column each reads. Any other
# filter is refused, so that a new one the launcher sends is never silently ignored.
INSTANCE_FILTERS = {"tag:Role": 1, "instance-state-name": 4, "tag:Cluster": 6}


class Ec2StandIn:
    """ec2_ and autoscaling_ Operation methods, mixed into aws_endpoint.StandIn, whose
    path, read_json and write_json keep the state."""

    def instance_rows(self):
        try:
            with open(self.path("instances.txt")) as f:
                rows = [line.rstrip("\n").split("\t") for line in f if line.strip()]
        except FileNotFoundError:
            return []
        for row in rows:
            if len(row) != 7:
                raise AwsError("StandInFailure", f"instances.txt: a row of {len(row)} fields, not 7 "
                               f"(ID ROLE TYPE MARKET STATE ADDRESS CLUSTER): {row}")
        return rows

    def write_instance_rows(self, rows):
        with open(self.path("instances.txt"), "w") as f:
            f.writelines("\t".join(row) + "\n" for row in rows)

    # ec2
    def ec2_state(self):
        return self.read_json("ec2.json", {"security_groups": {}, "placement_groups": [], "launch_templates": {}})

    def ec2_DescribeImages(self, params):
        return {"Images": [{"ImageId": "ami-0debian12standin", "Name": "debian-12-amd64-20261130-standin",
                            "CreationDate": "2026-11-30T12:00:00.000Z", "State": "available"}]}

    def ec2_CreateSecurityGroup(self, params):
        state = self.ec2_state()
        if params["GroupName"] in state["security_groups"]:
            raise AwsError("InvalidGroup.Duplicate", f"The security group '{params['GroupName']}' already exists")
        ids = set(state["security_groups"].values())  # sg-0standin, then sg-0standin2, ...: one per group
        group_id = next(i for i in (f"sg-0standin{n if n > 1 else ''}" for n in range(1, len(ids) + 2))
                        if i not in ids)
        state["security_groups"][params["GroupName"]] = group_id
        self.write_json("ec2.json", state)
        return {"GroupId": group_id}

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
        if params["LaunchTemplateName"] in state["launch_templates"]:
            raise AwsError("InvalidLaunchTemplateName.AlreadyExistsException",
                           "Launch template name already in use.")
        # Kept whole, its UserData included (calls.log shows only its size).
        state["launch_templates"][params["LaunchTemplateName"]] = params["LaunchTemplateData"]
        self.write_json("ec2.json", state)
        return {"LaunchTemplate": {"LaunchTemplateId": "lt-0standin", "LaunchTemplateName": params["LaunchTemplateName"]}}

    def ec2_DeleteLaunchTemplate(self, params):
        state = self.ec2_state()
        if params["LaunchTemplateName"] not in state["launch_templates"]:
            raise AwsError("InvalidLaunchTemplateName.NotFoundException", "The specified launch template does not exist.")
        del state["launch_templates"][params["LaunchTemplateName"]]
        self.write_json("ec2.json", state)
        return {"LaunchTemplate": {"LaunchTemplateId": "lt-0standin", "LaunchTemplateName": params["LaunchTemplateName"]}}

    def ec2_RunInstances(self, params):
        profile = params.get("IamInstanceProfile", {}).get("Name")
        propagating = self.read_json("propagating-profiles.json", {})
        if propagating.get(profile):  # EC2 has not seen the new profile yet
            propagating[profile] -= 1
            self.write_json("propagating-profiles.json", propagating)
            raise AwsError("InvalidParameterValue", f"Value ({profile}) for parameter iamInstanceProfile.name is "
                           "invalid. Invalid IAM Instance Profile name")
        if "UserData" in params:  # kept as handed over (launch.py removes nothing it needs)
            with open(self.path("last-user-data"), "wb") as f:
                f.write(base64.b64decode(params["UserData"]))
        tags = {t["Key"]: t["Value"] for spec in params.get("TagSpecifications", [])
                if spec.get("ResourceType") == "instance" for t in spec.get("Tags", [])}
        role, cluster = tags.get("Role", ""), tags.get("Cluster", "")
        rows = self.instance_rows()
        first = 1 + sum(1 for row in rows if row[1] == role)
        if role == "scheduler":  # every cluster's at the one address the boot test gives it
            made = [("i-0scheduler" if first == 1 else f"i-0scheduler{first}", SCHEDULER_ADDRESS)]
        else:
            made = [(f"i-0{role or 'unknown'}{n}", f"10.1.0.1{n}") for n in range(first, first + params["MinCount"])]
        self.write_instance_rows(rows + [[i, role, params.get("InstanceType", ""), "on-demand", "running", address,
                                          cluster] for i, address in made])
        return {"ReservationId": "r-0standin", "OwnerId": ACCOUNT, "Instances": [
            {"InstanceId": i, "PrivateIpAddress": address, "InstanceType": params.get("InstanceType"),
             "ImageId": params["ImageId"], "State": {"Name": "pending", "Code": 0}} for i, address in made]}

    def ec2_DescribeInstances(self, params):
        rows = self.instance_rows()
        for f in params.get("Filters", []):
            if f["Name"] not in INSTANCE_FILTERS:
                raise AwsError("InvalidParameterValue", f"The filter '{f['Name']}' is invalid (the stand-in "
                               f"applies only {', '.join(sorted(INSTANCE_FILTERS))})")
            rows = [row for row in rows if row[INSTANCE_FILTERS[f["Name"]]] in f["Values"]]
        if params.get("InstanceIds"):
            missing = set(params["InstanceIds"]) - {row[0] for row in self.instance_rows()}
            if missing:
                raise AwsError("InvalidInstanceID.NotFound",
                               f"The instance IDs '{', '.join(sorted(missing))}' do not exist")
            rows = [row for row in rows if row[0] in params["InstanceIds"]]
        ec2 = self.ec2_state()
        placement = (ec2["placement_groups"] or [""])[0]
        instances = []
        for instance_id, role, instance_type, market, state, address, cluster in rows:
            instance = {"InstanceId": instance_id, "InstanceType": instance_type, "State": {"Name": state},
                        "PrivateIpAddress": address, "ImageId": "ami-0debian12standin", "SubnetId": "subnet-0standin",
                        "SecurityGroups": [{"GroupId": ec2["security_groups"].get(f"ps-{cluster}", "sg-0standin"),
                                            "GroupName": f"ps-{cluster}"}],
                        "IamInstanceProfile": {"Arn": f"arn:aws:iam::{ACCOUNT}:instance-profile/ps-{cluster}-node"},
                        "Tags": [{"Key": "Role", "Value": role}, {"Key": "Cluster", "Value": cluster}]}
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
