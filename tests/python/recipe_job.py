"""A job's script for recipe_test: trains agreement_model's CNN under one of its recipes
through paramserver.DistributedOptimizer (the recipe's torch optimizer, wrapped, and its
scheduler), on worker_batch's batches; the finisher writes output.weights.

  recipe_job.py --recipe NAME --steps K --batch B [--clip-grad-norm C]
                [--rank-1-lr-at STEP] [--step-delay S] [--progress FILE]

--rank-1-lr-at: worker 1 doubles its groups' lr before that step (the others do not),
and every worker records the exception its step raises to $OUT.<rank> and exits 1.
"""
import argparse
import os
import sys
import time

import torch

import agreement_model as m
import paramserver


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--recipe", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--clip-grad-norm", type=float)
    parser.add_argument("--rank-1-lr-at", type=int)
    parser.add_argument("--out", help="where a worker records its step's exception")
    parser.add_argument("--step-delay", type=float, default=0.0)
    parser.add_argument("--progress", help="rank 0 writes its step here after each one")
    args = parser.parse_args()
    torch.set_num_threads(1)
    job = paramserver.init()
    data = m.dataset()
    model = m.seeded_cnn()
    job.register(model)
    optimizer, scheduler = m.make_recipe(
        args.recipe, model, args.steps,
        lambda wrapped: paramserver.DistributedOptimizer(wrapped, job,
                                                         clip_grad_norm=args.clip_grad_norm))
    while job.step_number < args.steps:
        step = job.step_number
        images, labels, _, _ = m.worker_batch(data, job.rank, job.num_workers, step, args.batch)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        if step == args.rank_1_lr_at and job.rank == 1:
            for group in optimizer.param_groups:
                group["lr"] *= 2
        try:
            optimizer.step(loss=loss, batch_size=args.batch)
        except paramserver.Error as error:
            if args.out is None:
                raise
            with open("%s.%d" % (args.out, job.rank), "w") as f:
                f.write("step %d: %s\n" % (step, error))
            return 1
        m.advance_schedule(scheduler, loss)
        if args.progress and job.rank == 0:
            with open(args.progress + ".part", "w") as f:
                f.write(str(job.step_number))
            os.replace(args.progress + ".part", args.progress)
        time.sleep(args.step_delay)
    with torch.no_grad():
        images, labels, _ = data
        accuracy = (model(images).argmax(dim=1) == labels).float().mean().item()
    print("worker %d of %d: %s to step %d, accuracy %.4f" %
          (job.rank, job.num_workers, args.recipe, job.step_number, accuracy), flush=True)
    job.finish(test_accuracy=accuracy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
