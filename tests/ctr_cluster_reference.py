#!/usr/bin/python3
"""The CTR job's reference: one PyTorch process training on all the workers' batches together.

Reads the Criteo-format training file the test wrote, makes the initial weights (nn.Linear's
default init for the MLP, N(0, 1) rows for every id the file holds) and writes them as
--init (fc<i>.weight/bias, C<k>.ids, C<k>.weight), then trains --steps sync steps of
--workers x --batch examples, shuffle off: worker w reads its contiguous part of the file
(as common/wire/shard_layout.h's ContiguousPart cuts it) in order, and each step is one update
with the mean BCE-with-logits loss over all W x B examples. One
nn.EmbeddingBag(mode='sum', sparse=True) per field, nn.Linear layers with ReLU between;
SparseAdam (or Adagrad) for the tables, Adam for the MLP. With --table-dims and
--table-optimizers each table has its own dim and optimizer (adam, adagrad, or
rowwise_adagrad: FBGEMM's EXACT_ROWWISE_ADAGRAD, which torch lacks, written here from its
published rule). Writes the final weights as --out, in the same names.

A table with no row in a step: Debian's torch 1.13 fails on an empty sparse gradient; later
torch counts the step and changes nothing, which is what this does.
"""
import argparse
import gzip
import math

import torch

from safetensors_io import save_safetensors
from torch_row_optimizers import RowwiseAdagrad


def read_criteo(path, dense_features, fields):
    dense, ids, labels = [], [], []
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            labels.append(float(parts[0]))
            dense.append([math.log1p(max(int(v), 0)) if v else 0.0
                          for v in parts[1:1 + dense_features]])
            ids.append([int(v, 16) if v else -1 for v in parts[1 + dense_features:]])
    return (torch.tensor(dense, dtype=torch.float32), ids,
            torch.tensor(labels, dtype=torch.float32))


def contiguous_part(total, parts, rank):
    return rank * total // parts, (rank + 1) * total // parts


def main():
    parser = argparse.ArgumentParser()
    for name in ("data", "init", "out", "optimizer"):
        parser.add_argument("--" + name, required=True)
    for name in ("dense", "fields", "dim", "workers", "batch", "steps", "seed"):
        parser.add_argument("--" + name, type=int, required=True)
    parser.add_argument("--layers", type=int, nargs="+", required=True)
    parser.add_argument("--table-dims", type=int, nargs="+", help="each table's (default --dim)")
    parser.add_argument("--table-optimizers", nargs="+",
                        help="each table's (default --optimizer)")
    for name in ("lr", "table_lr", "eps", "table_eps"):
        parser.add_argument("--" + name, type=float, required=True)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    dense, ids, labels = read_criteo(args.data, args.dense, args.fields)

    linears = [torch.nn.Linear(args.layers[i], args.layers[i + 1])
               for i in range(len(args.layers) - 1)]
    table_ids = [sorted({row[k] for row in ids if row[k] >= 0}) for k in range(args.fields)]
    dims = args.table_dims or [args.dim] * args.fields
    kinds = args.table_optimizers or [args.optimizer] * args.fields
    bags = [torch.nn.EmbeddingBag(len(t), dims[k], mode="sum", sparse=True)
            for k, t in enumerate(table_ids)]
    index_of = [{table_id: i for i, table_id in enumerate(t)} for t in table_ids]

    def weights():
        tensors = {}
        for i, linear in enumerate(linears):
            tensors["fc%d.weight" % (i + 1)] = linear.weight
            tensors["fc%d.bias" % (i + 1)] = linear.bias
        for k, bag in enumerate(bags):
            tensors["C%d.ids" % (k + 1)] = torch.tensor(table_ids[k], dtype=torch.int64)
            tensors["C%d.weight" % (k + 1)] = bag.weight
        return tensors

    save_safetensors(args.init, weights())
    mlp = [p for linear in linears for p in linear.parameters()]
    dense_optimizer = torch.optim.Adam(mlp, lr=args.lr, eps=args.eps)
    tables = [bag.weight for bag in bags]
    table_optimizers = [table_optimizer_of(kind, weight, args.table_lr, args.table_eps)
                        for kind, weight in zip(kinds, tables)]
    loss_function = torch.nn.BCEWithLogitsLoss()
    parts = [contiguous_part(len(ids), args.workers, w) for w in range(args.workers)]
    for step in range(args.steps):
        rows = [begin + step * args.batch + i for begin, _ in parts for i in range(args.batch)]
        pooled = []
        for k in range(args.fields):
            indices, offsets = [], []
            for r in rows:
                offsets.append(len(indices))
                if ids[r][k] >= 0:  # a missing id: an empty bag (zeros)
                    indices.append(index_of[k][ids[r][k]])
            pooled.append(bags[k](torch.tensor(indices, dtype=torch.int64),
                                  torch.tensor(offsets, dtype=torch.int64)))
        x = torch.cat([dense[rows]] + pooled, dim=1)
        for i, linear in enumerate(linears):
            x = linear(x)
            if i + 1 < len(linears):
                x = torch.relu(x)
        loss = loss_function(x.reshape(-1), labels[rows])
        dense_optimizer.zero_grad()
        for table_optimizer in table_optimizers:
            table_optimizer.zero_grad()
        loss.backward()
        dense_optimizer.step()
        for kind, weight, table_optimizer in zip(kinds, tables, table_optimizers):
            grad = weight.grad
            if grad is not None and grad._nnz() == 0:
                weight.grad = None  # counted below, changed not
                state = table_optimizer.state[weight]
                if kind != "rowwise_adagrad":  # it counts no steps
                    if not state:
                        state["step"] = 0
                        if kind == "adam":
                            state["exp_avg"] = torch.zeros_like(weight)
                            state["exp_avg_sq"] = torch.zeros_like(weight)
                        else:
                            state["sum"] = torch.zeros_like(weight)
                    state["step"] += 1
            table_optimizer.step()
    save_safetensors(args.out, weights())


def table_optimizer_of(kind, weight, lr, eps):
    if kind == "adam":
        return torch.optim.SparseAdam([weight], lr=lr, eps=eps)
    if kind == "adagrad":
        return torch.optim.Adagrad([weight], lr=lr, eps=eps)
    if kind == "rowwise_adagrad":
        return RowwiseAdagrad([weight], lr=lr, eps=eps)
    raise ValueError("no table optimizer %r" % kind)


if __name__ == "__main__":
    main()
