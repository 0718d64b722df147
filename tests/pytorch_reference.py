#!/usr/bin/env python3
"""The reference computation for tests/pytorch_agreement_test: PyTorch training the same
MLP with the same optimizer on the same batches, from the same initial weights.

  pytorch_reference.py --init INIT.safetensors --out OUT.safetensors \
      --layers 784,128,10 --workers 2 --batch 32 --steps 5 \
      [--optimizer 'SGD lr=0.05 momentum=0.9 nesterov=True'] [--path-length FILE] \
      [--schedule 'warmup_steps=3 decay=cosine total_steps=10'] \
      [--group '*.bias weight_decay=0.0' ...]

--optimizer names a torch.optim class and its keyword arguments (beta1=, beta2= for
betas); without it, Adam with lr 0.001, betas (0.9, 0.999) and eps 1e-7. --path-length
writes the sum over steps of the largest change of any weight in that step. --schedule
(keys as training.optimizer.lr_schedule's, tests/torch_schedules.py) steps that
torch.optim.lr_scheduler after each optimizer step. Each --group is a parameter group:
comma-separated name patterns (fnmatch, as training.optimizer.groups' params) and the
keyword arguments it overrides; parameters no group names form the first group, with
--optimizer's.

Writes freshly initialised weights (torch.manual_seed(1), nn.Linear's default init) to
INIT, then trains `steps` steps: step s uses, for each worker r, examples
r*n/W + s*batch ... + batch of the training set in file order (shuffle off), concatenated,
which is what a sync cluster of W workers computes. Writes the result to OUT. With
--exact EXACT it also trains a float64 copy from the same initial weights and writes it
(rounded to F32) to EXACT: how far float32 arithmetic itself strays on this problem.
Safetensors are written by tests/safetensors_io.py.
"""
import argparse
import fnmatch
import gzip
import struct

import numpy as np
import torch

from safetensors_io import save_safetensors
from torch_schedules import make_scheduler

TRAIN_IMAGES = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"
TRAIN_LABELS = "/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz"


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


class Mlp(torch.nn.Module):
    def __init__(self, widths):
        super().__init__()
        self.count = len(widths) - 1
        for i in range(self.count):
            setattr(self, f"fc{i + 1}", torch.nn.Linear(widths[i], widths[i + 1]))

    def forward(self, x):
        for i in range(self.count):
            x = getattr(self, f"fc{i + 1}")(x)
            if i + 1 < self.count:
                x = torch.relu(x)
        return x


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--init", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--layers", default="784,128,10")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--optimizer", default="Adam lr=0.001 beta1=0.9 beta2=0.999 eps=1e-7")
    parser.add_argument("--path-length", help="write the float32 run's path length here")
    parser.add_argument("--schedule", default="", help="an lr_schedule, stepped after each step")
    parser.add_argument("--group", action="append", default=[], help="patterns and overrides")
    parser.add_argument("--exact", help="also write the float64 run's weights here")
    parser.add_argument("--clip", type=float, default=0.0,
                        help="clip_grad_norm_ each step's (mean) gradient to this norm")
    parser.add_argument("--norms", help="write the float32 run's gradient norm per step here")
    args = parser.parse_args()

    torch.manual_seed(1)
    torch.set_num_threads(1)
    widths = [int(w) for w in args.layers.split(",")]
    model = Mlp(widths)
    save_safetensors(args.init, model.state_dict())
    initial = {name: tensor.clone() for name, tensor in model.state_dict().items()}

    images = torch.from_numpy(read_idx(TRAIN_IMAGES).reshape(-1, 784).astype(np.float32) / np.float32(255.0))
    labels = torch.from_numpy(read_idx(TRAIN_LABELS).astype(np.int64))
    norms = []
    path_length = train(model, images, labels, args, norms)
    save_safetensors(args.out, model.state_dict())
    if args.path_length:
        with open(args.path_length, "w") as out:
            out.write(repr(path_length) + "\n")
    if args.norms:
        with open(args.norms, "w") as out:
            out.write("".join(repr(norm) + "\n" for norm in norms))
    if args.exact:
        exact = Mlp(widths).double()
        exact.load_state_dict({name: tensor.double() for name, tensor in initial.items()})
        train(exact, images.double(), labels, args)
        save_safetensors(args.exact, exact.state_dict())


def keyword_arguments(pairs):
    kwargs = {}
    for pair in pairs:
        name, value = pair.split("=")
        kwargs[name] = value == "True" if value in ("True", "False") else float(value)
    if "beta1" in kwargs:
        kwargs["betas"] = (kwargs.pop("beta1"), kwargs.pop("beta2"))
    return kwargs


def make_optimizer(model, description, groups=()):
    kind, *pairs = description.split()
    named = list(model.named_parameters())
    claimed = set()
    param_groups = []
    for group in groups:
        patterns, *overrides = group.split()
        members = [p for name, p in named
                   if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns.split(","))]
        claimed.update(id(p) for p in members)
        param_groups.append({"params": members, **keyword_arguments(overrides)})
    rest = [p for _, p in named if id(p) not in claimed]
    return getattr(torch.optim, kind)([{"params": rest}] + param_groups, **keyword_arguments(pairs))


def train(model, images, labels, args, norms=None):
    """Trains; returns the sum over steps of the largest change of any weight. With
    args.clip, the gradient (the mean over every worker's batch) is clipped as DDP users
    clip, after averaging; `norms` gets each step's norm before clipping."""
    n = images.shape[0]
    optimizer = make_optimizer(model, args.optimizer, args.group)
    scheduler = make_scheduler(optimizer, args.schedule) if args.schedule else None
    path_length = 0.0
    for step in range(args.steps):
        rows = []
        for worker in range(args.workers):
            first = worker * n // args.workers + step * args.batch
            rows.extend(range(first, first + args.batch))
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(images[rows]), labels[rows])
        loss.backward()
        if args.clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            if norms is not None:
                norms.append(float(norm))
        before = [p.detach().clone() for p in model.parameters()]
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        path_length += max(float((p.detach() - b).abs().max())
                           for p, b in zip(model.parameters(), before))
    return path_length


if __name__ == "__main__":
    main()
