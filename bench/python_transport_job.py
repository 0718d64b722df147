"""The script of bench/python_bench.py's transport figure: a model of `--parameters`
float32 values in 8 tensors, trained by one worker; rounds alternate between
  package  job.step(model): every p.grad gathered, pushed, the next values pulled and
           scattered back into every p (the package's whole path), and
  client   the same push and pull made by the C++ worker client directly on flat
           buffers (what ps_worker's own loop does per step),
both through the same servers, so their ratio is what the package costs. Prints
  python_transport parameters=N package_gbps=X client_gbps=Y ratio=R
(GB/s of 2 x 4 x N tensor bytes per step, medians over the rounds).
"""
import argparse
import math
import statistics
import time

import torch

import paramserver


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--parameters", type=int, required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps-per-round", type=int, default=3)
    args = parser.parse_args()
    job = paramserver.init()
    pieces = 8
    params = [torch.nn.Parameter(torch.zeros(args.parameters // pieces)) for _ in range(pieces)]
    named = [("t%d" % i, p) for i, p in enumerate(params)]
    job.register(named)
    for p in params:
        p.grad = torch.full_like(p, 1e-3)
    total = sum(p.numel() for p in params)
    gradient = torch.full((total,), 1e-3).numpy()
    values = torch.empty(total).numpy()
    timings = {"package": [], "client": []}
    for _ in range(args.rounds):
        for kind in ("package", "client"):
            start = time.perf_counter()
            for _ in range(args.steps_per_round):
                if kind == "package":
                    job.step(named)
                else:
                    job._native.step(gradient, [], values, math.nan, -1)
            timings[kind].append((time.perf_counter() - start) / args.steps_per_round)
    gigabytes = 2 * 4 * total / 1e9
    package = gigabytes / statistics.median(timings["package"])
    client = gigabytes / statistics.median(timings["client"])
    print("python_transport parameters=%d package_gbps=%.3f client_gbps=%.3f ratio=%.3f" %
          (total, package, client, package / client), flush=True)
    job.finish()


if __name__ == "__main__":
    main()
