#!/usr/bin/python3
"""The CTR model's reference: PyTorch training it on the same batches from the same weights.

Reads the case tests/ctr_agreement_test writes (the model's shape, the optimizers, the
examples, the MLP's initial parameters and every field's initial rows), builds one
nn.EmbeddingBag(mode='sum', sparse=True) per field and nn.Linear layers with ReLU
between, and trains with BCEWithLogitsLoss (mean): SparseAdam for the tables, Adam for
the MLP, batch after batch in file order. Prints the final MLP parameters, then every
field's rows, each float as float.hex.
"""
import sys

import torch


def main(path):
    with open(path) as f:
        words = f.read().split()
    at = 0

    def take(n, convert=float.fromhex):
        nonlocal at
        values = [convert(w) for w in words[at:at + n]]
        at += n
        return values

    dense_features, fields, dim, batch, batches, layer_count = take(6, int)
    layers = take(layer_count, int)
    lr, beta1, beta2, eps, table_lr, table_eps = take(6)
    examples = batch * batches
    dense = torch.tensor(take(examples * dense_features), dtype=torch.float32).reshape(examples, dense_features)
    ids = take(examples * fields, int)
    labels = torch.tensor(take(examples), dtype=torch.float32)
    linears = []
    for i in range(layer_count - 1):
        linear = torch.nn.Linear(layers[i], layers[i + 1])
        with torch.no_grad():
            linear.weight.copy_(torch.tensor(take(layers[i + 1] * layers[i])).reshape(layers[i + 1], layers[i]))
            linear.bias.copy_(torch.tensor(take(layers[i + 1])))
        linears.append(linear)
    bags, index_of = [], []
    for k in range(fields):
        count = take(1, int)[0]
        table_ids = take(count, int)
        rows = torch.tensor(take(count * dim), dtype=torch.float32).reshape(count, dim)
        bag = torch.nn.EmbeddingBag(count, dim, mode="sum", sparse=True)
        with torch.no_grad():
            bag.weight.copy_(rows)
        bags.append(bag)
        index_of.append({table_id: i for i, table_id in enumerate(table_ids)})
    mlp_parameters = [p for linear in linears for p in linear.parameters()]
    dense_optimizer = torch.optim.Adam(mlp_parameters, lr=lr, betas=(beta1, beta2), eps=eps)
    table_optimizer = torch.optim.SparseAdam([bag.weight for bag in bags], lr=table_lr,
                                             betas=(beta1, beta2), eps=table_eps)
    loss_function = torch.nn.BCEWithLogitsLoss()
    for b in range(batches):
        rows = range(b * batch, (b + 1) * batch)
        pooled = []
        for k in range(fields):
            indices, offsets = [], []
            for r in rows:
                offsets.append(len(indices))
                if ids[r * fields + k] >= 0:  # a missing id: an empty bag (zeros)
                    indices.append(index_of[k][ids[r * fields + k]])
            pooled.append(bags[k](torch.tensor(indices, dtype=torch.int64),
                                  torch.tensor(offsets, dtype=torch.int64)))
        x = torch.cat([dense[b * batch:(b + 1) * batch]] + pooled, dim=1)
        for i, linear in enumerate(linears):
            x = linear(x)
            if i + 1 < len(linears):
                x = torch.relu(x)
        loss = loss_function(x.reshape(-1), labels[b * batch:(b + 1) * batch])
        dense_optimizer.zero_grad()
        table_optimizer.zero_grad()
        loss.backward()
        dense_optimizer.step()
        table_optimizer.step()
    out = []
    for linear in linears:
        out += linear.weight.detach().reshape(-1).tolist() + linear.bias.detach().tolist()
    for bag in bags:
        out += bag.weight.detach().reshape(-1).tolist()
    print(" ".join(float(v).hex() for v in out))


if __name__ == "__main__":
    main(sys.argv[1])
