#!/usr/bin/env python3
"""Recovery time: kill -9 a server under deploy/local/run.sh --restart, again and again,
and measure how long the job stops for.

  bench/recovery_bench.py --root ROOT [--kills 20] [--servers 3] [--workers 2] [--keep DIR]

The job is the reference MLP (deploy/local/fashion_mnist.yaml), sync, with `servers`
servers x `workers` workers, 4 shards per server, replication 2 (the default) and the
default failure timeout (3 s). With 2 copies of every shard spread over the servers,
every server is the primary of some shards, so each kill is the kill of a primary. The
servers are killed in turn; each comes back (the launcher's --restart) and rejoins
before the next kill. For each kill, from the logs (one clock: one machine):

  detect   the kill to the scheduler's "declared dead" line;
  resume   "declared dead" to the last worker's line saying it continues on the new map
           ("the shard map changed; continuing at step N", or a rollback's "rewinding
           from step N"): the job trains again from then, the step itself takes about
           a millisecond.

Prints a line per kill, then:
  recovery kills=N detect_ms_min=.. detect_ms_median=.. detect_ms_max=.. resume_ms_min=..
  resume_ms_median=.. resume_ms_max=..
"""
import argparse
import datetime
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) ")
DECLARED_DEAD = re.compile(r"(ps-\d+) has sent no heartbeat .*: declared dead")
CONTINUED = re.compile(r"the shard map changed; continuing at step|rewinding from step")


def stamp_of(line):
    match = STAMP.match(line)
    if not match:
        return None
    return datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()


def lines_of(path):
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def stamped(path, pattern):
    """(time, line) of every line of `path` matching `pattern`."""
    found = []
    for line in lines_of(path):
        if pattern.search(line):
            when = stamp_of(line)
            if when is not None:
                found.append((when, line))
    return found


def config_for(root, servers, workers):
    with open(f"{root}/deploy/local/fashion_mnist.yaml") as f:
        config = f.read()
    for key, value in (("servers", servers), ("workers", workers), ("shards", 4 * servers),
                       ("epochs", 1000)):
        config, count = re.subn(rf"^(\s+{key}:)\s*\S+", rf"\g<1> {value}", config, count=1, flags=re.M)
        assert count == 1, key
    return config


def wait_for(condition, timeout, what):
    give_up = time.time() + timeout
    while time.time() < give_up:
        if condition():
            return
        time.sleep(0.05)
    raise RuntimeError(f"recovery_bench: timed out waiting for {what}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--servers", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--keep", help="a folder to keep the job's logs in (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ps-recovery.") as workdir:
        config_path = f"{workdir}/job.yaml"
        with open(config_path, "w") as f:
            f.write(config_for(args.root, args.servers, args.workers))
        run_dir = args.keep or f"{workdir}/run"
        launcher = subprocess.Popen(
            [f"{args.root}/deploy/local/run.sh", "--restart", config_path],
            env={**os.environ, "PS_RUN_DIR": run_dir}, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        workers = [f"{run_dir}/worker-{w}.log" for w in range(args.workers)]
        detect, resume = [], []
        try:
            # Training: every worker has logged a step's progress or a map it follows.
            wait_for(lambda: all(re.search(r"step \d+", "\n".join(lines_of(w))) for w in workers),
                     180, "the workers to train")
            time.sleep(2)
            for kill in range(args.kills):
                server = kill % args.servers
                with open(f"{run_dir}/server-{server}.pid") as f:
                    pid = int(f.read().strip())
                dead_before = len(stamped(f"{run_dir}/scheduler.log", DECLARED_DEAD))
                killed_at = time.time()
                os.kill(pid, signal.SIGKILL)
                wait_for(lambda: len(stamped(f"{run_dir}/scheduler.log", DECLARED_DEAD)) > dead_before,
                         60, f"the scheduler to declare server {server} dead")
                declared_at, line = stamped(f"{run_dir}/scheduler.log", DECLARED_DEAD)[dead_before]

                def resumed():
                    times = [[t for t, _ in stamped(w, CONTINUED) if t >= declared_at - 0.002] for w in workers]
                    return [min(t) for t in times] if all(times) else None
                wait_for(lambda: resumed() is not None, 60, "every worker to continue on the new map")
                resumed_at = max(resumed())
                detect.append((declared_at - killed_at) * 1e3)
                resume.append((resumed_at - declared_at) * 1e3)
                print(f"kill {kill + 1} server-{server}: detect {detect[-1]:.0f} ms, "
                      f"resume {resume[-1]:.0f} ms after detection", flush=True)
                # The server comes back (the launcher restarts it once the scheduler declared
                # it dead) and rejoins; the next kill waits for its new process to serve.
                wait_for(lambda: os.path.exists(f"{run_dir}/server-{server}.pid") and
                         int(open(f"{run_dir}/server-{server}.pid").read().strip() or 0) != pid,
                         60, f"server {server} to be restarted")
                time.sleep(4)
        finally:
            os.killpg(launcher.pid, signal.SIGINT)
            try:
                launcher.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(launcher.pid, signal.SIGKILL)
                launcher.wait()
    figures = {}
    for name, values in (("detect_ms", detect), ("resume_ms", resume)):
        figures.update({f"{name}_min": min(values), f"{name}_median": statistics.median(values),
                        f"{name}_max": max(values)})
    print(f"recovery kills={len(detect)} " + " ".join(f"{k}={v:.1f}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
