"""A job's script for the Python package's cluster tests: trains agreement_model's CNN
(or, with --table, its TableNet on a paramserver.Embedding) through the package, sync,
on worker_batch's batches, and finishes with the final accuracy on the whole set. The
finisher writes output.weights (the spec's).

  agreement_job.py --steps K --batch B [--table --table-rows OUT.npy [--table-mode mean]
                    [--table-optimizer JSON]]
                   [--step-delay S] [--dropout P]

--dropout P drops logits with probability P before the loss, its masks drawn from
torch's generator seeded per step (job.seed_steps): a resumed job draws the masks a job
never stopped draws.
"""
import argparse
import json
import sys
import time

import numpy
import torch

import agreement_model as m
import paramserver


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--table", action="store_true")
    parser.add_argument("--table-rows", help="rank 0 writes the table's initial rows here")
    parser.add_argument("--table-mode", default="sum", help="the Embedding's pooling")
    parser.add_argument("--table-optimizer", help="the Embedding's optimizer=, as JSON")
    parser.add_argument("--step-delay", type=float, default=0.0)
    parser.add_argument("--progress", help="rank 0 writes its step here after each one")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dropout", type=float, default=0.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    job = paramserver.init()
    data = m.dataset()
    if args.table:
        torch.manual_seed(1234)
        table = paramserver.Embedding(
            job, "items", m.TABLE_DIM, mode=args.table_mode,
            optimizer=json.loads(args.table_optimizer) if args.table_optimizer else None)
        model = m.TableNet(table)
    else:
        model = m.seeded_cnn()
    model.to(args.device)
    job.register(model)
    if args.dropout:
        job.seed_steps(20261204)
    if args.table and job.rank == 0 and args.table_rows:
        with torch.no_grad():  # every row once: a bag per id (any pooling of one row is it)
            every = torch.arange(m.VOCABULARY)
            numpy.save(args.table_rows, table(every, every).numpy())
    while job.step_number < args.steps:  # the servers' step: a rollback moves it back
        step = job.step_number
        images, labels, ids, offsets = (t.to(args.device) for t in m.worker_batch(
            data, job.rank, job.num_workers, step, args.batch))
        model.zero_grad()
        logits = model(images, ids, offsets) if args.table else model(images)
        if args.dropout:
            logits = torch.nn.functional.dropout(logits, args.dropout, training=True)
        loss = torch.nn.functional.cross_entropy(logits, labels)
        loss.backward()
        job.step(model, loss=loss, batch_size=args.batch)
        if args.progress and job.rank == 0:
            m.write_progress(args.progress, job.step_number)
        time.sleep(args.step_delay)
    images, labels, ids = (t.to(args.device) for t in data)
    with torch.no_grad():
        every = torch.arange(0, ids.numel(), m.IDS_PER_EXAMPLE, device=args.device)
        logits = model(images, ids.reshape(-1), every) if args.table else model(images)
    accuracy = (logits.argmax(dim=1) == labels).float().mean().item()
    print("worker %d of %d: trained to step %d, accuracy %.4f" %
          (job.rank, job.num_workers, job.step_number, accuracy), flush=True)
    job.finish(test_accuracy=accuracy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
