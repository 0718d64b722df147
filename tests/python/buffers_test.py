"""A model's buffers travel with the job: examples/pytorch_cnn (convolutions with
BatchNorm, SGD with momentum and weight decay, StepLR) as a real 2 x 2 sync job on a
Fashion-MNIST subset of 2 epochs of 20 steps.

- Its output.weights holds every parameter and buffer (num_batches_tracked as I64) and
  loads strictly into a fresh model with paramserver.load_state_dict, whose test accuracy
  in PyTorch is the one the job reported.
- Each step's buffers are the mean of what the workers' forward passes made of them: a
  one-process simulation of that rule (each worker's batch through the model from the
  step's values, the gradients and the buffers' changes averaged) ends where the job
  does.
- Every daemon and script killed at once past the epoch boundary, and a job resumed from
  the checkpoints onto 3 servers ends bit-identical (parameters and buffers) to one never
  killed.
"""
import gzip
import importlib.util
import os
import re
import shutil
import struct
import tempfile
import time
import unittest

import numpy
import torch

import paramserver
import cluster as cluster_module
from cluster import HERE, RUNFILES, Cluster, torch_job
from safetensors_io import load_safetensors

EXAMPLE = os.path.join(RUNFILES, "examples/pytorch_cnn/train.py")
DATASET = "/usr/share/datasets/fashion-mnist"
TRAIN_EXAMPLES, TEST_EXAMPLES = 1280, 1000
BATCH, WORKERS, EPOCHS = 32, 2, 2
STEPS_PER_EPOCH = TRAIN_EXAMPLES // BATCH // WORKERS  # 20
STEPS = STEPS_PER_EPOCH * EPOCHS


def load_example():
    spec = importlib.util.spec_from_file_location("pytorch_cnn_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_idx_subset(source, target, count):
    """The first `count` items of IDX file `source` (gzipped) as IDX file `target`."""
    with gzip.open(source, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    item = 1
    for d in shape[1:]:
        item *= d
    header = data[:4] + struct.pack(">I", count) + data[8:4 + 4 * dims]
    with open(target, "wb") as f:
        f.write(header + data[4 + 4 * dims:4 + 4 * dims + count * item])


class BatchNormJob(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.folder = tempfile.mkdtemp(prefix="ps-buffers-", dir=os.environ.get("TEST_TMPDIR"))
        cls.data = {}
        for key, name, count in (
                ("train_images", "train-images-idx3-ubyte", TRAIN_EXAMPLES),
                ("train_labels", "train-labels-idx1-ubyte", TRAIN_EXAMPLES),
                ("test_images", "t10k-images-idx3-ubyte", TEST_EXAMPLES),
                ("test_labels", "t10k-labels-idx1-ubyte", TEST_EXAMPLES)):
            cls.data[key] = os.path.join(cls.folder, name)
            write_idx_subset(os.path.join(DATASET, name + ".gz"), cls.data[key], count)
        cls.example = load_example()
        cls.reference = os.path.join(cls.folder, "reference.safetensors")
        with Cluster(cls.spec(cls.reference)) as cluster:
            cls.reference_log = run_to_end(cluster)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.folder, ignore_errors=True)

    @classmethod
    def spec(cls, weights, servers=2, checkpoint=None, paced=False):
        command = [EXAMPLE]
        if paced:
            command = [os.path.join(HERE, "paced_script.py"), EXAMPLE]
        spec = torch_job(servers, WORKERS, ["unused"],
                         training={"mode": "sync", "batch_size": BATCH, "epochs": EPOCHS,
                                   "optimizer": {"type": "sgd", "learning_rate": 0.05,
                                                 "momentum": 0.9}},
                         data=dict(cls.data), output={"weights": weights})
        spec["worker"]["command"] = ["/usr/bin/python3"] + command
        spec["cluster"]["shards"] = 2 * servers + 1
        if checkpoint is not None:
            spec["checkpoint"] = checkpoint
        return spec

    def test_output_weights_load_strictly_with_the_reported_accuracy(self):
        model = self.example.Cnn()
        result = paramserver.load_state_dict(model, self.reference)  # strict
        self.assertEqual((result.missing_keys, result.unexpected_keys), ([], []))
        raw = load_safetensors(self.reference)
        self.assertEqual(sorted(raw), sorted(model.state_dict()))
        for layer in ("bn1", "bn2"):
            self.assertEqual(raw[layer + ".num_batches_tracked"].dtype, torch.int64)
            self.assertEqual(int(raw[layer + ".num_batches_tracked"]), STEPS)
            self.assertFalse(torch.equal(raw[layer + ".running_mean"],
                                         torch.zeros_like(raw[layer + ".running_mean"])))
        images, labels = self.example.load(self.data["test_images"], self.data["test_labels"],
                                           "cpu")
        accuracy = self.example.accuracy(model, images, labels)
        reported = re.search(r"final test_accuracy=([0-9.]+)", self.reference_log)
        self.assertIsNotNone(reported, self.reference_log[-2000:])
        self.assertEqual("%.4f" % accuracy, reported.group(1))

    def test_buffers_are_the_mean_of_the_workers_at_each_step(self):
        want = simulate_sync_job(self.example, self.data)
        got = load_safetensors(self.reference)
        print("the job against the one-process simulation, largest difference: %s" % ", ".join(
            "%s %.2e" % (name, (got[name].double() - t.double()).abs().max().item())
            for name, t in want.items() if "bn" in name), flush=True)
        for name, tensor in want.items():
            if tensor.dtype == torch.int64:
                self.assertTrue(torch.equal(got[name], tensor), name)
                continue
            # The workers' and this process's convolutions may sum in other orders (their
            # thread counts differ): float32 roundings, grown over 40 steps of SGD with
            # momentum, stay far below what a buffer left to one worker, or summed over
            # the workers, would differ by (0.01 and more).
            difference = (got[name].double() - tensor.double()).abs().max().item()
            self.assertLess(difference, 1e-3, name)

    def test_a_whole_cluster_lost_past_an_epoch_resumes_to_the_same_weights(self):
        folder = tempfile.mkdtemp(prefix="ps-buffers-resume-", dir=self.folder)
        checkpoints = os.path.join(folder, "checkpoints")
        weights = os.path.join(folder, "weights.safetensors")
        every = {"dir": checkpoints, "every_steps": 5}
        with Cluster(self.spec(weights, checkpoint=dict(every, resume=False),
                               paced=True)) as cluster:
            cluster.start()
            wait_for_checkpoint(checkpoints, 25, 5)  # past the epoch boundary (step 20)
            cluster.kill9_all()
        self.assertFalse(os.path.exists(weights))
        with Cluster(self.spec(weights, servers=3,
                               checkpoint=dict(every, resume=True))) as cluster:
            log = run_to_end(cluster)
        resumed = re.search(r"resuming from the checkpoint at step (\d+)", log)
        self.assertIsNotNone(resumed, log[-2000:])
        self.assertGreaterEqual(int(resumed.group(1)), 25)
        self.assertLess(int(resumed.group(1)), STEPS)
        want, got = load_safetensors(self.reference), load_safetensors(weights)
        self.assertEqual(sorted(want), sorted(got))
        for name, tensor in want.items():
            self.assertTrue(torch.equal(tensor, got[name]),
                            "%s differs after the whole cluster was lost and resumed" % name)


def run_to_end(cluster, timeout=300):
    """Runs the job to its end (cluster.run_to_end); returns the scheduler's log."""
    cluster_module.run_to_end(cluster, timeout)
    return cluster.log("scheduler")


def wait_for_checkpoint(folder, step, shards, timeout=180):
    """Waits until every one of `shards` shards wrote its checkpoint at `step` or later."""
    pattern = re.compile(r"shard-(\d+)-step-(\d+)\.ckpt$")
    deadline = time.time() + timeout
    while time.time() < deadline:
        written = set()
        for name in os.listdir(folder) if os.path.isdir(folder) else []:
            match = pattern.match(name)
            if match and int(match.group(2)) >= step:
                written.add(int(match.group(1)))
        if len(written) == shards:
            return
        time.sleep(0.05)
    raise RuntimeError("no complete checkpoint at step %d in %s within %d s" %
                       (step, folder, timeout))


def simulate_sync_job(example, data):
    """The job's rule in one process: at each step every worker's batch goes through the
    model from the step's values (its buffers included); the parameters' gradients are
    averaged and the recipe's SGD applied; each buffer moves by the mean of the workers'
    changes to it. Returns the final state_dict."""
    train_images, train_labels = example.load(data["train_images"], data["train_labels"],
                                               "cpu")
    torch.manual_seed(0)
    model = example.Cnn()
    optimizer, schedule = example.make_recipe(model)
    loss_fn = torch.nn.CrossEntropyLoss()
    buffers = dict(model.named_buffers())
    batches = TRAIN_EXAMPLES // BATCH
    for epoch in range(EPOCHS):
        order = example.epoch_order(epoch, TRAIN_EXAMPLES)
        for first in range(0, batches - batches % WORKERS, WORKERS):
            start = {name: b.clone() for name, b in buffers.items()}
            gradients, changes = [], []
            for w in range(WORKERS):
                with torch.no_grad():
                    for name, b in buffers.items():
                        b.copy_(start[name])
                model.zero_grad()
                rows = order[(first + w) * BATCH:(first + w + 1) * BATCH]
                loss_fn(model(train_images[rows]), train_labels[rows]).backward()
                gradients.append([p.grad.clone() for p in model.parameters()])
                changes.append({name: b.float() - start[name].float()
                                for name, b in buffers.items()})
            with torch.no_grad():
                for k, p in enumerate(model.parameters()):
                    p.grad = (gradients[0][k] + gradients[1][k]) * 0.5
                for name, b in buffers.items():
                    moved = start[name].float() + (changes[0][name] + changes[1][name]) * 0.5
                    b.copy_(moved.round() if b.dtype == torch.int64 else moved)
            optimizer.step()
        schedule.step()
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


if __name__ == "__main__":
    unittest.main()
