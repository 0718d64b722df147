"""boto3 clients for deploy/ec2/launch.py: one region, optionally one endpoint for every
service (LocalStack, a private endpoint, tests/stand_ins/aws_endpoint.py), and the dry run.

The dry run uses botocore's event system: botocore builds, validates and serializes each
call as usual (a bad parameter fails as it would for real), then a handler on
`before-call` prints it, one line per call:

    aws ec2 RunInstances {"ImageId": "ami-DRYRUN", ...}     (keys sorted)

and answers it with a made-up response, so that nothing is sent and no credentials are
needed. Where one call's output feeds a later one, a made-up value stands in for it
(sg-DRYRUN, 10.0.0.10). Secrets and user data are not printed, only their size.
"""
import base64
import gzip
import json
import os
import sys

try:
    import boto3
    import botocore.awsrequest
    import botocore.config
    import botocore.exceptions
    import botocore.session
except ImportError:  # pragma: no cover - the message is the point
    sys.exit("launch.py needs boto3 and botocore: sudo apt-get install python3-boto3")

# What a failed AWS call raises: a service's refusal (ClientError) or botocore's own
# (no credentials, no connection, a parameter that fails validation, a waiter given up).
ERRORS = (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError)


class AwsClients:
    """One boto3 client per service, made on first use. Not thread-safe."""

    errors = ERRORS
    client_error = botocore.exceptions.ClientError

    def __init__(self, region, endpoint_url="", dry_run=False, out=sys.stdout):
        self._region = region
        self._endpoint_url = endpoint_url or None
        self._dry_run = dry_run
        self._out = out
        self._core = botocore.session.Session()
        self._session = boto3.session.Session(botocore_session=self._core)
        self._clients = {}

    def _retries(self):
        """The retry settings the client is given: none where the environment
        (AWS_RETRY_MODE) or the profile (retry_mode) chooses a mode, so that botocore
        resolves it as the AWS CLI does; else the standard mode. The number of attempts
        is never set here: AWS_MAX_ATTEMPTS or the profile's max_attempts, or the
        mode's own default (3 in standard)."""
        if os.environ.get("AWS_RETRY_MODE"):
            return None
        try:
            if self._core.get_scoped_config().get("retry_mode"):
                return None
        except botocore.exceptions.ProfileNotFound:
            return None  # the client's creation names the missing profile
        return {"mode": "standard"}

    def client(self, service):
        if service not in self._clients:
            retries = self._retries()
            settings = {"retries": retries} if retries else {}
            if self._endpoint_url:
                settings["s3"] = {"addressing_style": "path"}
            config = botocore.config.Config(**settings)
            if self._dry_run:  # nothing is signed or sent: no credentials needed
                config = config.merge(botocore.config.Config(signature_version=botocore.UNSIGNED))
            client = self._session.client(service, region_name=self._region,
                                          endpoint_url=self._endpoint_url, config=config)
            if self._dry_run:
                client.meta.events.register("before-parameter-build.*.*", _keep_params)
                client.meta.events.register("before-call.*.*", self._print_and_answer)
            self._clients[service] = client
        return self._clients[service]

    def _print_and_answer(self, model, context, **_):
        service, operation = model.service_model.service_name, model.name
        params = context.get("launch_params", {})
        print(f"aws {service} {operation} {json.dumps(_printable(params), sort_keys=True, default=str)}",
              file=self._out, flush=True)
        answer = dict(dry_run_answer(service, operation, params))
        answer["ResponseMetadata"] = {"HTTPStatusCode": 200, "RequestId": "DRYRUN", "HTTPHeaders": {}}
        return botocore.awsrequest.AWSResponse(None, 200, {}, None), answer


def _keep_params(params, context, **_):
    """The call's parameters as the caller gave them, for the printout at before-call
    (which sees only the serialized request)."""
    context["launch_params"] = dict(params)


def _printable(params):
    """The parameters with a secret (ssm PutParameter's Value) and user data (anywhere)
    replaced by their size."""
    def visit(value, key=""):
        if key == "UserData" and isinstance(value, (str, bytes)):
            return f"<{len(value)} bytes, not shown>"
        if isinstance(value, dict):
            return {k: visit(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [visit(v) for v in value]
        return value

    shown = visit(params)
    if isinstance(shown.get("Value"), str):
        shown["Value"] = f"<{len(shown['Value'])} bytes, not shown>"
    return shown


def dry_run_answer(service, operation, params):
    """A made-up answer to one call, holding what launch.py reads from it."""
    if (service, operation) == ("sts", "GetCallerIdentity"):
        return {"Account": "123456789012"}
    if (service, operation) == ("ec2", "DescribeImages"):
        return {"Images": [{"ImageId": "ami-DRYRUN", "CreationDate": "2025-01-01T00:00:00.000Z"}]}
    if (service, operation) == ("ec2", "CreateSecurityGroup"):
        return {"GroupId": "sg-DRYRUN"}
    if (service, operation) == ("ec2", "DescribeSecurityGroups"):
        return {"SecurityGroups": [{"GroupId": "sg-DRYRUN"}]}
    if (service, operation) == ("ec2", "RunInstances"):
        role = next((t["Value"] for spec in params.get("TagSpecifications", [])
                     for t in spec.get("Tags", []) if t["Key"] == "Role"), "")
        if role == "scheduler":
            return {"Instances": [{"InstanceId": "i-DRYRUN", "PrivateIpAddress": "10.0.0.10"}]}
        return {"Instances": [{"InstanceId": f"i-DRYRUN-{n}", "PrivateIpAddress": f"10.0.0.{10 + n}"}
                              for n in range(1, params.get("MinCount", 1) + 1)]}
    if (service, operation) == ("ec2", "DescribeInstances"):
        if "InstanceIds" in params:  # a server to copy, or the wait for termination
            return {"Reservations": [{"Instances": [dict(
                InstanceId=i, ImageId="ami-DRYRUN", InstanceType="c6i.large", SubnetId="subnet-DRYRUN",
                SecurityGroups=[{"GroupId": "sg-DRYRUN"}], State={"Name": "terminated"},
                IamInstanceProfile={"Arn": "arn:aws:iam::123456789012:instance-profile/ps-DRYRUN"})
                for i in params["InstanceIds"]]}]}
        roles = [v for f in params.get("Filters", []) if f["Name"] == "tag:Role" for v in f["Values"]]
        rows = [("i-DRYRUN1", "scheduler", "10.0.0.10"), ("i-DRYRUN2", "server", "10.0.0.11")]
        return {"Reservations": [{"Instances": [
            {"InstanceId": i, "InstanceType": "t3.medium", "State": {"Name": "running"}, "PrivateIpAddress": address,
             "Tags": [{"Key": "Role", "Value": role}]}
            for i, role, address in rows if not roles or role in roles]}]}
    if (service, operation) == ("ec2", "DescribeInstanceAttribute"):
        return {"UserData": {"Value": base64.b64encode(gzip.compress(b"dry run", mtime=0)).decode()}}
    if (service, operation) == ("autoscaling", "DescribeAutoScalingGroups"):
        return {"AutoScalingGroups": [{"MinSize": 4, "MaxSize": 4, "DesiredCapacity": 4,
                                       "Instances": [{"LifecycleState": "InService"}] * 4}]}
    if (service, operation) == ("ssm", "SendCommand"):
        return {"Command": {"CommandId": "00000000-0000-4000-8000-0000000d4a1d"}}  # 36 characters, as SSM wants
    if (service, operation) == ("ssm", "GetCommandInvocation"):
        return {"Status": "Success", "StandardOutputContent": "training\n"}
    return {}
