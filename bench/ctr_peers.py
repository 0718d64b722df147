#!/usr/bin/python3
"""PyTorch's CTR peers: the model of deploy/local/ctr.yaml on the same Criteo-format files.

  single  one process: an nn.EmbeddingBag(mode='sum', sparse=True) per field and nn.Linear
          layers, SparseAdam for the tables and Adam for the MLP, batch W x B (the
          effective batch of W sync workers of batch B).
  rpc     a parameter server built on torch.distributed.rpc: one server process holds the
          tables and the MLP; each of W trainers pulls its batch's unique rows and the MLP,
          computes, and pushes the rows' gradients and the MLP's, which the server applies
          as they come (under a lock), as PyTorch's RPC parameter-server tutorial does.

Prints: peer=... workers=W samples_per_sec=N test_auc=0.xxxx test_logloss=0.xxxx seconds=S

  bench/ctr_peers.py --peer {single,rpc} --data DIR [--workers W] [--epochs E] [--batch B]
                    [--hidden 256,128]
"""
import argparse
import gzip
import math
import multiprocessing as mp
import os
import socket
import threading
import time

import numpy as np
import torch

DENSE, FIELDS, DIM = 13, 26, 16
HIDDEN = [256, 128]  # --hidden


def read(path, maps):
    """Dense features (log(1 + max(x, 0))), per-field row indices (-1: missing), labels."""
    dense, ids, labels = [], [], []
    with gzip.open(path, "rt") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            labels.append(float(parts[0]))
            dense.append([math.log1p(max(int(v), 0)) if v else 0.0 for v in parts[1:1 + DENSE]])
            row = []
            for k, v in enumerate(parts[1 + DENSE:]):
                row.append(maps[k].setdefault(v, len(maps[k])) if v else -1)
            ids.append(row)
    return (torch.tensor(dense, dtype=torch.float32), torch.tensor(ids, dtype=torch.int64),
            torch.tensor(labels, dtype=torch.float32))


def load(directory):
    maps = [{} for _ in range(FIELDS)]
    train = read(os.path.join(directory, "train.tsv.gz"), maps)
    test = read(os.path.join(directory, "test.tsv.gz"), maps)
    return train, test, [len(m) for m in maps]


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        widths = [DENSE + FIELDS * DIM] + HIDDEN + [1]
        self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(widths, widths[1:]))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = torch.relu(x)
        return x.reshape(-1)


def pooled_from_bags(bags, ids):
    out = []
    for k, bag in enumerate(bags):
        column = ids[:, k]
        present = column >= 0
        counts = present.long()
        out.append(bag(column[present], torch.cumsum(counts, 0) - counts))
    return out


def auc_and_logloss(logits, labels):
    scores, y = logits.numpy().astype(np.float64), labels.numpy()
    order = np.argsort(scores, kind="mergesort")
    _, inverse, counts = np.unique(scores[order], return_inverse=True, return_counts=True)
    average = (np.cumsum(counts) - counts) + (counts + 1) / 2.0
    ranks = np.empty(len(scores))
    ranks[order] = average[inverse]
    positives = y == 1
    n1, n0 = positives.sum(), (~positives).sum()
    auc = (ranks[positives].sum() - n1 * (n1 + 1) / 2) / (n1 * n0)
    z = scores
    logloss = np.mean(np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z))))
    return float(auc), float(logloss)


def evaluate(mlp, bags, test):
    dense, ids, labels = test
    with torch.no_grad():
        logits = torch.cat([mlp(torch.cat([dense[i:i + 4096]] + pooled_from_bags(bags, ids[i:i + 4096]), 1))
                            for i in range(0, len(labels), 4096)])
    return auc_and_logloss(logits, labels)


def make_model(sizes, seed=1):
    torch.manual_seed(seed)
    bags = [torch.nn.EmbeddingBag(n, DIM, mode="sum", sparse=True) for n in sizes]
    return Mlp(), bags


def optimizers(mlp, bags, lr, table_lr):
    return (torch.optim.Adam(mlp.parameters(), lr=lr, eps=1e-7),
            torch.optim.SparseAdam([b.weight for b in bags], lr=table_lr, eps=1e-7))


def run_single(args):
    torch.set_num_threads(1)
    train, test, sizes = load(args.data)
    mlp, bags = make_model(sizes)
    dense_opt, table_opt = optimizers(mlp, bags, args.lr, args.table_lr)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    batch = args.batch * args.workers
    dense, ids, labels = train
    start, samples = time.perf_counter(), 0
    for epoch in range(args.epochs):
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(epoch))
        for i in range(0, len(labels) - batch + 1, batch):
            index = order[i:i + batch]
            x = torch.cat([dense[index]] + pooled_from_bags(bags, ids[index]), 1)
            loss = loss_fn(mlp(x), labels[index])
            dense_opt.zero_grad()
            table_opt.zero_grad()
            loss.backward()
            dense_opt.step()
            table_opt.step()
            samples += batch
    seconds = time.perf_counter() - start
    auc, logloss = evaluate(mlp, bags, test)
    return samples, seconds, auc, logloss


class Server:
    def __init__(self, args):
        self.train, self.test, sizes = load(args.data)
        self.mlp, self.bags = make_model(sizes)
        self.dense_opt, self.table_opt = optimizers(self.mlp, self.bags, args.lr, args.table_lr)
        self.lock = threading.Lock()

    def pull(self, unique):
        with self.lock, torch.no_grad():
            return ([b.weight[u].clone() for b, u in zip(self.bags, unique)],
                    [p.detach().clone() for p in self.mlp.parameters()])

    def push(self, unique, row_grads, mlp_grads):
        with self.lock:
            for bag, u, g in zip(self.bags, unique, row_grads):
                bag.weight.grad = torch.sparse_coo_tensor(u.reshape(1, -1), g, bag.weight.shape)
            for p, g in zip(self.mlp.parameters(), mlp_grads):
                p.grad = g
            self.dense_opt.step()
            self.table_opt.step()


_server, _args = None, None


def server_pull(unique):
    return _server.pull(unique)


def server_push(unique, row_grads, mlp_grads):
    _server.push(unique, row_grads, mlp_grads)


def rpc_process(rank, args, port, results):
    global _server
    HIDDEN[:] = args.hidden  # a spawned process starts from the module's defaults
    from torch.distributed import rpc
    torch.set_num_threads(1)
    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=600,
                                              init_method=f"tcp://127.0.0.1:{port}")
    if rank == 0:
        _server = Server(args)  # before init_rpc, which every process waits for
    rpc.init_rpc("ps" if rank == 0 else f"trainer{rank - 1}", rank=rank, world_size=args.workers + 1,
                 rpc_backend_options=options)
    if rank != 0:
        train, _, _ = load(args.data)
        dense, ids, labels = train
        mlp = Mlp()
        loss_fn = torch.nn.BCEWithLogitsLoss()
        trainer = rank - 1
        begin = trainer * len(labels) // args.workers
        end = (trainer + 1) * len(labels) // args.workers
        start, samples = time.perf_counter(), 0
        for epoch in range(args.epochs):
            order = begin + torch.randperm(end - begin, generator=torch.Generator().manual_seed(epoch))
            for i in range(0, len(order) - args.batch + 1, args.batch):
                index = order[i:i + args.batch]
                batch_ids = ids[index]
                unique, inverse = [], []
                for k in range(FIELDS):
                    column = batch_ids[:, k]
                    u, inv = torch.unique(column[column >= 0], return_inverse=True)
                    unique.append(u)
                    inverse.append(inv)
                rows, params = rpc.rpc_sync("ps", server_pull, args=(unique,))
                with torch.no_grad():
                    for p, value in zip(mlp.parameters(), params):
                        p.copy_(value)
                rows = [r.requires_grad_() for r in rows]
                pooled = []
                for k in range(FIELDS):
                    present = batch_ids[:, k] >= 0
                    field = torch.zeros(len(index), DIM)
                    field = field.index_put((present.nonzero().reshape(-1),), rows[k][inverse[k]])
                    pooled.append(field)
                mlp.zero_grad()
                loss = loss_fn(mlp(torch.cat([dense[index]] + pooled, 1)), labels[index])
                loss.backward()
                rpc.rpc_sync("ps", server_push, args=(unique, [r.grad for r in rows],
                                                      [p.grad for p in mlp.parameters()]))
                samples += len(index)
        results.put(("trained", samples, start, time.perf_counter()))
    rpc.shutdown()
    if rank == 0:
        results.put(("scores",) + evaluate(_server.mlp, _server.bags, _server.test))


def run_rpc(args):
    context = mp.get_context("spawn")
    results = context.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    processes = [context.Process(target=rpc_process, args=(r, args, port, results))
                 for r in range(args.workers + 1)]
    for p in processes:
        p.start()
    spans, samples, scores = [], 0, None
    while len(spans) < args.workers or scores is None:
        item = results.get(timeout=7200)
        if item[0] == "trained":
            samples += item[1]
            spans.append((item[2], item[3]))
        elif item[0] == "scores":
            scores = item[1:]
    for p in processes:
        p.join(timeout=120)
    return samples, max(e for _, e in spans) - min(b for b, _ in spans), scores[0], scores[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peer", choices=("single", "rpc"), required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--table_lr", type=float, default=0.01)
    parser.add_argument("--hidden", type=lambda text: [int(w) for w in text.split(",")], default=[256, 128],
                        help="the MLP's hidden widths, comma-separated")
    args = parser.parse_args()
    HIDDEN[:] = args.hidden
    samples, seconds, auc, logloss = {"single": run_single, "rpc": run_rpc}[args.peer](args)
    print(f"peer={args.peer} workers={args.workers} samples_per_sec={samples / seconds:.0f} test_auc={auc:.4f} "
          f"test_logloss={logloss:.4f} seconds={seconds:.1f}", flush=True)


if __name__ == "__main__":
    main()
