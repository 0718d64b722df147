#!/usr/bin/env python3
"""The peers our end-to-end figures are compared with: the reference job (784-128-10 MLP,
Adam lr 0.001, betas 0.9/0.999, eps 1e-7, batch 32 per worker, Fashion-MNIST from
Debian's dataset-fashion-mnist, pixels / 255) trained with PyTorch three ways:

  single   one PyTorch process
  ddp      DistributedDataParallel with gloo on 127.0.0.1: N processes, each on its
           contiguous part of the training set, gradients averaged every step
  rpc      a parameter server built on torch.distributed.rpc: one server process holds
           the model and its optimizer; N trainers each pull the parameters, compute a gradient
           and push it; the server applies one optimizer step per push (async)

With --model cnn the model is examples/pytorch_cnn's CNN and its recipe (its class and
constants, imported from train.py: SGD with momentum and weight decay), on images scaled
as that example scales them.

Prints one line:
  peer=ddp workers=2 epochs=1 samples_per_sec=12345 test_accuracy=0.8512 seconds=9.7
samples_per_sec counts every worker's training samples over the wall time of training
(process start-up and data loading excluded, as in the parameter server's figure).

  bench/pytorch_peers.py --peer {single,ddp,rpc} [--workers N] [--epochs E]
      [--model {mlp,cnn}] [--batch B] [--max-steps S]
"""
import argparse
import gzip
import os
import socket
import struct
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

DATA = "/usr/share/datasets/fashion-mnist"
LAYERS = (784, 128, 10)
CNN_EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples",
                           "pytorch_cnn", "train.py")
MODEL = os.environ.get("PS_PEER_MODEL", "mlp")  # --model, inherited by spawned processes


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    dims = magic & 0xFF
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(split):
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(os.path.join(DATA, prefix + "-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(DATA, prefix + "-labels-idx1-ubyte.gz"))
    if MODEL == "cnn":  # as examples/pytorch_cnn/train.py scales them
        features = torch.from_numpy((images.astype(np.float32) / 255.0 - 0.286) / 0.353).unsqueeze(1)
        return features, torch.from_numpy(labels.astype(np.int64))
    features = torch.from_numpy(images.reshape(len(images), -1).astype(np.float32) / np.float32(255.0))
    return features, torch.from_numpy(labels.astype(np.int64))


def cnn_example():
    """examples/pytorch_cnn/train.py as a module (its model and its recipe)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("pytorch_cnn_example", CNN_EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def make_model(seed=1):
    torch.manual_seed(seed)
    if MODEL == "cnn":
        return cnn_example().Cnn()
    return torch.nn.Sequential(torch.nn.Linear(LAYERS[0], LAYERS[1]), torch.nn.ReLU(),
                               torch.nn.Linear(LAYERS[1], LAYERS[2]))


def make_optimizer(params):
    """The reference job's Adam, or the CNN example's SGD recipe (its schedule steps per
    epoch: within the one epoch a figure trains, its rate is the first)."""
    if MODEL == "cnn":
        example = cnn_example()
        return torch.optim.SGD(params, lr=example.LEARNING_RATE, momentum=example.MOMENTUM,
                               weight_decay=example.WEIGHT_DECAY)
    return torch.optim.Adam(params, lr=0.001, betas=(0.9, 0.999), eps=1e-7)


def accuracy(model, features, labels):
    with torch.no_grad():
        correct = sum((model(features[i:i + 1000]).argmax(dim=1) == labels[i:i + 1000]).sum().item()
                      for i in range(0, len(labels), 1000))
        return correct / len(labels)


def part(count, workers, rank):
    return count * rank // workers, count * (rank + 1) // workers


MAX_STEPS = int(os.environ.get("PS_PEER_MAX_STEPS", "0"))  # --max-steps: per worker, 0 none


def batches(begin, end, batch, epoch, seed=1):
    """The batches of one epoch over [begin, end): shuffled, full batches only (at most
    --max-steps of them, when given)."""
    generator = torch.Generator().manual_seed(seed * 1000 + epoch)
    order = torch.randperm(end - begin, generator=generator) + begin
    for step, i in enumerate(range(0, len(order) - batch + 1, batch)):
        if MAX_STEPS and step >= MAX_STEPS:
            return
        yield order[i:i + batch]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_single(args):
    x, y = load("train")
    test_x, test_y = load("test")
    model = make_model()
    optimizer = make_optimizer(model.parameters())
    loss_fn = torch.nn.CrossEntropyLoss()
    samples = 0
    start = time.perf_counter()
    for epoch in range(args.epochs):
        for index in batches(0, len(x), args.batch, epoch):
            optimizer.zero_grad()
            loss_fn(model(x[index]), y[index]).backward()
            optimizer.step()
            samples += len(index)
    seconds = time.perf_counter() - start
    return samples, seconds, accuracy(model, test_x, test_y)


def ddp_worker(rank, args, port, results):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.workers)
    x, y = load("train")
    model = torch.nn.parallel.DistributedDataParallel(make_model())
    optimizer = make_optimizer(model.parameters())
    loss_fn = torch.nn.CrossEntropyLoss()
    begin, end = part(len(x), args.workers, rank)
    # Every rank must take the same number of steps; the smallest part sets it.
    steps = min(part(len(x), args.workers, r)[1] - part(len(x), args.workers, r)[0]
                for r in range(args.workers)) // args.batch
    dist.barrier()
    start = time.perf_counter()
    samples = 0
    for epoch in range(args.epochs):
        for i, index in enumerate(batches(begin, end, args.batch, epoch)):
            if i == steps:
                break
            optimizer.zero_grad()
            loss_fn(model(x[index]), y[index]).backward()
            optimizer.step()
            samples += len(index)
    dist.barrier()
    seconds = time.perf_counter() - start
    if rank == 0:
        test_x, test_y = load("test")
        results.put((samples * args.workers, seconds, accuracy(model.module, test_x, test_y)))
    dist.destroy_process_group()


def next_result(results, processes):
    """The next item a peer process put on `results`; fails once one of them has exited
    with an error (it would never put its result) rather than waiting out the hour."""
    import queue
    give_up = time.time() + 3600
    while time.time() < give_up:
        try:
            return results.get(timeout=2)
        except queue.Empty:
            failed = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
            if failed:
                raise RuntimeError(f"a peer process exited with {failed[0]} before reporting")
            if all(p.exitcode is not None for p in processes) and results.empty():
                raise RuntimeError("every peer process exited without reporting")
    raise RuntimeError("the peer processes reported nothing in an hour")


def run_ddp(args):
    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    processes = [context.Process(target=ddp_worker, args=(r, args, port, results)) for r in range(args.workers)]
    for p in processes:
        p.start()
    result = next_result(results, processes)
    for p in processes:
        p.join(timeout=60)
    return result


class ParameterServer:
    """Lives in the server process: the model and its optimizer; one step per pushed gradient."""

    def __init__(self):
        import threading
        self.lock = threading.Lock()
        self.model = make_model()
        self.optimizer = make_optimizer(self.model.parameters())

    def pull(self):
        with self.lock:
            return [p.detach().clone() for p in self.model.parameters()]

    def push(self, gradients):
        with self.lock:
            for p, g in zip(self.model.parameters(), gradients):
                p.grad = g
            self.optimizer.step()

    def test_accuracy(self):
        test_x, test_y = load("test")
        with self.lock:
            return accuracy(self.model, test_x, test_y)


_server = None


def _server_instance():
    global _server
    if _server is None:
        _server = ParameterServer()
    return _server


def server_pull():
    return _server_instance().pull()


def server_push(gradients):
    _server_instance().push(gradients)


def server_accuracy():
    return _server_instance().test_accuracy()


def rpc_process(rank, args, port, results):
    from torch.distributed import rpc
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    world = args.workers + 1
    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=600, init_method=f"tcp://127.0.0.1:{port}")
    name = "ps" if rank == 0 else f"trainer{rank - 1}"
    rpc.init_rpc(name, rank=rank, world_size=world, rpc_backend_options=options)
    if rank == 0:
        _server_instance()
    else:
        trainer = rank - 1
        x, y = load("train")
        model = make_model()
        loss_fn = torch.nn.CrossEntropyLoss()
        begin, end = part(len(x), args.workers, trainer)
        rpc.rpc_sync("ps", server_pull)  # the server exists before the clock starts
        start = time.perf_counter()
        samples = 0
        for epoch in range(args.epochs):
            for index in batches(begin, end, args.batch, epoch):
                with torch.no_grad():
                    for p, value in zip(model.parameters(), rpc.rpc_sync("ps", server_pull)):
                        p.copy_(value)
                model.zero_grad()
                loss_fn(model(x[index]), y[index]).backward()
                rpc.rpc_sync("ps", server_push, args=([p.grad for p in model.parameters()],))
                samples += len(index)
        results.put(("trained", samples, start, time.perf_counter()))
    rpc.shutdown()  # waits for every process's outstanding calls
    if rank == 0:
        results.put(("accuracy", _server_instance().test_accuracy()))


def run_rpc(args):
    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    processes = [context.Process(target=rpc_process, args=(r, args, port, results)) for r in range(args.workers + 1)]
    for p in processes:
        p.start()
    spans, samples, test_accuracy = [], 0, None
    while len(spans) < args.workers or test_accuracy is None:
        item = next_result(results, processes)
        if item[0] == "trained":
            samples += item[1]
            spans.append((item[2], item[3]))
        else:
            test_accuracy = item[1]
    for p in processes:
        p.join(timeout=120)
    seconds = max(end for _, end in spans) - min(begin for begin, _ in spans)
    return samples, seconds, test_accuracy


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peer", choices=("single", "ddp", "rpc"), required=True)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    parser.add_argument("--max-steps", type=int, default=0)
    args = parser.parse_args()
    global MODEL, MAX_STEPS
    MODEL, MAX_STEPS = args.model, args.max_steps
    os.environ["PS_PEER_MODEL"] = args.model  # for the spawned processes
    os.environ["PS_PEER_MAX_STEPS"] = str(args.max_steps)
    if args.peer == "single":
        args.workers = 1
    samples, seconds, test_accuracy = {"single": run_single, "ddp": run_ddp, "rpc": run_rpc}[args.peer](args)
    print(f"peer={args.peer} workers={args.workers} epochs={args.epochs} samples_per_sec={samples / seconds:.0f} "
          f"test_accuracy={test_accuracy:.4f} seconds={seconds:.1f}", flush=True)


if __name__ == "__main__":
    main()
