#!/usr/bin/env python3
"""SageMaker's training-container contract: `paramserver train` (SageMaker runs the image
with the argument `train` on every instance of a training job). docs/DEPLOY_SAGEMAKER.md
has the whole story; in short:

What SageMaker gives each container, and what this reads:
  /opt/ml/input/config/resourceconfig.json   {"current_host": "algo-2", "hosts": [...]}
  /opt/ml/input/config/hyperparameters.json  the estimator's hyperparameters (text):
      spec              the cluster spec, a path in the container (default: the one .yaml
                        or .yml file of the `config` channel, /opt/ml/input/data/config/)
      servers_per_host  parameter servers on each instance (default 1)
      workers_per_host  workers on each instance (default 1; on an instance with a GPU
                        for each of several workers, worker i computes on gpu:i)
      scheduler_port    the scheduler's port on the first host (default 7070)
      server_port       server k of the job listens on server_port + k (default 7100)
      worker_port       worker k of the job listens on worker_port + k (default 8100)
    (SageMaker's own keys, `sagemaker_*` and `_*`, are ignored; any other key is refused.)
  /opt/ml/input/data/secrets/cluster-token   the cluster token (the `secrets` channel);
                        admin-token beside it, if there, lets psctl's checkpoint, drain
                        and shutdown in.

What it runs: the scheduler on the first host of `hosts`; servers_per_host servers and
workers_per_host workers on every host. The spec runs as written, except for the
cluster's size and addresses, checkpoint.dir (/opt/ml/checkpoints, with resume when
SageMaker put checkpoints back), output.weights (/opt/ml/model/weights.safetensors),
output.report and tensorboard_dir (/opt/ml/output/...), the tokens (copied, mode 0600)
and relative paths (made absolute against the spec's folder).

A server or worker that dies is started again, at most 5 times a minute, as systemd
does on EC2; the scheduler too (it takes the job over from its state file). SIGTERM
(StopTrainingJob) is passed to every daemon. Each daemon's output goes to the
container's, every line prefixed with its name. Exit status: 0 when the job finished;
2 for a bad input; 1 otherwise; the reason in /opt/ml/output/failure (FailureReason).

Run as root, it hands /opt/ml/model, /opt/ml/checkpoints and /opt/ml/output to the
image's user (ps, 10001) and runs the daemons as that user; run as that user, those
folders must be writable by it.
"""

import os
import signal
import subprocess
import sys
import threading
import time

from sagemaker_contract import (BadInput, Layout, MlPaths, daemon_commands, effective_spec, find_spec,
                                read_hosts, read_hyperparameters, write_spec)

WORK_DIR = "/tmp/paramserver-train"
RELEASE_BIN = "/opt/paramserver/bin"
IMAGE_USER = 10001
RESTARTS_PER_MINUTE = 5
# Exit statuses no restart helps: 2, a bad spec or flag; 3, a job ended unfinished.
FINAL_FAILURES = (2, 3)
# A daemon's exit status after a clean shutdown on SIGTERM (kExitStoppedBySignal).
STOPPED_BY_SIGNAL = 143
# How long the daemons have to end after SIGTERM before they are killed (SageMaker
# itself kills the container 120 s after its SIGTERM).
STOP_GRACE_S = 60
# How long the daemons still up once the job finished have before they are stopped.
FINISH_GRACE_S = 30
# What a server logs when told the job finished (not when drained: that exit 0 is not the
# job's end).
SERVER_TOLD_FINISHED = "the scheduler reports the job finished"


def say(message):
    print(f"train: {message}", flush=True)


def fail(paths, message, status):
    say(message)
    try:
        os.makedirs(os.path.dirname(paths.failure), exist_ok=True)
        with open(paths.failure, "w", encoding="utf-8") as failure:
            failure.write(message[:1024] + "\n")
    except OSError as error:
        say(f"could not write {paths.failure}: {error}")
    sys.exit(status)


def as_image_user(drop_privileges):
    """Popen's arguments that run a process as the image's user (when this runs as root)."""
    return {"user": IMAGE_USER, "group": IMAGE_USER, "extra_groups": []} if drop_privileges else {}


class Daemon:
    """One daemon of this host, its runs, and their output, prefixed with its name."""

    def __init__(self, name, argv, drop_privileges):
        self.name = name
        self.argv = argv
        self.drop_privileges = drop_privileges
        self.process = None
        self.output_thread = None
        self.starts = []
        self.told_finished = False  # its output said the job finished
        self.final_status = None  # set once it ended and will not be started again

    def start(self):
        self.starts.append(time.monotonic())
        self.told_finished = False
        self.process = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, cwd=WORK_DIR,
                                        **as_image_user(self.drop_privileges))
        self.output_thread = threading.Thread(target=self._copy_output, args=(self.process,), daemon=True)
        self.output_thread.start()
        say(f"{self.name} started (pid {self.process.pid}): {' '.join(self.argv)}")

    def _copy_output(self, process):
        for line in iter(process.stdout.readline, b""):
            text = line.decode("utf-8", "replace")
            if SERVER_TOLD_FINISHED in text:
                self.told_finished = True
            sys.stdout.write(f"[{self.name}] {text}")
            sys.stdout.flush()

    def ended(self):
        """Its exit status once its process ended and its output is read; else None."""
        status = self.process.poll()
        if status is not None:
            self.output_thread.join(timeout=5)
        return status

    def ended_the_job(self, status):
        """Whether exiting with STATUS says the job finished: the scheduler's and a
        worker's 0, a server's 0 after the scheduler told it so (a drained server exits 0
        too)."""
        return status == 0 and (not self.name.startswith("server") or self.told_finished)

    def may_restart(self):
        now = time.monotonic()
        return sum(1 for started in self.starts if now - started < 60) < RESTARTS_PER_MINUTE

    def signal(self, signum):
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signum)


def describe(status):
    return f"exited {status}" if status >= 0 else f"was killed by signal {-status}"


def supervise(daemons, stop_requested):
    """Runs DAEMONS to their end; returns (exit status, the failure). STOP_REQUESTED is
    set (by the signal handler, which does nothing else) when SIGTERM or SIGINT came."""
    stopping_since = None
    finished_since = None  # when a daemon of this host said the job finished
    failure, bad_input = "", False
    for daemon in daemons:
        if not stop_requested.is_set():
            daemon.start()
        else:
            daemon.final_status = STOPPED_BY_SIGNAL
    while any(d.final_status is None for d in daemons):
        time.sleep(0.2)
        now = time.monotonic()
        if stop_requested.is_set() and stopping_since is None:
            say("SIGTERM: stopping every daemon")
            stopping_since = now
            for daemon in daemons:
                daemon.signal(signal.SIGTERM)
        if finished_since is not None and now - finished_since > FINISH_GRACE_S and stopping_since is None:
            say(f"the job finished {FINISH_GRACE_S} s ago: stopping the daemons still up")
            stopping_since = now
            for daemon in daemons:
                daemon.signal(signal.SIGTERM)
        if stopping_since is not None and now - stopping_since > STOP_GRACE_S:
            say(f"daemons still running {STOP_GRACE_S} s after SIGTERM: killing them")
            for daemon in daemons:
                daemon.signal(signal.SIGKILL)
            stopping_since = float("inf")  # once
        for daemon in daemons:
            if daemon.final_status is not None:
                continue
            status = daemon.ended()
            if status is None:
                continue
            say(f"{daemon.name} {describe(status)}")
            if daemon.ended_the_job(status):
                finished_since = finished_since or now
                daemon.final_status = status
            elif status == 0 or finished_since is not None or stop_requested.is_set():
                # A drained server (it left the job on purpose), any end once the job
                # finished (logged above: the job's result stands), or one we stopped.
                daemon.final_status = status
            elif status in FINAL_FAILURES:
                daemon.final_status = status
                bad_input = bad_input or status == 2
                failure = failure or f"{daemon.name} on this host {describe(status)}"
            elif daemon.may_restart():
                say(f"starting {daemon.name} again")
                daemon.start()
            else:
                daemon.final_status = status
                failure = failure or (f"{daemon.name} {describe(status)}, "
                                      f"{RESTARTS_PER_MINUTE} times within a minute")
    if finished_since is not None and not failure:
        return 0, ""
    if bad_input:
        return 2, failure
    if stop_requested.is_set():
        return 1, "stopped by SIGTERM (StopTrainingJob) before the job finished"
    return 1, failure or "every daemon of this host ended, none of them with the job finished"


def prepare_folders(paths, as_root):
    for folder in (paths.model, paths.checkpoints, paths.output_data):
        os.makedirs(folder, exist_ok=True)
        if as_root:
            os.chown(folder, IMAGE_USER, IMAGE_USER)
        elif not os.access(folder, os.W_OK | os.X_OK):
            raise BadInput(f"{folder} is not writable by uid {os.getuid()}: run the image as root "
                           "(it hands the folder to uid 10001) or make it writable")
    os.makedirs(WORK_DIR, mode=0o700, exist_ok=True)


def copy_secret(paths, name, required):
    """The token SECRETS_CHANNEL/NAME, copied into the work folder with mode 0600 (the
    daemons refuse a token file others may read; SageMaker's copy is)."""
    source = os.path.join(paths.secrets_channel, name)
    try:
        with open(source, "rb") as file:
            value = file.read()
    except FileNotFoundError:
        if required:
            raise BadInput(f"{source} is missing: every RPC needs the cluster token (a `secrets` "
                           "channel holding the file cluster-token; docs/DEPLOY_SAGEMAKER.md)") from None
        return ""
    except OSError as error:
        raise BadInput(f"{source}: {error}") from None
    if not value.strip():
        raise BadInput(f"{source} is empty")
    target = os.path.join(WORK_DIR, name)
    descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(value)
    return target


def validate(spec_file, as_root):
    """The scheduler's own check of the spec (its data readable, its outputs writable, by
    the daemons' user), before any daemon starts."""
    checked = subprocess.run([f"{RELEASE_BIN}/ps_scheduler", "--config", spec_file, "--describe"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=WORK_DIR,
                             timeout=300, **as_image_user(as_root))
    if checked.returncode != 0:
        raise BadInput(f"the spec as train runs it ({spec_file}): {checked.stderr.strip() or checked.stdout.strip()}")


def gpu_count():
    try:
        return sum(1 for name in os.listdir("/dev") if name.startswith("nvidia") and name[6:].isdigit())
    except OSError:
        return 0


def main():
    paths = MlPaths()
    if len(sys.argv) > 1:
        if sys.argv[1] in ("-h", "--help"):
            print(__doc__)
            return 0
        fail(paths, f"`paramserver train` takes no arguments (SageMaker gives none); got {sys.argv[1:]}", 2)
    as_root = os.getuid() == 0
    stop_requested = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop_requested.set())
    try:
        current, hosts = read_hosts(paths)
        spec_arg, numbers = read_hyperparameters(paths)
        layout = Layout.of(hosts, numbers)
        spec_path = find_spec(paths, spec_arg)
        prepare_folders(paths, as_root)
        cluster_token = copy_secret(paths, "cluster-token", required=True)
        admin_token = copy_secret(paths, "admin-token", required=False)
        spec = effective_spec(paths, spec_path, layout, cluster_token, admin_token)
        spec_file = write_spec(spec, spec_path, os.path.join(WORK_DIR, "spec"))
        if as_root:
            for path in (WORK_DIR, os.path.join(WORK_DIR, "spec"), cluster_token, admin_token):
                if path:
                    os.chown(path, IMAGE_USER, IMAGE_USER, follow_symlinks=False)
        validate(spec_file, as_root)
    except BadInput as error:
        fail(paths, str(error), 2)
    resuming = spec["checkpoint"].get("resume") == "true"
    say(f"host {current} ({hosts.index(current) + 1} of {len(hosts)}): "
        f"{'the scheduler, ' if current == hosts[0] else ''}{layout.servers_per_host} server(s), "
        f"{layout.workers_per_host} worker(s); the job: {layout.servers} servers, {layout.workers} workers, "
        f"the scheduler at {layout.scheduler}; checkpoints in {paths.checkpoints}"
        f"{' (resuming from them)' if resuming else ''}")
    if len(hosts) > 1 and spec["cluster"].get("replication", "1") == "1":
        say("cluster.replication is 1: a server lost mid-job must be rolled back from checkpoints, but "
            "each instance's /opt/ml/checkpoints holds only its own servers' files until the job starts "
            "again; set replication: 2 so that a backup takes over instead")
    commands = daemon_commands(layout, current, spec_file, os.path.join(WORK_DIR, "scheduler.state"),
                               RELEASE_BIN, gpu_count())
    daemons = [Daemon(name, argv, as_root) for name, argv in commands]
    status, failure = supervise(daemons, stop_requested)
    if status != 0:
        fail(paths, failure, status)
    weights = spec["output"]["weights"]
    if os.path.exists(weights):
        say(f"the final weights are in {weights}")
    say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
