#!/usr/bin/env python3
"""SageMaker's training-container contract: `paramserver train` (SageMaker runs the image
with the argument `train` on every instance of a training job).

What SageMaker gives each container, and what this reads:
  /opt/ml/input/config/resourceconfig.json   {"current_host": "algo-2", "hosts": [...]}
  /opt/ml/input/config/hyperparameters.json  the estimator's hyperparameters (all strings):
      spec              the cluster spec, a path in the container (default: the one .yaml
                        or .yml file of the `config` channel, /opt/ml/input/data/config/)
      servers_per_host  parameter servers on each instance (default 1)
      workers_per_host  workers on each instance (default 1; on an instance with at least
                        that many GPUs, worker i computes on gpu:i)
      scheduler_port    the scheduler's port on the first host (default 7070)
      server_port       server k of the job listens on server_port + k (default 7100)
      worker_port       worker k of the job listens on worker_port + k (default 8100)
    (SageMaker's own keys, `sagemaker_*` and `_*`, are ignored; any other key is refused.)
  /opt/ml/input/data/secrets/cluster-token   the cluster token (the `secrets` channel: an
                        S3 prefix only the job's role can read); admin-token beside it, if
                        there, lets psctl's checkpoint/drain/shutdown in.

What it runs: the first host of `hosts` runs the scheduler; every host runs
servers_per_host servers and workers_per_host workers, so cluster.servers and
cluster.workers are hosts x those. The spec is read, and run as written, except:
  cluster.scheduler, cluster.servers, cluster.workers   as above
  checkpoint.dir      /opt/ml/checkpoints (SageMaker syncs it to checkpoint_s3_uri, and
                      puts the files back on every instance when a job starts again, as a
                      managed spot job does after an interruption)
  checkpoint.resume   true when /opt/ml/checkpoints holds checkpoints at start
  output.weights      /opt/ml/model/weights.safetensors (SageMaker uploads /opt/ml/model)
  output.report       /opt/ml/output/data/report.html
  security.*_token_file  the tokens above (copied, mode 0600: SageMaker's copies are
                      readable by all)
The effective spec is written into a work folder beside links to every file of the
spec's own folder, so paths relative to the spec still resolve (a path into another
channel must be absolute: /opt/ml/input/data/train/...).

A server or worker that dies (not exiting 0, 2 or 3) is started again, at most 5 times a
minute, while the job runs, as systemd does on EC2; the scheduler too (it takes the job
over from its state file). SIGTERM (StopTrainingJob) is passed to every daemon.
Each daemon's output goes to this container's output (SageMaker's CloudWatch log),
every line prefixed with the daemon's name. Exit status: 0 when the job finished as far
as this host can tell (every daemon ended 0, or was stopped or died after one ended 0); otherwise 1
(2: bad input), with the reason in /opt/ml/output/failure (SageMaker's FailureReason).

Run as root, it hands /opt/ml/model, /opt/ml/checkpoints and /opt/ml/output/data to the
image's user (ps, 10001) and runs the daemons as that user; run as that user, those
folders must be writable by it.
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import yaml

ML = "/opt/ml"
RESOURCE_CONFIG = f"{ML}/input/config/resourceconfig.json"
HYPERPARAMETERS = f"{ML}/input/config/hyperparameters.json"
CONFIG_CHANNEL = f"{ML}/input/data/config"
SECRETS_CHANNEL = f"{ML}/input/data/secrets"
MODEL_DIR = f"{ML}/model"
CHECKPOINT_DIR = f"{ML}/checkpoints"
OUTPUT_DATA_DIR = f"{ML}/output/data"
FAILURE_FILE = f"{ML}/output/failure"
WORK_DIR = "/tmp/paramserver-train"
RELEASE_BIN = "/opt/paramserver/bin"
IMAGE_USER = 10001

HYPERPARAMETER_DEFAULTS = {
    "spec": "",
    "servers_per_host": "1",
    "workers_per_host": "1",
    "scheduler_port": "7070",
    "server_port": "7100",
    "worker_port": "8100",
}
HOST_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")
RESTARTS_PER_MINUTE = 5
# Exit statuses no restart helps: 2, a bad spec or flag; 3, a job ended unfinished.
FINAL_FAILURES = (2, 3)
# A daemon's exit status after a clean shutdown on SIGTERM (kExitStoppedBySignal).
STOPPED_BY_SIGNAL = 143
# How long the daemons have to end after SIGTERM before they are killed.
STOP_GRACE_S = 60


class BadInput(Exception):
    """What SageMaker or the user handed over is wrong; the message names it."""


def say(message):
    print(f"train: {message}", flush=True)


def fail(message, status):
    say(message)
    try:
        os.makedirs(os.path.dirname(FAILURE_FILE), exist_ok=True)
        with open(FAILURE_FILE, "w", encoding="utf-8") as failure:
            failure.write(message[:1024] + "\n")
    except OSError as error:
        say(f"could not write {FAILURE_FILE}: {error}")
    sys.exit(status)


def read_json(path, what):
    try:
        with open(path, encoding="utf-8") as file:
            return json.load(file)
    except FileNotFoundError:
        raise BadInput(f"{path} is missing: {what}")
    except (OSError, ValueError) as error:
        raise BadInput(f"{path}: {error}")


def read_hosts():
    """(this host, every host in SageMaker's order) from resourceconfig.json."""
    config = read_json(RESOURCE_CONFIG, "SageMaker writes it into every training container")
    if not isinstance(config, dict):
        raise BadInput(f"{RESOURCE_CONFIG}: not a JSON object")
    hosts = config.get("hosts")
    current = config.get("current_host")
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) for h in hosts):
        raise BadInput(f"{RESOURCE_CONFIG}: hosts must be a non-empty list of host names")
    for host in hosts:
        if not HOST_NAME.match(host):
            raise BadInput(f"{RESOURCE_CONFIG}: {host!r} is not a host name")
    if len(set(hosts)) != len(hosts):
        raise BadInput(f"{RESOURCE_CONFIG}: hosts names a host twice: {hosts}")
    if current not in hosts:
        raise BadInput(f"{RESOURCE_CONFIG}: current_host {current!r} is not one of hosts {hosts}")
    return current, hosts


def unquote(value):
    """A hyperparameter's value: SageMaker's SDKs hand some JSON-encoded ("\\"x\\"")."""
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except ValueError:
            return value
        return str(decoded) if isinstance(decoded, (str, int)) and not isinstance(decoded, bool) else value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise BadInput(f"{HYPERPARAMETERS}: {value!r} is not a string")


def read_hyperparameters():
    given = {}
    if os.path.exists(HYPERPARAMETERS):
        given = read_json(HYPERPARAMETERS, "")
        if not isinstance(given, dict):
            raise BadInput(f"{HYPERPARAMETERS}: not a JSON object")
    settings = dict(HYPERPARAMETER_DEFAULTS)
    for key, value in given.items():
        if key.startswith("sagemaker_") or key.startswith("_"):
            continue  # SageMaker's own (an SDK's, a tuning job's)
        if key not in HYPERPARAMETER_DEFAULTS:
            raise BadInput(f"{HYPERPARAMETERS}: unknown hyperparameter {key!r} "
                           f"(known: {', '.join(sorted(HYPERPARAMETER_DEFAULTS))})")
        settings[key] = unquote(value)
    limits = {"servers_per_host": (0, 64), "workers_per_host": (0, 64),
              "scheduler_port": (1, 65535), "server_port": (1, 65535), "worker_port": (1, 65535)}
    numbers = {}
    for key, (low, high) in limits.items():
        try:
            numbers[key] = int(settings[key])
        except ValueError:
            raise BadInput(f"hyperparameter {key}: {settings[key]!r} is not a whole number")
        if not low <= numbers[key] <= high:
            raise BadInput(f"hyperparameter {key}: {numbers[key]} is outside [{low}, {high}]")
    if numbers["servers_per_host"] + numbers["workers_per_host"] == 0:
        raise BadInput("hyperparameters servers_per_host and workers_per_host are both 0")
    return settings["spec"], numbers


def find_spec(spec):
    if spec:
        if not os.path.isfile(spec):
            raise BadInput(f"hyperparameter spec: {spec} is not a file")
        return os.path.abspath(spec)
    try:
        names = sorted(n for n in os.listdir(CONFIG_CHANNEL) if n.endswith((".yaml", ".yml")))
    except OSError:
        names = []
    if len(names) != 1:
        raise BadInput(f"no spec: give the hyperparameter spec, or a `config` channel with one .yaml "
                       f"file ({CONFIG_CHANNEL} holds {len(names)})")
    return os.path.join(CONFIG_CHANNEL, names[0])


def copy_secret(name, required):
    """The token SECRETS_CHANNEL/NAME, copied into the work folder with mode 0600."""
    source = os.path.join(SECRETS_CHANNEL, name)
    try:
        with open(source, "rb") as file:
            value = file.read()
    except FileNotFoundError:
        if required:
            raise BadInput(f"{source} is missing: every RPC needs the cluster token (a `secrets` "
                           "channel holding the file cluster-token; docs/DEPLOY_SAGEMAKER.md)")
        return ""
    except OSError as error:
        raise BadInput(f"{source}: {error}")
    if not value.strip():
        raise BadInput(f"{source} is empty")
    target = os.path.join(WORK_DIR, name)
    descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(value)
    return target


def holds_checkpoints(folder):
    try:
        return any(name.endswith(".ckpt") for name in os.listdir(folder))
    except OSError:
        return False


def effective_spec(spec_path, hosts, numbers, cluster_token, admin_token):
    """Writes the spec as this job runs it into WORK_DIR/spec/, beside links to the files
    of its own folder; returns its path and the spec."""
    try:
        with open(spec_path, encoding="utf-8") as file:
            spec = yaml.safe_load(file)
    except (OSError, yaml.YAMLError) as error:
        raise BadInput(f"the spec {spec_path}: {error}")
    if not isinstance(spec, dict):
        raise BadInput(f"the spec {spec_path}: not a YAML mapping")

    def section(name):
        value = spec.setdefault(name, {})
        if value is None:
            value = spec[name] = {}
        if not isinstance(value, dict):
            raise BadInput(f"the spec {spec_path}: {name} must be a mapping")
        return value

    cluster = section("cluster")
    cluster["scheduler"] = f"{hosts[0]}:{numbers['scheduler_port']}"
    cluster["servers"] = len(hosts) * numbers["servers_per_host"]
    cluster["workers"] = len(hosts) * numbers["workers_per_host"]
    checkpoint = section("checkpoint")
    checkpoint["dir"] = CHECKPOINT_DIR
    if holds_checkpoints(CHECKPOINT_DIR):
        checkpoint["resume"] = True
    output = section("output")
    output["weights"] = os.path.join(MODEL_DIR, "weights.safetensors")
    output["report"] = os.path.join(OUTPUT_DATA_DIR, "report.html")
    security = section("security")
    security["cluster_token_file"] = cluster_token
    if admin_token:
        security["admin_token_file"] = admin_token

    spec_dir = os.path.join(WORK_DIR, "spec")
    os.makedirs(spec_dir, exist_ok=True)
    source_dir = os.path.dirname(spec_path)
    for name in os.listdir(source_dir):
        link = os.path.join(spec_dir, name)
        if name != "cluster.yaml" and not os.path.lexists(link):
            os.symlink(os.path.join(source_dir, name), link)
    path = os.path.join(spec_dir, "cluster.yaml")
    with open(path, "w", encoding="utf-8") as file:
        file.write(f"# {spec_path}, as `paramserver train` runs it on SageMaker\n")
        yaml.safe_dump(spec, file, sort_keys=False)
    return path, spec


def gpu_count():
    try:
        return sum(1 for name in os.listdir("/dev") if re.fullmatch(r"nvidia[0-9]+", name))
    except OSError:
        return 0


class Daemon:
    """One daemon of this host, its runs, and their output, prefixed with its name."""

    def __init__(self, name, argv, drop_privileges):
        self.name = name
        self.argv = argv
        self.drop_privileges = drop_privileges
        self.process = None
        self.starts = []
        self.final_status = None  # set once it ended and will not be started again

    def start(self):
        def as_image_user():
            os.setgroups([])
            os.setgid(IMAGE_USER)
            os.setuid(IMAGE_USER)

        self.starts.append(time.monotonic())
        self.process = subprocess.Popen(
            self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=as_image_user if self.drop_privileges else None, cwd=WORK_DIR)
        threading.Thread(target=self._copy_output, args=(self.process,), daemon=True).start()
        say(f"{self.name} started (pid {self.process.pid}): {' '.join(self.argv)}")

    def _copy_output(self, process):
        for line in iter(process.stdout.readline, b""):
            sys.stdout.write(f"[{self.name}] {line.decode('utf-8', 'replace')}")
            sys.stdout.flush()

    def may_restart(self):
        now = time.monotonic()
        return sum(1 for started in self.starts if now - started < 60) < RESTARTS_PER_MINUTE


def describe(status):
    return f"exited {status}" if status >= 0 else f"was killed by signal {-status}"


def supervise(daemons):
    """Runs DAEMONS to their end; returns this host's exit status and the failure."""
    stopping = threading.Event()

    def stop(signum, _frame):
        say(f"signal {signum}: stopping every daemon")
        stopping.deadline = time.monotonic() + STOP_GRACE_S
        stopping.set()
        for daemon in daemons:
            if daemon.process and daemon.process.poll() is None:
                daemon.process.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for daemon in daemons:
        daemon.start()
    finished = False  # a daemon of this host ended 0: the job finished
    failure = ""
    killed = False
    while any(d.final_status is None for d in daemons):
        time.sleep(0.2)
        if stopping.is_set() and not killed and time.monotonic() > stopping.deadline:
            # SageMaker itself kills the container 120 s after its SIGTERM.
            say(f"daemons still running {STOP_GRACE_S} s after SIGTERM: killing them")
            for daemon in daemons:
                if daemon.process.poll() is None:
                    daemon.process.kill()
            killed = True
        for daemon in daemons:
            if daemon.final_status is not None:
                continue
            status = daemon.process.poll()
            if status is None:
                continue
            say(f"{daemon.name} {describe(status)}")
            if status == 0:
                finished = True
                daemon.final_status = 0
            elif stopping.is_set() or finished or status in FINAL_FAILURES:
                daemon.final_status = status
                if not (finished and (status < 0 or status == STOPPED_BY_SIGNAL)):
                    failure = failure or f"{daemon.name} on this host {describe(status)}"
            elif daemon.may_restart():
                say(f"starting {daemon.name} again")
                daemon.start()
            else:
                daemon.final_status = status
                failure = failure or (f"{daemon.name} {describe(status)}, "
                                      f"{RESTARTS_PER_MINUTE} times within a minute")
    if stopping.is_set():
        return 1, "stopped by SIGTERM (StopTrainingJob) before the job finished"
    if failure:
        return 1, failure
    return 0, ""


def prepare_folders(as_root):
    for folder in (MODEL_DIR, CHECKPOINT_DIR, OUTPUT_DATA_DIR):
        os.makedirs(folder, exist_ok=True)
        if as_root:
            os.chown(folder, IMAGE_USER, IMAGE_USER)
        elif not os.access(folder, os.W_OK | os.X_OK):
            raise BadInput(f"{folder} is not writable by uid {os.getuid()}: run the image as root "
                           "(it hands the folder to uid 10001) or make it writable")
    os.makedirs(WORK_DIR, mode=0o700, exist_ok=True)
    if as_root:
        os.chown(WORK_DIR, IMAGE_USER, IMAGE_USER)


def main():
    if len(sys.argv) > 1:
        if sys.argv[1] in ("-h", "--help"):
            print(__doc__)
            return 0
        fail(f"`paramserver train` takes no arguments (SageMaker gives none); got {sys.argv[1:]}", 2)
    as_root = os.getuid() == 0
    try:
        current, hosts = read_hosts()
        spec_arg, numbers = read_hyperparameters()
        spec_path = find_spec(spec_arg)
        prepare_folders(as_root)
        cluster_token = copy_secret("cluster-token", required=True)
        admin_token = copy_secret("admin-token", required=False)
        if as_root:
            for token in (cluster_token, admin_token):
                if token:
                    os.chown(token, IMAGE_USER, IMAGE_USER)
        spec_file, spec = effective_spec(spec_path, hosts, numbers, cluster_token, admin_token)
    except BadInput as error:
        fail(str(error), 2)

    index = hosts.index(current)
    config = ["--config", spec_file]
    daemons = []
    if index == 0:
        daemons.append(Daemon("scheduler", [f"{RELEASE_BIN}/ps_scheduler", *config,
                                            "--listen", f"0.0.0.0:{numbers['scheduler_port']}",
                                            "--state_file", os.path.join(WORK_DIR, "scheduler.state")],
                              as_root))
    for i in range(numbers["servers_per_host"]):
        port = numbers["server_port"] + index * numbers["servers_per_host"] + i
        daemons.append(Daemon(f"server-{i}", [f"{RELEASE_BIN}/ps_server", *config, "--listen",
                                              f"0.0.0.0:{port}", "--advertise", f"{current}:{port}"],
                              as_root))
    gpus = gpu_count()
    for i in range(numbers["workers_per_host"]):
        port = numbers["worker_port"] + index * numbers["workers_per_host"] + i
        argv = [f"{RELEASE_BIN}/ps_worker", *config, "--listen", f"0.0.0.0:{port}",
                "--advertise", f"{current}:{port}"]
        if numbers["workers_per_host"] > 1 and gpus >= numbers["workers_per_host"]:
            argv += ["--device", f"gpu:{i}"]
        daemons.append(Daemon(f"worker-{i}", argv, as_root))
    say(f"host {current} ({index + 1} of {len(hosts)}): "
        f"{'the scheduler, ' if index == 0 else ''}{numbers['servers_per_host']} server(s), "
        f"{numbers['workers_per_host']} worker(s); the job: {spec['cluster']['servers']} servers, "
        f"{spec['cluster']['workers']} workers, the scheduler at {spec['cluster']['scheduler']}; "
        f"checkpoints in {CHECKPOINT_DIR}{' (resuming from them)' if spec['checkpoint'].get('resume') else ''}")
    status, failure = supervise(daemons)
    if status != 0:
        fail(failure, status)
    weights = spec["output"]["weights"]
    if os.path.exists(weights):
        say(f"the final weights are in {weights}")
    say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
