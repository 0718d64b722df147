"""A job's script for the dynamic data tests: a small linear regression trained on the
batches job.batches() hands this worker (async mode), every batch by one job.step.

  leased_job.py --examples N --batch B
"""
import argparse

import torch

import paramserver


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(7)
    inputs = torch.randn(args.examples, 8, generator=generator)
    targets = inputs @ torch.arange(1.0, 9.0) + 0.5
    job = paramserver.init()
    model = torch.nn.Linear(8, 1)
    job.register(model)
    batches = 0
    for indices in job.batches(args.examples, args.batch):
        loss = torch.nn.functional.mse_loss(model(inputs[indices]).squeeze(1), targets[indices])
        model.zero_grad()
        loss.backward()
        job.step(model, loss=loss)
        batches += 1
    print("leased_job: trained %d batches" % batches, flush=True)
    job.finish()


if __name__ == "__main__":
    main()
