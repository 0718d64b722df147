"""A job's script for recipe_test: trains agreement_model's CNN under one of its recipes
through paramserver.DistributedOptimizer (the recipe's torch optimizer, wrapped, and its
scheduler), on worker_batch's batches; the finisher writes output.weights.

  recipe_job.py --recipe NAME --steps K --batch B [--clip-grad-norm C] [--job-step]
                [--rank-1-lr-at STEP] [--step-delay S] [--progress FILE]
                [--rank-1-overflows-at STEP,STEP,... [--torch-grad-scaler]] [--device D]

--job-step: no optimizer of the script's own: job.step trains with the spec's
training.optimizer (and its clip_grad_norm).
--rank-1-overflows-at: every worker trains with loss scaling as GradScaler does it (the
loss scaled by a power of two, the gradients unscaled, checked, the step skipped where
one is not finite, the scale backed off); worker 1's gradient overflows at those steps.
With --torch-grad-scaler (and --device cuda) torch.cuda.amp.GradScaler itself does it.
--rank-1-lr-at: worker 1 doubles its groups' lr before that step (the others do not),
and every worker records the exception its step raises to $OUT.<rank> and exits 1.
"""
import argparse
import sys
import time

import torch

import agreement_model as m
import paramserver


class LossScaling:
    """A step's backward pass and optimizer step: plain; or with GradScaler's protocol on
    the CPU (backward of loss x scale, a power of two so that unscaling is exact, the
    gradients unscaled and checked, the scale backed off on an overflow); or with
    torch.cuda.amp.GradScaler. At the steps in `overflows` one gradient value becomes
    inf after the backward pass, as a float16 overflow would make it."""

    def __init__(self, args, overflows):
        self.protocol = args.rank_1_overflows_at is not None
        self.overflows = overflows
        self.scale = 2.0 ** 16  # GradScaler's initial scale
        self.torch_scaler = torch.cuda.amp.GradScaler() if args.torch_grad_scaler else None

    def backward_and_step(self, model, optimizer, loss, step, batch):
        if self.torch_scaler is not None:
            self.torch_scaler.scale(loss).backward()
            self.poison(model, step)
            self.torch_scaler.step(optimizer, loss=loss, batch_size=batch)
            self.torch_scaler.update()
            return
        if not self.protocol:
            loss.backward()
            optimizer.step(loss=loss, batch_size=batch)
            return
        (loss * self.scale).backward()
        self.poison(model, step)
        found_inf = False
        for p in model.parameters():
            p.grad.mul_(1.0 / self.scale)
            found_inf |= not bool(torch.isfinite(p.grad).all())
        self.scale = self.scale / 2 if found_inf else self.scale
        optimizer.step(loss=loss, batch_size=batch, found_inf=found_inf)

    def poison(self, model, step):
        if step in self.overflows:
            next(model.parameters()).grad.view(-1)[0] = float("inf")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--recipe", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--clip-grad-norm", type=float)
    parser.add_argument("--job-step", action="store_true")
    parser.add_argument("--rank-1-lr-at", type=int)
    parser.add_argument("--out", help="where a worker records its step's exception")
    parser.add_argument("--step-delay", type=float, default=0.0)
    parser.add_argument("--rank-1-overflows-at", default=None)
    parser.add_argument("--torch-grad-scaler", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--progress", help="rank 0 writes its step here after each one")
    args = parser.parse_args()
    torch.set_num_threads(1)
    job = paramserver.init()
    data = m.dataset()
    model = m.seeded_cnn().to(args.device)
    job.register(model)
    optimizer, scheduler = m.make_recipe(
        args.recipe, model, args.steps,
        lambda wrapped: paramserver.DistributedOptimizer(wrapped, job,
                                                         clip_grad_norm=args.clip_grad_norm))
    if job.step_number > 0 and not args.job_step:  # resumed from a checkpoint
        optimizer.resume_schedule(scheduler)
    overflows = set()
    if args.rank_1_overflows_at is not None and job.rank == 1:
        overflows = {int(s) for s in args.rank_1_overflows_at.split(",")}
    scaler = LossScaling(args, overflows)
    while job.step_number < args.steps:
        step = job.step_number
        images, labels, _, _ = (t.to(args.device) for t in m.worker_batch(
            data, job.rank, job.num_workers, step, args.batch))
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        if step == args.rank_1_lr_at and job.rank == 1:
            for group in optimizer.param_groups:
                group["lr"] *= 2
        try:
            if args.job_step:
                loss.backward()
                job.step(model, loss=loss, batch_size=args.batch)
                continue
            scaler.backward_and_step(model, optimizer, loss, step, args.batch)
        except paramserver.Error as error:
            if args.out is None:
                raise
            with open("%s.%d" % (args.out, job.rank), "w") as f:
                f.write("step %d: %s\n" % (step, error))
            return 1
        m.advance_schedule(scheduler, loss)
        if args.progress and job.rank == 0:
            m.write_progress(args.progress, job.step_number)
        time.sleep(args.step_delay)
    with torch.no_grad():
        images, labels = data[0].to(args.device), data[1].to(args.device)
        accuracy = (model(images).argmax(dim=1) == labels).float().mean().item()
    print("worker %d of %d: %s to step %d, accuracy %.4f" %
          (job.rank, job.num_workers, args.recipe, job.step_number, accuracy), flush=True)
    job.finish(test_accuracy=accuracy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
