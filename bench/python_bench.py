#!/usr/bin/env python3
"""The Python package's figures (docs/PYTHON.md), each a ratio measured in one run:

  transport  push+pull through the package (job.step: gather every p.grad, push, pull,
             scatter into every p) against the C++ worker client's own push+pull of the
             same flat buffers, in the same job, interleaved rounds (bench/
             python_transport_job.py). Goal: at least 0.8.
  clip       a step of DistributedOptimizer with clip_grad_norm (sync, 2 servers x 2
             workers: the servers hold the step, the workers gather the mean gradient's
             norm and bring the coefficient with their next pull) against the same step
             without, interleaved rounds (bench/python_clip_job.py): the cost of
             global-norm clipping, as a ratio of step times.
  cnn        examples/pytorch_cnn as a job (2 servers x 2 workers, sync, run by
             deploy/local/run.sh) against the same CNN, batches and Adam with PyTorch's
             DistributedDataParallel (gloo) and with the torch.distributed.rpc
             parameter server peer (bench/pytorch_peers.py --model cnn), 2 workers
             each: samples/s and test accuracy.

  bench/python_bench.py --root ROOT [--repeats N] [--epochs E] [--quick] [--json FILE]
(--json FILE writes FILE.python.json: FILE is run_all.py's.)
Repeats are interleaved (ours, DDP, RPC, ours, ...); medians are printed.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile


def log(message):
    print(message, file=sys.stderr, flush=True)


def run_job(root, spec_text, folder, timeout):
    """Runs `spec_text` with deploy/local/run.sh; returns (final line, run folder)."""
    spec = os.path.join(folder, "job.yaml")
    with open(spec, "w") as f:
        f.write(spec_text)
    run_dir = os.path.join(folder, "run")
    env = dict(os.environ, PS_RUN_DIR=run_dir)
    result = subprocess.run([os.path.join(root, "deploy/local/run.sh"), spec], env=env,
                            capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError("%s failed:\n%s" % (spec, result.stderr[-3000:]))
    return result.stdout.strip().splitlines()[-1], run_dir


def script_figures(root, name, workers, training, parameters, rounds):
    """Runs bench/<name>_job.py as a sync job of 2 servers x `workers` workers with
    `training` (the spec's section, YAML flow); returns the figures of its `name` line."""
    with tempfile.TemporaryDirectory() as folder:
        script = os.path.join(root, "bench/%s_job.py" % name)
        _, run_dir = run_job(root, (
            "cluster: {scheduler: '127.0.0.1:0', servers: 2, workers: %d, shards: 4}\n"
            "model: {type: torch}\ntraining: %s\n"
            "worker: {command: [/usr/bin/python3, %s, --parameters, '%d', --rounds, '%d']}\n"
            % (workers, training, script, parameters, rounds)), folder, 900)
        logs = ""
        for rank in range(workers):
            with open(os.path.join(run_dir, "worker-%d.log" % rank)) as f:
                logs += f.read()
        line = re.search(name + r" .*", logs).group(0)
    return {k: float(v) for k, v in re.findall(r"(\w+)=([0-9.]+)", line)}


def transport(root, parameters, rounds):
    return script_figures(root, "python_transport", 1, "{mode: sync}", parameters, rounds)


def clip_cost(root, parameters, rounds):
    return script_figures(root, "python_clip", 2,
                          "{mode: sync, optimizer: {type: sgd, learning_rate: 0.000001}}",
                          parameters, rounds)


def cnn_ours(root, epochs, max_steps):
    example = os.path.join(root, "examples/pytorch_cnn")
    with open(os.path.join(example, "job.yaml")) as f:
        spec = f.read()
    spec = re.sub(r"(?m)^  epochs: .*$", "  epochs: %d" % epochs, spec)
    spec = re.sub(r"(?m)^  batch_size: .*$",
                  "  batch_size: 32\n  max_steps: %d" % max_steps, spec)
    spec = spec.replace("command: [/usr/bin/python3, train.py]",
                        "command: [/usr/bin/python3, %s/train.py]" % example)
    with tempfile.TemporaryDirectory() as folder:
        final, _ = run_job(root, spec, folder, 3600)
    figures = dict(re.findall(r"(\w+)=([0-9.]+)", final))
    return {"samples_per_sec": float(figures["samples_per_sec"]),
            "test_accuracy": float(figures["test_accuracy"])}


def cnn_peer(root, kind, epochs, max_steps):
    env = dict(os.environ, PYTHONPATH=os.path.join(root, "bazel-bin/python"))
    result = subprocess.run(["/usr/bin/python3", os.path.join(root, "bench/pytorch_peers.py"),
                             "--peer", kind, "--model", "cnn", "--workers", "2", "--epochs",
                             str(epochs), "--batch", "32", "--max-steps", str(max_steps)],
                            env=env, capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        raise RuntimeError("the %s peer failed:\n%s" % (kind, result.stderr[-3000:]))
    figures = dict(re.findall(r"(\w+)=([0-9.]+)", result.stdout))
    return {"samples_per_sec": float(figures["samples_per_sec"]),
            "test_accuracy": float(figures["test_accuracy"])}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", help="also write the figures here, as FILE.python.json")
    args, _ = parser.parse_known_args()  # bench/run.sh's other options are run_all.py's
    repeats = 1 if args.quick else args.repeats
    parameters = (1 << 20) if args.quick else (16 << 20)
    max_steps = 40 if args.quick else 0
    samples = {"transport": [], "clip": [], "ours": [], "ddp": [], "rpc": []}
    for repeat in range(repeats):
        log("python bench: repeat %d of %d" % (repeat + 1, repeats))
        samples["transport"].append(transport(args.root, parameters, 3 if args.quick else 5))
        samples["clip"].append(clip_cost(args.root, parameters, 3 if args.quick else 5))
        samples["ours"].append(cnn_ours(args.root, args.epochs, max_steps))
        samples["ddp"].append(cnn_peer(args.root, "ddp", args.epochs, max_steps))
        samples["rpc"].append(cnn_peer(args.root, "rpc", args.epochs, max_steps))

    def median(kind, key):
        return statistics.median(sample[key] for sample in samples[kind])

    figures = {
        "transport_package_gbps": median("transport", "package_gbps"),
        "transport_client_gbps": median("transport", "client_gbps"),
        "transport_ratio": median("transport", "ratio"),
        "clip_plain_ms": median("clip", "plain_ms"),
        "clip_clipped_ms": median("clip", "clipped_ms"),
        "clip_ratio": median("clip", "ratio"),
    }
    for kind in ("ours", "ddp", "rpc"):
        figures["cnn_%s_samples_per_sec" % kind] = median(kind, "samples_per_sec")
        figures["cnn_%s_test_accuracy" % kind] = median(kind, "test_accuracy")
    print("The Python package (%d repeat(s), medians; %d-parameter transport model; CNN: %s)"
          % (repeats, parameters, "%d steps per worker" % max_steps if max_steps
             else "%d epoch(s)" % args.epochs))
    print("%-58s %10s %10s %8s %6s" % ("figure", "ours", "reference", "ratio", "goal"))
    print("%-58s %10.2f %10.2f %8.2f %6s" % (
        "push+pull GB/s: package vs the C++ worker client", figures["transport_package_gbps"],
        figures["transport_client_gbps"], figures["transport_ratio"], ">=0.8"))
    print("%-58s %10.2f %10.2f %8.2f %6s" % (
        "step ms, sync 2x2: clip_grad_norm vs none", figures["clip_clipped_ms"],
        figures["clip_plain_ms"], figures["clip_ratio"], ""))
    for kind, name in (("ddp", "DDP (gloo)"), ("rpc", "torch.distributed.rpc PS")):
        print("%-58s %10.0f %10.0f %8.2f %6s" % (
            "CNN samples/s, 2 workers: ours vs %s" % name, figures["cnn_ours_samples_per_sec"],
            figures["cnn_%s_samples_per_sec" % kind],
            figures["cnn_ours_samples_per_sec"] / figures["cnn_%s_samples_per_sec" % kind], ""))
        print("%-58s %10.4f %10.4f %8s %6s" % (
            "CNN test accuracy: ours vs %s" % name, figures["cnn_ours_test_accuracy"],
            figures["cnn_%s_test_accuracy" % kind], "", ""))
    if args.json:
        with open(args.json + ".python.json", "w") as f:
            json.dump({"figures": figures, "samples": samples}, f, indent=2)


if __name__ == "__main__":
    main()
