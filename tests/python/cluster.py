"""A whole job on this machine for the Python package's tests: the scheduler, servers and
workers as real processes on 127.0.0.1 (the binaries Bazel built, from the test's
runfiles), the workers running a script through ps_worker as deploy/local/run.sh starts
them. Every process is ended (by its pid) when the Cluster is closed."""
import os
import signal
import subprocess
import tempfile
import time

RUNFILES = os.path.join(os.environ.get("TEST_SRCDIR", ""), "paramserver")
BINARIES = {
    "scheduler": os.path.join(RUNFILES, "scheduler/ps_scheduler"),
    "server": os.path.join(RUNFILES, "ps/ps_server"),
    "worker": os.path.join(RUNFILES, "worker/ps_worker"),
}
HERE = os.path.dirname(os.path.abspath(__file__))


def yaml_value(value):
    if isinstance(value, dict):
        return "{" + ", ".join("%s: %s" % (k, yaml_value(v)) for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'%s'" % value.replace("'", "''")
    return repr(value)


class Cluster:
    """One job: `spec` (a dict of the YAML's sections) written as job.yaml into a fresh
    folder, where the logs go too."""

    def __init__(self, spec):
        self.dir = tempfile.mkdtemp(prefix="ps-python-test-", dir=os.environ.get("TEST_TMPDIR"))
        self.spec_path = os.path.join(self.dir, "job.yaml")
        with open(self.spec_path, "w") as f:
            for section, keys in spec.items():
                f.write("%s: %s\n" % (section, yaml_value(keys)))
        self.token = os.path.join(self.dir, "cluster.token")
        with open(self.token, "w") as f:
            f.write(os.urandom(32).hex())
        os.chmod(self.token, 0o600)
        self.processes = {}  # name -> Popen
        self.scheduler_address = None
        cluster = spec["cluster"]
        self.servers = cluster.get("servers", 1)
        self.workers = cluster.get("workers", 1)

    def log(self, name):
        with open(os.path.join(self.dir, name + ".log"), errors="replace") as f:
            return f.read()

    def _start(self, name, argv, env=None):
        log = open(os.path.join(self.dir, name + ".log"), "ab")
        self.processes[name] = subprocess.Popen(
            argv + ["--cluster_token_file", self.token], stdout=log, stderr=subprocess.STDOUT,
            env=env, start_new_session=True)
        log.close()

    def start(self, worker_env=None, by_hand=None, worker_env_for=None):
        """Starts the scheduler, the servers and the workers: as deploy/local/run.sh does
        (ps_worker, which runs worker.command), or with `by_hand` (the script's argv) as
        docs/PYTHON.md says a user starts a worker by hand: the script itself, with
        PARAMSERVER_CONFIG and PARAMSERVER_WORKER_ARGS set. `worker_env` is added to
        every worker's environment, worker_env_for[i] to worker i's alone."""
        port_file = os.path.join(self.dir, "scheduler.port")
        self._start("scheduler", [BINARIES["scheduler"], "--config", self.spec_path, "--listen",
                                  "127.0.0.1:0", "--port_file", port_file])
        deadline = time.time() + 20
        while not (os.path.exists(port_file) and os.path.getsize(port_file) > 0):
            if time.time() > deadline or self.processes["scheduler"].poll() is not None:
                raise RuntimeError("the scheduler did not start:\n" + self.log("scheduler"))
            time.sleep(0.05)
        with open(port_file) as f:
            self.scheduler_address = "127.0.0.1:" + f.read().strip()
        for i in range(self.servers):
            self._start("server-%d" % i, [BINARIES["server"], "--config", self.spec_path,
                                          "--scheduler", self.scheduler_address, "--listen",
                                          "127.0.0.1:0"])
        env = dict(os.environ)
        env["PYTHONPATH"] = HERE  # the scripts import their shared model module
        env.update(worker_env or {})
        for i in range(self.workers):
            if by_hand is None:
                self._start("worker-%d" % i, [BINARIES["worker"], "--config", self.spec_path,
                                              "--scheduler", self.scheduler_address, "--listen",
                                              "127.0.0.1:0"],
                            env=dict(env, **(worker_env_for or {}).get(i, {})))
                continue
            env["PYTHONPATH"] = os.path.join(RUNFILES, "python") + ":" + HERE
            env["PARAMSERVER_CONFIG"] = self.spec_path
            env["PARAMSERVER_WORKER_ARGS"] = "\x1f".join(
                ["--scheduler=" + self.scheduler_address, "--cluster_token_file=" + self.token])
            log = open(os.path.join(self.dir, "worker-%d.log" % i), "ab")
            self.processes["worker-%d" % i] = subprocess.Popen(
                by_hand, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.dir,
                start_new_session=True)
            log.close()
        return self

    def wait(self, timeout=180):
        """Waits for every process to exit; returns name -> exit status. Raises on timeout."""
        deadline = time.time() + timeout
        for name, process in self.processes.items():
            try:
                process.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                raise RuntimeError("%s did not exit within %d s; logs in %s" %
                                   (name, timeout, self.dir))
        return {name: process.returncode for name, process in self.processes.items()}

    def wait_for_exit(self, name, timeout=120):
        """Waits for process `name` to exit; returns its status."""
        return self.processes[name].wait(timeout=timeout)

    def wait_for_log(self, name, text, timeout=120):
        deadline = time.time() + timeout
        while text not in self.log(name):
            if time.time() > deadline:
                raise RuntimeError("%s never logged %r; logs in %s" % (name, text, self.dir))
            time.sleep(0.05)

    def kill9(self, name):
        self.processes[name].send_signal(signal.SIGKILL)

    def kill9_all(self):
        """kill -9 of every process group at once (a worker's script with its ps_worker):
        the whole cluster lost."""
        for process in self.processes.values():
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for process in self.processes.values():
            process.wait()

    def close(self):
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def run_to_end(cluster, timeout=180):
    """Starts `cluster` and waits for every process; returns name -> exit status. Raises,
    with the failed processes' logs, unless every one exits 0."""
    statuses = cluster.start().wait(timeout)
    failed = {name: status for name, status in statuses.items() if status != 0}
    if failed:
        raise AssertionError("%s exited with %s; logs in %s:\n%s" % (
            ", ".join(failed), failed, cluster.dir,
            "\n".join(cluster.log(name)[-3000:] for name in failed)))
    return statuses


def torch_job(servers, workers, command, **sections):
    """The spec of a model.type torch job of `servers` x `workers` running `command`
    (the script's arguments, run by /usr/bin/python3 from this folder)."""
    spec = {
        "cluster": {"scheduler": "127.0.0.1:0", "servers": servers, "workers": workers,
                    "shards": servers, "heartbeat_interval_ms": 200, "failure_timeout_ms": 2000},
        "model": {"type": "torch"},
        "worker": {"command": ["/usr/bin/python3"] + [os.path.join(HERE, command[0])] +
                              list(command[1:])},
        "training": {"mode": "sync"},
    }
    for section, keys in sections.items():
        spec.setdefault(section, {}).update(keys)
    return spec
