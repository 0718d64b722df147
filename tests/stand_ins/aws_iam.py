"""The IAM and STS operations of the stand-in AWS endpoint (tests/stand_ins/aws_endpoint.py):
roles with their inline and attached policies, and instance profiles, kept in
$AWS_STANDIN_ROOT/iam.json; the caller is always account 123456789012.
"""
import json

from aws_wire import AwsError

ACCOUNT = "123456789012"


class IamStandIn:
    """sts_ and iam_ Operation methods, mixed into aws_endpoint.StandIn, whose read_json
    and write_json keep the state."""

    # sts
    def sts_GetCallerIdentity(self, params):
        return {"Account": ACCOUNT, "Arn": f"arn:aws:iam::{ACCOUNT}:user/standin", "UserId": "AIDASTANDIN"}

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
        try:  # how many RunInstances EC2 refuses before it sees the new profile (aws_ec2.py)
            with open(self.path("profile-propagation-refusals")) as f:
                refusals = int(f.read())
        except FileNotFoundError:
            refusals = 0
        if refusals:
            propagating = self.read_json("propagating-profiles.json", {})
            propagating[params["InstanceProfileName"]] = refusals
            self.write_json("propagating-profiles.json", propagating)
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
