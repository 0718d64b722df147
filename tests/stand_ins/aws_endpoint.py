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
answer is one botocore really parses: tests/stand_ins/aws_wire.py holds those protocols.
This file holds the state, the ssm, logs and s3 operations and the server; the sts and
iam operations lie in aws_iam.py, the ec2 and autoscaling ones in aws_ec2.py.

It records every call, one line each, in $AWS_STANDIN_ROOT/calls.log:
    SERVICE Operation {"Param": ..., ...}        (the API's parameter names, keys sorted)
with secrets (ssm PutParameter's Value) and user data replaced by their size. A call it
does not answer is recorded with " UNANSWERED" and refused (HTTP 400, the protocol's
error body), so a new call is never silently "done"; a call it refuses (the service's
error) is recorded with " REFUSED CODE". $AWS_STANDIN_ROOT/refusals.txt, if present,
makes it refuse calls as a service would: lines "SERVICE Operation CODE MESSAGE..."
(e.g. "s3 ListObjectsV2 AccessDenied Access Denied"), every time.

State lives under $AWS_STANDIN_ROOT where the CLI stand-in (tests/stand_ins/aws), which
the daemons use for s3 and ssm, keeps it:
  ssm/%paramserver%NAME%SECRET   a parameter's value ('/' written as '%')
  s3/BUCKET/KEY                  an object (a bucket exists when its folder does)
  last-user-data                 the user data (decoded) of the latest RunInstances
  user-data-server.yaml.gz       if present: every instance's user data (DescribeInstanceAttribute)
  instances.txt                  "ID ROLE TYPE MARKET STATE ADDRESS CLUSTER" rows, tab-
                                 separated; RunInstances adds, TerminateInstances ends them;
                                 DescribeInstances applies tag:Cluster, tag:Role and
                                 instance-state-name (and refuses any other filter)
  profile-propagation-refusals   if present, N: RunInstances refuses a profile made
                                 afterwards N times ("Invalid IAM Instance Profile name")
  psctl-status.txt               what an SSM command on the scheduler prints (default: training)
  iam.json, ec2.json, logs.json, autoscaling.json   roles, instance profiles, security
                                 and placement groups, launch templates (their data whole,
                                 user data included), log groups, Auto
                                 Scaling groups ([min, max, desired], all in service)
Ids: sg-0standin, lt-0standin, ami-0debian12standin, i-0scheduler (i-0schedulerN for
the Nth) at 10.1.2.3, i-0serverN at 10.1.0.1N (N counting on from the servers in
instances.txt), account 123456789012.

usage: aws_endpoint.py --port-file FILE    (FILE gets the port once it listens)
"""
import http.server
import json
import os
import re
import sys
import threading
import traceback

import botocore.session

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # the stand-in's modules lie beside it
import aws_wire  # noqa: E402  (tests/stand_ins/aws_wire.py)
from aws_ec2 import Ec2StandIn  # noqa: E402  (tests/stand_ins/aws_ec2.py)
from aws_iam import IamStandIn  # noqa: E402  (tests/stand_ins/aws_iam.py)
from aws_wire import AwsError  # noqa: E402

COMMAND_ID = "5a4d1e00-0000-4000-8000-000000000001"  # SSM wants 36 characters


class StandIn(IamStandIn, Ec2StandIn):
    """The services' state under `root`, and one method per answered operation, named
    SERVICE_Operation, taking the call's parameters and returning its answer: ssm, logs
    and s3 here, sts and iam from IamStandIn, ec2 and autoscaling from Ec2StandIn."""

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
        prefix, delimiter = params.get("Prefix", ""), params.get("Delimiter", "")
        keys = sorted(os.path.relpath(os.path.join(folder, name), bucket)
                      for folder, _, names in os.walk(bucket) for name in names)
        contents, common = [], []
        for key in keys:
            if not key.startswith(prefix):
                continue
            rest = key[len(prefix):]
            if delimiter and delimiter in rest:  # rolled up into PREFIX...DELIMITER
                folder = prefix + rest[:rest.index(delimiter) + len(delimiter)]
                if folder not in common:
                    common.append(folder)
                continue
            contents.append({"Key": key, "Size": os.path.getsize(os.path.join(bucket, key)), "ETag": '"standin"',
                             "LastModified": "2026-11-30T12:00:00.000Z", "StorageClass": "STANDARD"})
        answer = {"IsTruncated": False, "Name": params["Bucket"], "Prefix": prefix, "MaxKeys": 1000,
                  "KeyCount": len(contents) + len(common), "Contents": contents,
                  "CommonPrefixes": [{"Prefix": folder} for folder in common]}
        if delimiter:
            answer["Delimiter"] = delimiter
        return answer

    def refusal(self, service, operation):
        """The AwsError refusals.txt names for this call, or None."""
        try:
            with open(self.path("refusals.txt")) as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            return None
        for line in lines:
            fields = line.split(" ", 3)
            if len(fields) >= 3 and fields[:2] == [service, operation]:
                return AwsError(fields[2], fields[3] if len(fields) > 3 else "", 403 if "Denied" in fields[2] else 400)
        return None


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
                operation, params = aws_wire.read_request(model, body, self.headers, self.command, self.path)
                answer = self.answer(model, service, operation, params)
            except Exception as e:  # noqa: BLE001  (a bug here answers, not hangs the caller)
                error = e if isinstance(e, AwsError) else AwsError("StandInFailure", f"{type(e).__name__}: {e}")
                if not isinstance(e, AwsError):
                    traceback.print_exc()
                content_type, payload = aws_wire.error_body(protocol, error)
                self.reply(error.status, content_type, payload)
                return
        self.reply(200, *answer)

    def answer(self, model, service, operation, params):
        """(content type, body) of the answer; records the call."""
        method = getattr(self.stand_in, f"{service}_{operation}", None)
        line = f"{service} {operation} {json.dumps(printable(service, operation, params), sort_keys=True)}"
        outcome = ""
        try:
            if method is None:
                outcome = " UNANSWERED"
                raise AwsError("InvalidAction" if model.protocol != "json" else "UnknownOperationException",
                               f"the stand-in does not answer {service} {operation}")
            refusal = self.stand_in.refusal(service, operation)
            if refusal:
                raise refusal
            return aws_wire.answer_body(model, operation, method(params))
        except AwsError as e:
            outcome = outcome or f" REFUSED {e.code}"
            raise
        finally:
            with open(self.stand_in.path("calls.log"), "a") as log:
                log.write(line + outcome + "\n")

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
