#!/usr/bin/python3
"""Stragglers in a sync job, and backup workers (training.sync.backup_workers;
docs/FAULT_TOLERANCE.md, "Backup workers"). Prints figures, one table of ratios measured
in the same run, rounds interleaved and repeated, medians kept:

  the reference job (deploy/local/fashion_mnist.yaml's MLP) with 2 servers x 3 workers,
  sync, run four ways: backup_workers 1 and 0, each undisturbed and with one worker
  slowed (SIGSTOP for 2 s every 10 s, as a straggler is). The job's samples/s counts
  only the samples of pushes a step took (a late push's are not trained).

  - backup_workers 1, slowed vs undisturbed: goal >= 0.8 (the others go on);
  - backup_workers 0, slowed vs undisturbed: every step waits for the straggler, so the
    job runs at its pace: 8 of every 10 s, about 0.8 at best.

  bench/straggler_bench.py --root ROOT [--repeats N] [--quick]
(--quick: 1 repeat of 4 epochs, a smoke run.)
"""
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_all import key_values, log, print_table, table_arguments  # noqa: E402

STOP_SECONDS = 2.0
PERIOD_SECONDS = 10.0


def config(root, backup_workers, epochs):
    with open(f"{root}/deploy/local/fashion_mnist.yaml") as f:
        text = f.read()
    for key, value in (("workers", 3), ("epochs", epochs)):
        text, count = re.subn(rf"^(\s+{key}:)\s*\S+", rf"\g<1> {value}", text, count=1, flags=re.M)
        assert count == 1, key
    return re.sub(r"^training:\n", f"training:\n  sync: {{backup_workers: {backup_workers}}}\n", text, count=1,
                  flags=re.M)


def slow_down(run_dir, done):
    """Stops worker-2 for STOP_SECONDS of every PERIOD_SECONDS until `done` is set."""
    pid_file = f"{run_dir}/worker-2.pid"
    while not done.wait(0.1) and not os.path.exists(pid_file):
        pass
    stops = 0
    while not done.wait(PERIOD_SECONDS - STOP_SECONDS):
        try:
            with open(pid_file) as f:
                pid = int(f.read().strip())
            os.kill(pid, signal.SIGSTOP)
        except (OSError, ValueError):
            continue  # between processes, or gone
        stops += 1
        try:
            done.wait(STOP_SECONDS)
        finally:
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
    return stops


def job(root, workdir, tag, backup_workers, epochs, slowed):
    path = f"{workdir}/{tag}.yaml"
    with open(path, "w") as f:
        f.write(config(root, backup_workers, epochs))
    run_dir = f"{workdir}/{tag}-run"
    process = subprocess.Popen([f"{root}/deploy/local/run.sh", path], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, env={**os.environ, "PS_RUN_DIR": run_dir})
    done = threading.Event()
    stops = []
    slower = threading.Thread(target=lambda: stops.append(slow_down(run_dir, done))) if slowed else None
    if slower:
        slower.start()
    try:
        out = process.communicate(timeout=7200)[0]
    finally:
        done.set()
        if slower:
            slower.join()
    if process.returncode != 0:
        raise RuntimeError(f"{tag}: run.sh exited {process.returncode}:\n{out[-2000:]}")
    figures = key_values(out.strip().splitlines()[-1])
    late = 0
    for name in os.listdir(run_dir):
        if name.startswith("server-") and name.endswith(".log"):
            with open(f"{run_dir}/{name}") as f:
                late += sum(int(n) for n in re.findall(r"(\d+) late pushes dropped", f.read()))
    figures["late_pushes"] = late
    figures["stops"] = stops[0] if stops else 0
    subprocess.run(["rm", "-rf", run_dir])
    return figures


def main():
    args = table_arguments()
    epochs = 4 if args.quick else 15
    results = {}
    with tempfile.TemporaryDirectory(prefix="ps-straggler-bench.") as workdir:
        for repeat in range(args.repeats):
            log(f"straggler repeat {repeat + 1} of {args.repeats}")
            for backup_workers in (1, 0):
                for slowed in (False, True):
                    name = f"backup{backup_workers}-{'slowed' if slowed else 'undisturbed'}"
                    log(f"straggler {name} ...")
                    results.setdefault(name, []).append(
                        job(args.root, workdir, name, backup_workers, epochs, slowed))
    m = {name: {key: statistics.median(s[key] for s in samples) for key in samples[0]}
         for name, samples in results.items()}
    rows = []
    for backup_workers, goal in ((1, ">= 0.8"), (0, "~0.8 (the straggler's pace)")):
        slowed, undisturbed = m[f"backup{backup_workers}-slowed"], m[f"backup{backup_workers}-undisturbed"]
        rows.append((f"sync 2x3, backup_workers {backup_workers}: one worker stopped 2 s of every 10 s vs undisturbed",
                     f"{slowed['samples_per_sec']:.0f}/s acc {slowed['test_accuracy']:.4f} "
                     f"({slowed['stops']:.0f} stops, {slowed['late_pushes']:.0f} late)",
                     f"{undisturbed['samples_per_sec']:.0f}/s acc {undisturbed['test_accuracy']:.4f} "
                     f"({undisturbed['late_pushes']:.0f} late)",
                     f"{slowed['samples_per_sec'] / undisturbed['samples_per_sec']:.2f}", goal))
    s1, s0 = m["backup1-slowed"], m["backup0-slowed"]
    rows.append(("sync 2x3 with the straggler, backup_workers 1 vs 0",
                 f"{s1['samples_per_sec']:.0f}/s acc {s1['test_accuracy']:.4f}",
                 f"{s0['samples_per_sec']:.0f}/s acc {s0['test_accuracy']:.4f}",
                 f"{s1['samples_per_sec'] / s0['samples_per_sec']:.2f}", "> 1"))
    b1, b0 = m["backup1-undisturbed"], m["backup0-undisturbed"]
    rows.append(("sync 2x3 undisturbed, backup_workers 1 vs 0 (samples of pushes a step took)",
                 f"{b1['samples_per_sec']:.0f}/s acc {b1['test_accuracy']:.4f}",
                 f"{b0['samples_per_sec']:.0f}/s acc {b0['test_accuracy']:.4f}",
                 f"{b1['samples_per_sec'] / b0['samples_per_sec']:.2f}", "(the late pushes' waste)"))
    print()
    print(f"bench/straggler_bench.py: {args.repeats} repeat(s), medians; {epochs} epoch(s); {os.cpu_count()} CPUs")
    print_table(rows)


if __name__ == "__main__":
    main()
