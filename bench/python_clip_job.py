"""A job's script for bench/python_bench.py's clipping figure: in a sync job, steps of
paramserver.DistributedOptimizer(SGD) with clip_grad_norm (the servers hold each step,
the workers gather the mean gradient's norm from every shard and bring the coefficient
with their next pull) against the same steps without, in interleaved rounds on the same
parameters. Rank 0 prints

  python_clip parameters=N plain_ms=T clipped_ms=T ratio=R

(median time of a step; ratio = clipped / plain.)

  python_clip_job.py --parameters N --rounds R [--steps-per-round S]
"""
import argparse
import statistics
import time

import torch

import paramserver


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--parameters", type=int, required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps-per-round", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    job = paramserver.init()
    # Eight tensors, as a model has several.
    size = args.parameters // 8
    params = [torch.zeros(size, requires_grad=True) for _ in range(8)]
    job.register([("t%d" % i, p) for i, p in enumerate(params)])
    for p in params:
        p.grad = torch.full_like(p, 1e-3)
    plain = paramserver.DistributedOptimizer(torch.optim.SGD(params, lr=1e-6), job)
    clipped = paramserver.DistributedOptimizer(torch.optim.SGD(params, lr=1e-6), job,
                                               clip_grad_norm=1.0)
    timings = {"plain": [], "clipped": []}
    for _ in range(args.rounds):
        for kind, optimizer in (("plain", plain), ("clipped", clipped)):
            start = time.perf_counter()
            for _ in range(args.steps_per_round):
                optimizer.step()
            timings[kind].append((time.perf_counter() - start) / args.steps_per_round)
    plain_ms = 1e3 * statistics.median(timings["plain"])
    clipped_ms = 1e3 * statistics.median(timings["clipped"])
    if job.rank == 0:
        print("python_clip parameters=%d plain_ms=%.3f clipped_ms=%.3f ratio=%.3f" %
              (8 * size, plain_ms, clipped_ms, clipped_ms / plain_ms), flush=True)
    job.finish()


if __name__ == "__main__":
    main()
