#!/usr/bin/python3
"""The embedding optimizers' reference: PyTorch's own, on a sparse gradient.

Reads the case tests/sparse_optimizer_agreement_test writes (an optimizer, a table, and
per step the rows in that step's gradient), runs torch.optim.SparseAdam, Adagrad or SGD
on one parameter whose .grad is a sparse COO tensor each step (empty when no row is in
the step, as an nn.EmbeddingBag(sparse=True) gives), and prints the final table, one row
per line, each float as float.hex (exact).

An empty gradient (a step that touched no row of the table): Debian's torch 1.13 fails on
it in SparseAdam and Adagrad ("The size of tensor a (4) must match the size of tensor b
(0)"); later torch skips the update and still counts the step ("Skip update for empty
grad"). This does what later torch does: the step is counted, nothing else changes.
"""
import sys

import torch


def main(path):
    with open(path) as case:
        lines = [line.split() for line in case if line.strip()]
    header = lines.pop(0)
    kind, lr, beta1, beta2, eps = header[0], *map(float, header[1:5])
    rows, dim, steps = map(int, header[5:8])
    table = torch.tensor([[float.fromhex(x) for x in lines.pop(0)] for _ in range(rows)],
                         dtype=torch.float32)
    weight = torch.nn.Parameter(table)
    if kind == "adam":
        optimizer = torch.optim.SparseAdam([weight], lr=lr, betas=(beta1, beta2), eps=eps)
    elif kind == "adagrad":
        optimizer = torch.optim.Adagrad([weight], lr=lr, eps=eps)
    else:
        optimizer = torch.optim.SGD([weight], lr=lr)
    for _ in range(steps):
        count = int(lines.pop(0)[0])
        indices, values = [], []
        for _ in range(count):
            entry = lines.pop(0)
            indices.append(int(entry[0]))
            values.append([float.fromhex(x) for x in entry[1:]])
        if count == 0 and kind != "sgd":
            state = optimizer.state[weight]
            if kind == "adam" and not state:  # SparseAdam's lazy initialisation
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(weight, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(weight, memory_format=torch.preserve_format)
            state["step"] += 1
            continue
        index_tensor = torch.tensor([indices], dtype=torch.int64).reshape(1, count)
        value_tensor = torch.tensor(values, dtype=torch.float32).reshape(count, dim)
        weight.grad = torch.sparse_coo_tensor(index_tensor, value_tensor, (rows, dim))
        optimizer.step()
    for row in weight.detach():
        print(" ".join(float(x).hex() for x in row.tolist()))


if __name__ == "__main__":
    main(sys.argv[1])
