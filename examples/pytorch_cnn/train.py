"""A small CNN on Fashion-MNIST, trained on the parameter servers through the paramserver
package: copy it and put your own model in.

Run it as a job (2 servers, 2 workers, sync):
    deploy/local/run.sh examples/pytorch_cnn/job.yaml
Each worker runs this script: it reads the IDX files named in the spec's data section
with numpy, trains on its share of the training set (rank r of W takes every W-th
batch), and rank 0 reports the test accuracy. It uses the GPU when there is one.

The recipe is a CNN's classic one, in PyTorch's own API: convolutions with BatchNorm,
torch.optim.SGD with momentum 0.9 and weight decay 5e-4, its rate cut 5x after each epoch
by StepLR, wrapped in paramserver.DistributedOptimizer so that the servers apply it (the
spec's training.optimizer names the state they keep: sgd with momentum). The servers hold
the BatchNorm running statistics too (the mean of the workers' at every step), so the
job's output.weights loads with paramserver.load_state_dict(model, path) (strict).

A job started with checkpoint.resume: true (after its whole cluster was lost) resumes
where its checkpoint left off: the script skips the epochs and batches trained already
and brings its StepLR to the same epoch, so the job ends as one never stopped.

The same recipe in one process, without servers, for comparison (each of its steps is
one sync step of the job: the workers' batches together, each normalised by its own
BatchNorm statistics as on its worker):
    /usr/bin/python3 examples/pytorch_cnn/train.py --one-process examples/pytorch_cnn/job.yaml
"""
import argparse
import gzip
import time

import numpy
import torch

# The recipe: SGD with momentum and weight decay, the rate cut after every epoch.
LEARNING_RATE = 0.05
MOMENTUM = 0.9
WEIGHT_DECAY = 5e-4
RATE_CUT_PER_EPOCH = 0.2


def read_idx(path):
    """An IDX file (gzipped or not) as a numpy array of its shape."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    return numpy.frombuffer(data, dtype=numpy.uint8, offset=4 + 4 * dims).reshape(shape)


def load(images_path, labels_path, device):
    # Scaled to mean 0 and standard deviation 1 (Fashion-MNIST pixels: 0.286, 0.353).
    images = torch.from_numpy((read_idx(images_path).astype(numpy.float32) / 255.0 - 0.286) / 0.353)
    labels = torch.from_numpy(read_idx(labels_path).astype(numpy.int64))
    return images.unsqueeze(1).to(device), labels.to(device)


class Cnn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 32, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(32)
        self.conv2 = torch.nn.Conv2d(32, 64, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(64)
        self.fc1 = torch.nn.Linear(64 * 7 * 7, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = torch.max_pool2d(torch.relu(self.bn2(self.conv2(x))), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def accuracy(model, images, labels, batch=1000):
    """The fraction of `images` the model classifies right, BatchNorm with its running
    statistics (eval mode)."""
    was_training = model.training
    model.eval()
    correct = 0
    with torch.no_grad():
        for begin in range(0, len(labels), batch):
            logits = model(images[begin:begin + batch])
            correct += (logits.argmax(dim=1) == labels[begin:begin + batch]).sum().item()
    model.train(was_training)
    return correct / len(labels)


def make_recipe(model):
    """The optimizer and its schedule (StepLR steps once per epoch)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM,
                                weight_decay=WEIGHT_DECAY)
    return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1,
                                                      gamma=RATE_CUT_PER_EPOCH)


def epoch_order(epoch, examples):
    """The same order on every worker, and in the one-process run."""
    return torch.randperm(examples, generator=torch.Generator().manual_seed(epoch))


def main():
    import paramserver  # here: the one-process run needs no servers
    job = paramserver.init()
    data, training = job.config["data"], job.config.get("training", {})
    batch_size, epochs = training.get("batch_size", 64), training.get("epochs", 2)
    max_steps = training.get("max_steps", 0)  # per worker; 0: every batch of every epoch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    train_images, train_labels = load(data["train_images"], data["train_labels"], device)
    torch.manual_seed(0)  # every worker builds the same model; the first to register places it
    model = Cnn().to(device)
    job.register(model)  # from here on the model holds the servers' values
    sgd, schedule = make_recipe(model)
    optimizer = paramserver.DistributedOptimizer(sgd, job)
    loss_fn = torch.nn.CrossEntropyLoss()
    batches = len(train_labels) // batch_size
    steps_per_epoch = batches // job.num_workers
    # Where the job is: 0 in a fresh one; a resumed job's checkpoint step. The batches
    # before it were trained, and StepLR cut the rate once per epoch done.
    first_epoch, first_step = job.data_position(steps_per_epoch)
    optimizer.resume_schedule(schedule, every=steps_per_epoch)
    started = time.time()
    steps = job.step_number
    for epoch in range(first_epoch, epochs):
        # Rank r takes batches r, r + W, r + 2W, ... of the epoch's order.
        order = epoch_order(epoch, len(train_labels))
        skip = first_step if epoch == first_epoch else 0
        for b in range(job.rank + skip * job.num_workers, batches - batches % job.num_workers,
                       job.num_workers):
            if max_steps and steps == max_steps:
                break
            steps += 1
            rows = order[b * batch_size:(b + 1) * batch_size].to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(train_images[rows]), train_labels[rows])
            loss.backward()
            optimizer.step(loss=loss, batch_size=batch_size)
        schedule.step()
        print("worker %d: epoch %d done, last loss %.4f, %.0f s" %
              (job.rank, epoch, loss.item(), time.time() - started), flush=True)
    test_accuracy = None
    if job.rank == 0:
        test_images, test_labels = load(data["test_images"], data["test_labels"], device)
        test_accuracy = accuracy(model, test_images, test_labels)
        print("test accuracy %.4f" % test_accuracy, flush=True)
    job.finish(test_accuracy=test_accuracy)


def main_one_process(spec_path):
    """The job's recipe in one process: each step trains on the batches all of the job's
    workers train on in one sync step (the mean loss over them, as the servers average
    the workers' gradients), in the same order, with the same schedule."""
    import yaml
    with open(spec_path) as f:
        spec = yaml.safe_load(f)
    training = spec.get("training", {})
    workers = spec.get("cluster", {}).get("workers", 2)
    batch_size, epochs = training.get("batch_size", 64), training.get("epochs", 2)
    data = spec["data"]
    train_images, train_labels = load(data["train_images"], data["train_labels"], "cpu")
    torch.manual_seed(0)
    model = Cnn()
    optimizer, schedule = make_recipe(model)
    loss_fn = torch.nn.CrossEntropyLoss()
    batches = len(train_labels) // batch_size
    started = time.time()
    for epoch in range(epochs):
        order = epoch_order(epoch, len(train_labels))
        for first in range(0, batches - batches % workers, workers):
            optimizer.zero_grad()
            # The mean loss of the workers' batches, each through the model on its own.
            loss = 0
            for w in range(workers):
                rows = order[(first + w) * batch_size:(first + w + 1) * batch_size]
                loss = loss + loss_fn(model(train_images[rows]), train_labels[rows]) / workers
            loss.backward()
            optimizer.step()
        schedule.step()
        print("one process: epoch %d done, last loss %.4f, %.0f s" %
              (epoch, loss.item(), time.time() - started), flush=True)
    test_images, test_labels = load(data["test_images"], data["test_labels"], "cpu")
    print("one process: test accuracy %.4f" % accuracy(model, test_images, test_labels),
          flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--one-process", metavar="JOB_YAML",
                        help="train the job's recipe in this process alone, without servers")
    arguments = parser.parse_args()
    if arguments.one_process:
        main_one_process(arguments.one_process)
    else:
        main()
