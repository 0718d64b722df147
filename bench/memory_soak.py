#!/usr/bin/env python3
"""Memory under chaos: kill -9 and SIGSTOP servers, workers and the scheduler of a job
under deploy/local/run.sh --restart every 20-40 s, for an hour, sampling every daemon's
resident memory, and say whether it stays flat.

  bench/memory_soak.py --root ROOT [--minutes 60] [--servers 3] [--workers 3]
                       [--warmup-minutes 10] [--keep DIR]

The job is the reference MLP (deploy/local/fashion_mnist.yaml), async, with `servers`
servers x `workers` workers, 4 shards per server, replication 2 (the default), the
default failure timeout (3 s), a checkpoint every 20 s (a shard whose two copies
are both hit restores it) and epochs enough to outlast the soak. Every 20-40 s
(uniformly at random, seeded) one victim is hit: a server other than server-0, a worker
other than worker-0, or the scheduler; 2 times in 3 with kill -9, else with SIGSTOP for
5 s (longer than the failure timeout: a server or worker is declared dead and fenced; a
stopped scheduler declares nobody dead) and SIGCONT.
The launcher restarts what died. server-0 and worker-0 are the witnesses: never hit,
they live through every map change, copy, promotion and rejoin the churn causes, so
their memory shows whether anything accumulates. Every daemon's VmRSS is sampled every
5 s (per process life: a restart is a new life) into samples.csv, and the witnesses'
heaps from their /metrics (process_heap_bytes: what the program holds, against what
tcmalloc keeps free for reuse) into heap.csv: resident memory that grows while the
allocated bytes stay flat is the allocator's caching, not a leak.

Prints each hit, then for every life longer than the warm-up: its RSS after the warm-up,
at its end, and the least-squares growth from the warm-up on (MB/h), and a last line:
  soak minutes=.. hits=.. server_witness_mb_warm=.. server_witness_mb_end=..
  server_witness_mb_per_h=.. worker_witness_mb_per_h=.. scheduler_longest_life_min=..
  server_witness_heap_allocated_mb_per_h=.. (and the heap's other states, warm and end)
"""
import argparse
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

SAMPLE_EVERY_S = 5
STOP_FOR_S = 5


def config_for(root, servers, workers, checkpoints):
    with open(f"{root}/deploy/local/fashion_mnist.yaml") as f:
        config = f.read()
    for key, value in (("servers", servers), ("workers", workers), ("shards", 4 * servers),
                       ("epochs", 100000), ("mode", "async")):
        config, count = re.subn(rf"^(\s+{key}:)\s*\S+", rf"\g<1> {value}", config, count=1, flags=re.M)
        assert count == 1, key
    # Checkpoints every 20 s: two servers hit close together can take both copies of a
    # shard (replication 2), which then restores its newest checkpoint instead of the
    # job stopping.
    return config + f"checkpoint: {{dir: {checkpoints}, every_seconds: 20, keep: 2}}\n"


def pid_of(run_dir, name):
    try:
        with open(f"{run_dir}/{name}.pid") as f:
            return int(f.read().strip() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def alive(pid):
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return rss_kb(pid) > 0  # not a zombie


HEAP_STATES = ("allocated", "free", "thread_caches", "central_caches", "unmapped")


def metrics_port(run_dir, name):
    """The port `name` logged it serves /metrics on, or 0 before it has."""
    try:
        with open(f"{run_dir}/{name}.log") as f:
            found = re.search(r"metrics on https?://127\.0\.0\.1:([0-9]+)/metrics", f.read())
        return int(found.group(1)) if found else 0
    except FileNotFoundError:
        return 0


def heap_kb(port):
    """{state: kB} of process_heap_bytes on the daemon serving /metrics at `port`."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except (OSError, urllib.error.URLError):
        return {}
    return {state: float(value) / 1024 for state, value in
            re.findall(r'^process_heap_bytes\{[^}]*state="(\w+)"[^}]*\} ([0-9.e+]+)$', text, re.M)}


def slope_mb_per_h(points):
    """Least-squares slope of (seconds, kB) points, in MB per hour."""
    n = len(points)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    cov = sum((t - mt) * (v - mv) for t, v in points)
    return cov / var * 3600 / 1024


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--servers", type=int, default=3)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--warmup-minutes", type=float, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", help="a folder to keep the job's logs and samples.csv in")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    names = (["scheduler"] + [f"server-{s}" for s in range(args.servers)] +
             [f"worker-{w}" for w in range(args.workers)])
    victims = (["scheduler"] + [f"server-{s}" for s in range(1, args.servers)] +
               [f"worker-{w}" for w in range(1, args.workers)])
    with tempfile.TemporaryDirectory(prefix="ps-soak.") as workdir:
        config_path = f"{workdir}/job.yaml"
        with open(config_path, "w") as f:
            f.write(config_for(args.root, args.servers, args.workers, f"{workdir}/checkpoints"))
        run_dir = args.keep or f"{workdir}/run"
        os.makedirs(run_dir, exist_ok=True)
        launcher = subprocess.Popen(
            [f"{args.root}/deploy/local/run.sh", "--restart", "--metrics", config_path],
            env={**os.environ, "PS_RUN_DIR": run_dir}, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        lives = {}  # (name, pid) -> [(seconds since start, kB)]
        heaps = {}  # (witness, state) -> [(seconds since start, kB)]
        witnesses = ("server-0", "worker-0")
        ports = {}
        hits = 0
        start = time.time()
        try:
            end = start + args.minutes * 60
            next_hit = start + 60 + rng.uniform(20, 40)  # the first after a minute of training
            stopped = None  # (pid, when to continue it)
            with open(f"{run_dir}/samples.csv", "w") as samples, open(f"{run_dir}/heap.csv", "w") as heap:
                samples.write("seconds,daemon,pid,rss_kb\n")
                heap.write("seconds,daemon," + ",".join(f"{state}_kb" for state in HEAP_STATES) + "\n")
                next_sample = start
                while time.time() < end:
                    now = time.time()
                    if launcher.poll() is not None:
                        raise RuntimeError(f"memory_soak: the job ended after {(now - start) / 60:.1f} min; "
                                           f"see {run_dir}")
                    if stopped is not None and now >= stopped[1]:
                        try:
                            os.kill(stopped[0], signal.SIGCONT)
                        except ProcessLookupError:
                            pass
                        stopped = None
                    if now >= next_sample:
                        for name in names:
                            pid = pid_of(run_dir, name)
                            kb = rss_kb(pid) if pid > 0 else 0
                            if kb > 0:
                                lives.setdefault((name, pid), []).append((now - start, kb))
                                samples.write(f"{now - start:.1f},{name},{pid},{kb}\n")
                        samples.flush()
                        for name in witnesses:
                            ports[name] = ports.get(name) or metrics_port(run_dir, name)
                            states = heap_kb(ports[name]) if ports[name] else {}
                            if states:
                                for state, kb in states.items():
                                    heaps.setdefault((name, state), []).append((now - start, kb))
                                heap.write(f"{now - start:.1f},{name}," +
                                           ",".join(f"{states.get(state, -1):.0f}" for state in HEAP_STATES) + "\n")
                        heap.flush()
                        next_sample += SAMPLE_EVERY_S
                    if now >= next_hit and stopped is None:
                        victim = rng.choice(victims)
                        pid = pid_of(run_dir, victim)
                        if alive(pid):
                            hits += 1
                            if rng.random() < 2 / 3:
                                os.kill(pid, signal.SIGKILL)
                                how = "kill -9"
                            else:
                                os.kill(pid, signal.SIGSTOP)
                                stopped = (pid, now + STOP_FOR_S)
                                how = f"SIGSTOP for {STOP_FOR_S} s"
                            print(f"{(now - start) / 60:5.1f} min: {how} {victim} (pid {pid})", flush=True)
                        next_hit = now + rng.uniform(20, 40)
                    time.sleep(0.2)
        finally:
            if stopped is not None:
                try:
                    os.kill(stopped[0], signal.SIGCONT)
                except ProcessLookupError:
                    pass
            os.killpg(launcher.pid, signal.SIGINT)
            try:
                launcher.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(launcher.pid, signal.SIGKILL)
                launcher.wait()

    warmup = args.warmup_minutes * 60
    figures = {"minutes": args.minutes, "hits": hits}
    print(f"{'life':24} {'minutes':>8} {'MB warm':>8} {'MB end':>8} {'MB/h':>7}")
    for (name, pid), points in sorted(lives.items(), key=lambda item: item[1][0][0]):
        born, last = points[0][0], points[-1][0]
        after = [(t, kb) for t, kb in points if t - born >= warmup]
        if last - born < warmup + 60 or len(after) < 2:
            continue
        growth = slope_mb_per_h(after)
        print(f"{name + ' ' + str(pid):24} {(last - born) / 60:8.1f} {after[0][1] / 1024:8.1f} "
              f"{after[-1][1] / 1024:8.1f} {growth:7.1f}")
        if name in ("server-0", "worker-0"):
            role = "server" if name.startswith("server") else "worker"
            figures[f"{role}_witness_mb_warm"] = after[0][1] / 1024
            figures[f"{role}_witness_mb_end"] = after[-1][1] / 1024
            figures[f"{role}_witness_mb_per_h"] = growth
    # The witnesses' heaps, from the warm-up on (they live the whole soak).
    for (name, state), points in sorted(heaps.items()):
        after = [(t, kb) for t, kb in points if t >= warmup]
        if len(after) < 2:
            continue
        role = "server" if name.startswith("server") else "worker"
        figures[f"{role}_witness_heap_{state}_mb_warm"] = after[0][1] / 1024
        figures[f"{role}_witness_heap_{state}_mb_end"] = after[-1][1] / 1024
        figures[f"{role}_witness_heap_{state}_mb_per_h"] = slope_mb_per_h(after)
    scheduler_lives = [points[-1][0] - points[0][0] for (name, _), points in lives.items() if name == "scheduler"]
    figures["scheduler_longest_life_min"] = max(scheduler_lives, default=0) / 60
    print("soak " + " ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
