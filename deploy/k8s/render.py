#!/usr/bin/python3
"""Renders Kubernetes manifests for one job from its cluster spec, to stdout.

usage: deploy/k8s/render.py SPEC [--name NAME] [--namespace NS] [--image REF]
                            [--gpus-per-worker N] [--role-arn ARN] [--token-secret NAME]
                            [--storage-class CLASS] [--state-size SIZE]

  SPEC                 the cluster spec (YAML), the one every daemon is started with
  --name NAME          the job's name, prefix of every object (default: the spec file's
                       name, e.g. fashion-mnist)
  --namespace NS       the namespace of every object (default: default)
  --image REF          the image (default: paramserver:VERSION, paramserver-cuda:VERSION
                       with GPUs; deploy/container/build.sh makes both; push it to your
                       registry and name it here, e.g. 123456789012.dkr.ecr.../paramserver:V)
  --gpus-per-worker N  each worker asks for N nvidia.com/gpu (default 0: CPU workers)
  --role-arn ARN       the IAM role the job's service account assumes (IRSA) for s3://
                       data, checkpoints and outputs
  --token-secret NAME  use this existing Secret (keys cluster-token, admin-token) rather
                       than render one with new tokens
  --storage-class C    the scheduler's state volume's storage class (default: the
                       cluster's default)
  --state-size SIZE    the scheduler's state volume (default 1Gi)

What it renders (every object labelled app.kubernetes.io/name=paramserver and
app.kubernetes.io/instance=NAME; docs/DEPLOY_K8S.md explains each choice):
  ConfigMap NAME-spec         the spec (and a torch job's script) at /etc/ps/spec
  Secret NAME-tokens          the cluster and admin tokens, files of mode 0440 (group
                              10001) at /etc/ps/secrets
  ServiceAccount NAME         (annotated with --role-arn for IRSA)
  PersistentVolumeClaim NAME-scheduler-state   the scheduler's state file
  Service NAME-scheduler      the scheduler's gRPC port 7000 (and metrics 9100)
  Job NAME-scheduler          the scheduler: a new pod on a failure, with its state
                              volume; done when the job is (exit 2 or 3 fail the Job)
  PodDisruptionBudget NAME-scheduler   no voluntary eviction of the scheduler
  Service NAME-server         headless: the servers' stable names
  StatefulSet NAME-server     cluster.servers servers, started together
  PodDisruptionBudget NAME-server   at most replication - 1 servers evicted at once
  Job NAME-worker             cluster.workers workers; a lost one is replaced (exit 2
                              or 3 fail the Job)
Readiness and liveness are gRPC health checks on each daemon's port; Prometheus finds
each daemon's /metrics by its pod's prometheus.io annotations.
"""
import argparse
import os
import re
import secrets
import subprocess
import sys

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cluster_spec  # noqa: E402  (deploy/cluster_spec.py)

# Ports, as on EC2 (deploy/ec2/ps-*.service): gRPC, then Prometheus metrics.
PORTS = {"scheduler": (7000, 9100), "server": (7001, 9101), "worker": (7002, 9102)}
USER = 10001  # the image's user ps (deploy/container/build.sh)
SPEC_DIR = "/etc/ps/spec"
SECRETS_DIR = "/etc/ps/secrets"
STATE_DIR = "/var/lib/paramserver/state"


def labels(name, component=None):
    out = {"app.kubernetes.io/name": "paramserver", "app.kubernetes.io/instance": name}
    if component:
        out["app.kubernetes.io/component"] = component
    return out


def metadata(name, namespace, object_name, component=None, annotations=None):
    out = {"name": object_name, "namespace": namespace, "labels": labels(name, component)}
    if annotations:
        out["annotations"] = annotations
    return out


def grpc_probe(port, period, failures):
    return {"grpc": {"port": port}, "periodSeconds": period, "failureThreshold": failures, "timeoutSeconds": 2}


def container(args, role, image, resources=None, mounts=()):
    grpc_port, metrics_port = PORTS[role]
    env = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    out = {
        "name": role,
        "image": image,
        "args": [role] + args + [
            "--config", f"{SPEC_DIR}/cluster.yaml",
            "--cluster_token_file", f"{SECRETS_DIR}/cluster-token",
            "--metrics_port", str(metrics_port), "--metrics_host", "0.0.0.0",
        ],
        "env": env,
        "ports": [{"name": "grpc", "containerPort": grpc_port}, {"name": "metrics", "containerPort": metrics_port}],
        # Started once it serves (a worker loads its data first, a torch script's worker
        # serves once the script calls init(): up to 30 minutes); ready while it serves;
        # alive while its gRPC server answers (a daemon wedged for 30 s is restarted, and
        # the cluster copes with the restart).
        "startupProbe": grpc_probe(grpc_port, 10, 180),
        "readinessProbe": grpc_probe(grpc_port, 5, 3),
        "livenessProbe": grpc_probe(grpc_port, 10, 3),
        "volumeMounts": [
            {"name": "spec", "mountPath": SPEC_DIR, "readOnly": True},
            {"name": "tokens", "mountPath": SECRETS_DIR, "readOnly": True},
        ] + list(mounts),
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": False,
                            "capabilities": {"drop": ["ALL"]}},
    }
    if resources:
        out["resources"] = resources
    return out


def pod_spec(name, args, containers, restart_policy, extra_volumes=(), affinity=None):
    spec = {
        "serviceAccountName": name,
        "restartPolicy": restart_policy,
        # A stopped daemon gets SIGTERM, then SIGKILL after this long (it needs no more).
        "terminationGracePeriodSeconds": 10,
        "securityContext": {"runAsUser": USER, "runAsGroup": USER, "runAsNonRoot": True, "fsGroup": USER,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": containers,
        "volumes": [
            {"name": "spec", "configMap": {"name": f"{name}-spec"}},
            {"name": "tokens", "secret": {"secretName": args.token_secret or f"{name}-tokens", "defaultMode": 0o440}},
        ] + list(extra_volumes),
    }
    if affinity:
        spec.update(affinity)
    return spec


def pod_template(name, component, spec):
    _, metrics_port = PORTS[component]
    return {
        "metadata": {
            "labels": labels(name, component),
            "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": str(metrics_port),
                            "prometheus.io/path": "/metrics"},
        },
        "spec": spec,
    }


def failure_policy(component):
    """A Job's pods: exit 2 (a bad spec) and 3 (the job ended unfinished) fail the Job, as
    on EC2 (RestartPreventExitStatus=2 3); a pod evicted or lost with its node does not
    count against backoffLimit; any other failure gets a new pod."""
    return {"rules": [
        {"action": "FailJob", "onExitCodes": {"containerName": component, "operator": "In", "values": [2, 3]}},
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
    ]}


def render(spec, args):
    name, ns = args.name, args.namespace
    scheduler_address = f"{name}-scheduler.{ns}.svc:{PORTS['scheduler'][0]}"
    objects = []

    spec_files = {"cluster.yaml": spec["_text"]}
    for file_name, path in cluster_spec.command_files(spec):
        with open(path) as f:
            spec_files[file_name] = f.read()
    objects.append({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": metadata(name, ns, f"{name}-spec"), "data": spec_files})
    if not args.token_secret:
        objects.append({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                        "metadata": metadata(name, ns, f"{name}-tokens"),
                        "stringData": {"cluster-token": secrets.token_hex(32), "admin-token": secrets.token_hex(32)}})
    irsa = {"eks.amazonaws.com/role-arn": args.role_arn} if args.role_arn else None
    objects.append({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata(name, ns, name, annotations=irsa)})

    # The scheduler: a Job, so that a finished job stays finished (exit 0), while a crash
    # or a lost node gets a new pod (restartPolicy Never, podFailurePolicy) that mounts
    # the same state volume and takes the job over from its state.
    claim = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": args.state_size}}}
    if args.storage_class:
        claim["storageClassName"] = args.storage_class
    objects.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": metadata(name, ns, f"{name}-scheduler-state", "scheduler"), "spec": claim})
    grpc_port, metrics_port = PORTS["scheduler"]
    objects.append({"apiVersion": "v1", "kind": "Service",
                    "metadata": metadata(name, ns, f"{name}-scheduler", "scheduler"),
                    "spec": {"selector": labels(name, "scheduler"),
                             "ports": [{"name": "grpc", "port": grpc_port, "targetPort": "grpc"},
                                       {"name": "metrics", "port": metrics_port, "targetPort": "metrics"}]}})
    scheduler = container(
        ["--listen", f"0.0.0.0:{grpc_port}", "--state_file", f"{STATE_DIR}/scheduler.state",
         "--report_file", f"{STATE_DIR}/report.html", "--admin_token_file", f"{SECRETS_DIR}/admin-token"],
        "scheduler", args.image, mounts=[{"name": "state", "mountPath": STATE_DIR}])
    objects.append({"apiVersion": "batch/v1", "kind": "Job",
                    "metadata": metadata(name, ns, f"{name}-scheduler", "scheduler"),
                    "spec": {"backoffLimit": 20, "podFailurePolicy": failure_policy("scheduler"),
                             "template": pod_template(name, "scheduler", pod_spec(
                                 name, args, [scheduler], "Never",
                                 [{"name": "state", "persistentVolumeClaim": {"claimName": f"{name}-scheduler-state"}}]))}})
    # A drain does not evict the scheduler: an evicted one exits 143 (stopped) and the Job
    # gives it a new pod, but the job goes without it until the state volume has moved.
    objects.append({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                    "metadata": metadata(name, ns, f"{name}-scheduler", "scheduler"),
                    "spec": {"maxUnavailable": 0, "selector": {"matchLabels": labels(name, "scheduler")}}})

    # The servers: a StatefulSet (stable names server-0..N-1), all started at once; each
    # advertises its pod's address. Spread over nodes and zones where the cluster can.
    grpc_port, _ = PORTS["server"]
    objects.append({"apiVersion": "v1", "kind": "Service",
                    "metadata": metadata(name, ns, f"{name}-server", "server"),
                    "spec": {"clusterIP": "None", "selector": labels(name, "server"),
                             "ports": [{"name": "grpc", "port": grpc_port, "targetPort": "grpc"}]}})
    server = container(["--scheduler", scheduler_address, "--listen", f"0.0.0.0:{grpc_port}",
                        "--advertise", f"$(POD_IP):{grpc_port}"], "server", args.image)
    spread = {
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "ScheduleAnyway",
             "labelSelector": {"matchLabels": labels(name, "server")}}
            for key in ("kubernetes.io/hostname", "topology.kubernetes.io/zone")],
    }
    objects.append({"apiVersion": "apps/v1", "kind": "StatefulSet",
                    "metadata": metadata(name, ns, f"{name}-server", "server"),
                    "spec": {"serviceName": f"{name}-server", "replicas": cluster_spec.servers(spec),
                             "podManagementPolicy": "Parallel",
                             "selector": {"matchLabels": labels(name, "server")},
                             "template": pod_template(name, "server", pod_spec(
                                 name, args, [server], "Always", affinity=spread))}})
    # Every shard has `replication` copies on distinct servers: evicting at most
    # replication - 1 at once leaves each shard a copy (with replication 1, none).
    objects.append({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                    "metadata": metadata(name, ns, f"{name}-server", "server"),
                    "spec": {"maxUnavailable": cluster_spec.replication(spec) - 1,
                             "selector": {"matchLabels": labels(name, "server")}}})

    # The workers: a Job of cluster.workers pods. A crashed or lost worker gets a new pod
    # (restartPolicy Never, podFailurePolicy), which takes the free rank; a worker that
    # finished (exit 0) is done.
    grpc_port, _ = PORTS["worker"]
    resources = None
    if args.gpus_per_worker > 0:
        resources = {"limits": {"nvidia.com/gpu": args.gpus_per_worker}}
    worker = container(["--scheduler", scheduler_address, "--listen", f"0.0.0.0:{grpc_port}",
                        "--advertise", f"$(POD_IP):{grpc_port}"], "worker", args.image, resources=resources)
    objects.append({"apiVersion": "batch/v1", "kind": "Job",
                    "metadata": metadata(name, ns, f"{name}-worker", "worker"),
                    "spec": {"completions": cluster_spec.workers(spec), "parallelism": cluster_spec.workers(spec),
                             "backoffLimit": 10 * cluster_spec.workers(spec),
                             "podFailurePolicy": failure_policy("worker"),
                             "template": pod_template(name, "worker", pod_spec(name, args, [worker], "Never"))}})
    return objects


def main(argv):
    parser = argparse.ArgumentParser(prog="render.py", description="Kubernetes manifests for one job from its cluster spec.")
    parser.add_argument("spec")
    parser.add_argument("--name")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--image")
    parser.add_argument("--gpus-per-worker", type=int, default=0)
    parser.add_argument("--role-arn")
    parser.add_argument("--token-secret")
    parser.add_argument("--storage-class")
    parser.add_argument("--state-size", default="1Gi")
    args = parser.parse_args(argv)
    try:
        spec = cluster_spec.load(args.spec)
    except cluster_spec.SpecError as e:
        print(f"render.py: {e}", file=sys.stderr)
        return 2
    if args.name is None:
        args.name = re.sub(r"[^a-z0-9-]+", "-", os.path.splitext(os.path.basename(args.spec))[0].lower()).strip("-")
    # Object names become DNS labels with suffixes such as -scheduler-state.
    if not re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?", args.name):
        print(f"render.py: --name {args.name!r}: lower-case letters, digits and '-', at most 40", file=sys.stderr)
        return 2
    if not re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", args.namespace):
        print(f"render.py: --namespace {args.namespace!r} is not a Kubernetes name", file=sys.stderr)
        return 2
    if args.gpus_per_worker < 0:
        print("render.py: --gpus-per-worker must be 0 or more", file=sys.stderr)
        return 2
    device = cluster_spec.worker_device(spec)
    if device.startswith("gpu") and args.gpus_per_worker == 0:
        print(f"render.py: worker.device is {device}: give the workers GPUs (--gpus-per-worker N)", file=sys.stderr)
        return 2
    if args.image is None:
        version = subprocess.run([os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "version.sh")],
                                 capture_output=True, text=True).stdout.strip() or "latest"
        args.image = f"paramserver{'-cuda' if args.gpus_per_worker else ''}:{version}"
    for key, path in cluster_spec.local_paths(spec):
        if not path.startswith("/usr/share/datasets/"):
            print(f"render.py: note: {key} is a path on the pods' own disks ({path}): use an s3:// URI, "
                  "or a volume you add at that path", file=sys.stderr)
    yaml.safe_dump_all(render(spec, args), sys.stdout, sort_keys=False, default_flow_style=False, width=100)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
