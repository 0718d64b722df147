"""What `launch.py up` makes, as data, for deploy/ec2/launch.py: the instances' IAM
policy and trust policy (and the account their ARNs name), the cluster's tags, the user
data of each role (deploy/ec2/cloud-init.yaml.tmpl filled in, gzipped), the TLS material
(a CA and a certificate, made with openssl), and the names of the secrets and of the
managed policy `up` attaches and `down` removes again.
"""
import base64
import gzip
import json
import os
import re
import shlex
import subprocess
import tempfile

import cluster_spec  # deploy/cluster_spec.py (launch.py puts its folder on sys.path)
from launch_cli import fail

HERE = os.path.dirname(os.path.abspath(__file__))

SECRETS = ("cluster-token", "admin-token", "tls-ca", "tls-cert", "tls-key")
SSM_CORE = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"


def account_id(settings, aws):
    return settings.account or aws.client("sts").get_caller_identity()["Account"]


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
            try:
                done = subprocess.run(["openssl", *args], cwd=folder, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True, timeout=120)
            except OSError as e:  # not installed, not runnable
                fail(f"--tls: cannot run openssl ({e.strerror or e}): sudo apt-get install openssl", 1)
            except subprocess.TimeoutExpired:
                fail(f"--tls: openssl {args[0]} did not finish in 120 s", 1)
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["no message"])[-1]
                fail(f"--tls: openssl {args[0]} failed (exit {done.returncode}): {last}", 1)
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
