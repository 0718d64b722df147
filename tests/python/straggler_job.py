"""A sync job's script for the backup workers test: a linear regression trained until
the job's step reaches --steps, each worker drawing its own batches. With SLOW_SECONDS
set, this worker sleeps that long before every SLOW_EVERY-th of its steps (a straggler).
Prints the loss over the whole set before and after, and the longest jump of
job.step_number over one job.step (a push late on every shard goes on at the servers'
step).

  straggler_job.py --steps N
"""
import argparse
import os
import time

import torch

import paramserver

EXAMPLES, BATCH = 2000, 16


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = torch.Generator().manual_seed(7)
    inputs = torch.randn(EXAMPLES, 8, generator=data)
    targets = inputs @ torch.arange(1.0, 9.0) + 0.5
    slow_seconds = float(os.environ.get("SLOW_SECONDS", "0"))
    slow_every = int(os.environ.get("SLOW_EVERY", "10"))
    job = paramserver.init()
    model = torch.nn.Linear(8, 1)
    job.register(model)
    batches = torch.Generator().manual_seed(1000 + job.rank)

    def whole_loss():
        with torch.no_grad():
            return torch.nn.functional.mse_loss(model(inputs).squeeze(1), targets).item()

    before = whole_loss()
    steps_run, longest_jump = 0, 0
    while job.step_number < args.steps:
        if slow_seconds and steps_run % slow_every == slow_every - 1:
            time.sleep(slow_seconds)
        indices = torch.randint(0, EXAMPLES, (BATCH,), generator=batches)
        loss = torch.nn.functional.mse_loss(model(inputs[indices]).squeeze(1), targets[indices])
        model.zero_grad()
        loss.backward()
        at = job.step_number
        job.step(model, loss=loss)
        longest_jump = max(longest_jump, job.step_number - at)
        steps_run += 1
    print("straggler_job: %d steps run, longest jump %d, loss %.4f before, %.4f after"
          % (steps_run, longest_jump, before, whole_loss()), flush=True)
    job.finish()


if __name__ == "__main__":
    main()
