"""The model, data and batches the Python package's agreement tests train, shared by the
job's script (agreement_job.py, through the package) and the reference (one PyTorch
process training on every worker's batches together, `train_reference`)."""
import os

import torch

CLASSES = 4
SIDE = 8           # images are 1 x SIDE x SIDE
VOCABULARY = 40    # ids of the embedding variant's table
IDS_PER_EXAMPLE = 3
TABLE_DIM = 4


class SmallCnn(torch.nn.Module):
    """conv -> ReLU -> max pool -> linear -> ReLU -> linear (PyTorch's default init)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.fc1 = torch.nn.Linear(4 * (SIDE // 2) ** 2, 16)
        self.fc2 = torch.nn.Linear(16, CLASSES)

    def forward(self, images):
        x = torch.max_pool2d(torch.relu(self.conv(images)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class TableNet(torch.nn.Module):
    """A bag of ids summed from an embedding table, beside the image's mean pixel row,
    into a linear layer. `table` is paramserver.Embedding or nn.EmbeddingBag(sum)."""

    def __init__(self, table):
        super().__init__()
        self.table = table
        self.fc = torch.nn.Linear(TABLE_DIM + SIDE, CLASSES)

    def forward(self, images, ids, offsets):
        return self.fc(torch.cat([self.table(ids, offsets), images.mean(dim=(1, 2))], dim=1))


def write_progress(path, step):
    """Writes `step` to `path` atomically (what the tests wait on: cluster_test's
    _wait_for_step)."""
    with open(path + ".part", "w") as f:
        f.write(str(step))
    os.replace(path + ".part", path)


def seeded_cnn():
    torch.manual_seed(1234)
    return SmallCnn()


def dataset(examples=512):
    generator = torch.Generator().manual_seed(7)
    images = torch.randn(examples, 1, SIDE, SIDE, generator=generator)
    mixing = torch.randn(SIDE * SIDE, CLASSES, generator=generator)
    labels = (images.reshape(examples, -1) @ mixing).argmax(dim=1)
    ids = torch.randint(0, VOCABULARY, (examples, IDS_PER_EXAMPLE), generator=generator)
    return images, labels, ids


def worker_batch(data, rank, workers, step, batch):
    """Worker `rank`'s batch of `step`: its contiguous share of the data, in order."""
    images, labels, ids = data
    share = images.shape[0] // workers
    start = rank * share + (step * batch) % share
    rows = slice(start, start + batch)
    bag_ids = ids[rows].reshape(-1)
    offsets = torch.arange(0, batch * IDS_PER_EXAMPLE, IDS_PER_EXAMPLE)
    return images[rows], labels[rows], bag_ids, offsets


def global_batch(data, workers, step, batch):
    """Every worker's batch of `step`, concatenated in rank order (one sync step)."""
    parts = [worker_batch(data, r, workers, step, batch) for r in range(workers)]
    images = torch.cat([p[0] for p in parts])
    labels = torch.cat([p[1] for p in parts])
    ids = torch.cat([p[2] for p in parts])
    offsets = torch.arange(0, images.shape[0] * IDS_PER_EXAMPLE, IDS_PER_EXAMPLE)
    return images, labels, ids, offsets


def train_reference(workers, steps, batch, lr, eps, table_rows=None, table_lr=None,
                    table_mode="sum", table_rowwise_adagrad=None):
    """One process on all workers' batches together with torch.optim.Adam (and, with
    `table_rows`, the table as nn.EmbeddingBag(table_mode, sparse) under SparseAdam, or
    under row-wise Adagrad with `table_rowwise_adagrad` = (lr, eps)): the weights a sync
    job of `workers` workers ends with. Returns name -> tensor."""
    data = dataset()
    if table_rows is None:
        model = seeded_cnn()
        optimizers = [torch.optim.Adam(model.parameters(), lr=lr, eps=eps)]
    else:
        bag = torch.nn.EmbeddingBag(VOCABULARY, TABLE_DIM, mode=table_mode, sparse=True)
        torch.manual_seed(1234)  # as the job's script seeds before TableNet's layers
        model = TableNet(bag)
        with torch.no_grad():
            bag.weight.copy_(table_rows)
        if table_rowwise_adagrad is None:
            table_optimizer = torch.optim.SparseAdam(bag.parameters(), lr=table_lr, eps=eps)
        else:
            from torch_row_optimizers import RowwiseAdagrad
            table_optimizer = RowwiseAdagrad(bag.parameters(), *table_rowwise_adagrad)
        optimizers = [torch.optim.Adam(model.fc.parameters(), lr=lr, eps=eps), table_optimizer]
    for step in range(steps):
        images, labels, ids, offsets = global_batch(data, workers, step, batch)
        for optimizer in optimizers:
            optimizer.zero_grad()
        logits = model(images) if table_rows is None else model(images, ids, offsets)
        torch.nn.functional.cross_entropy(logits, labels).backward()
        for optimizer in optimizers:
            optimizer.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


# Training recipes a script drives through paramserver.DistributedOptimizer, each with
# the spec's training.optimizer that keeps its state (type, and what sets the slots).
RECIPE_SPECS = {
    # AdamW, weights decayed and biases not; OneCycleLR (it cycles betas[0] too).
    "adamw_onecycle": {"type": "adamw", "learning_rate": 0.003},
    # SGD with nesterov momentum and weight decay, fc2 at its own rate; StepLR.
    "sgd_step": {"type": "sgd", "learning_rate": 0.05, "momentum": 0.9},
    # RMSprop, centered with momentum; ReduceLROnPlateau on the batch loss.
    "rmsprop_plateau": {"type": "rmsprop", "learning_rate": 0.01, "momentum": 0.5,
                        "centered": True},
    # Adagrad with lr_decay and an initial accumulator; LambdaLR.
    "adagrad_lambda": {"type": "adagrad", "learning_rate": 0.05, "lr_decay": 0.01,
                       "initial_accumulator_value": 0.1},
    # SGD with momentum and weight decay; CosineAnnealingLR over the whole run.
    "sgd_cosine": {"type": "sgd", "learning_rate": 0.05, "momentum": 0.9},
    # Adam with amsgrad and L2 weight decay; ExponentialLR.
    "adam_amsgrad_exponential": {"type": "adam", "learning_rate": 0.003, "amsgrad": True},
    # The spec's own optimizer, as job.step trains with it: SGD with momentum, a constant
    # rate (its scheduler a constant LambdaLR).
    "sgd_constant": {"type": "sgd", "learning_rate": 0.05, "momentum": 0.9},
}


def _weights_and_biases(model, weight_decay):
    named = list(model.named_parameters())
    return [{"params": [p for n, p in named if not n.endswith("bias")],
             "weight_decay": weight_decay},
            {"params": [p for n, p in named if n.endswith("bias")], "weight_decay": 0.0}]


def make_recipe(name, model, steps, wrap=lambda optimizer: optimizer):
    """Recipe `name`'s optimizer over `model` (`wrap`ped: the job's script passes
    paramserver.DistributedOptimizer) and its scheduler, made on the wrapped one.
    Returns (optimizer, scheduler)."""
    schedulers = torch.optim.lr_scheduler
    if name == "adamw_onecycle":
        optimizer = wrap(torch.optim.AdamW(_weights_and_biases(model, 0.1), lr=0.003))
        return optimizer, schedulers.OneCycleLR(optimizer, max_lr=0.003, total_steps=steps)
    if name == "sgd_step":
        head = list(model.fc2.parameters())
        body = [p for n, p in model.named_parameters() if not n.startswith("fc2.")]
        optimizer = wrap(torch.optim.SGD([{"params": body}, {"params": head, "lr": 0.02}],
                                         lr=0.05, momentum=0.9, nesterov=True,
                                         weight_decay=5e-4))
        return optimizer, schedulers.StepLR(optimizer, step_size=3, gamma=0.5)
    if name == "sgd_cosine":
        optimizer = wrap(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9,
                                         weight_decay=1e-4))
        return optimizer, schedulers.CosineAnnealingLR(optimizer, T_max=steps)
    if name == "rmsprop_plateau":
        optimizer = wrap(torch.optim.RMSprop(model.parameters(), lr=0.01, momentum=0.5,
                                             centered=True, weight_decay=1e-3))
        return optimizer, schedulers.ReduceLROnPlateau(optimizer, factor=0.5, patience=0)
    if name == "adagrad_lambda":
        optimizer = wrap(torch.optim.Adagrad(model.parameters(), lr=0.05, lr_decay=0.01,
                                             initial_accumulator_value=0.1))
        return optimizer, schedulers.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    if name == "sgd_constant":
        optimizer = wrap(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
        return optimizer, schedulers.LambdaLR(optimizer, lambda step: 1.0)
    if name == "adam_amsgrad_exponential":
        optimizer = wrap(torch.optim.Adam(model.parameters(), lr=0.003, amsgrad=True,
                                          weight_decay=1e-2))
        return optimizer, schedulers.ExponentialLR(optimizer, gamma=0.8)
    raise ValueError("no recipe %r" % name)


def advance_schedule(scheduler, loss):
    """scheduler.step(), with the loss for ReduceLROnPlateau."""
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        scheduler.step(float(loss))
    else:
        scheduler.step()


def train_recipe_reference(name, workers, steps, batch, clip_grad_norm=None, skipped=()):
    """One process replaying a sync job's steps under recipe `name` (every worker's batches
    together; the gradient clipped to `clip_grad_norm` after the mean, if set; the
    optimizer not stepped at the steps in `skipped`, as GradScaler skips them, though the
    scheduler is). Returns (name -> tensor, the number of steps it clipped)."""
    data = dataset()
    model = seeded_cnn()
    optimizer, scheduler = make_recipe(name, model, steps)
    clipped = 0
    for step in range(steps):
        images, labels, _, _ = global_batch(data, workers, step, batch)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        if clip_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)
            clipped += int(norm > clip_grad_norm)
        if step not in skipped:
            optimizer.step()
        advance_schedule(scheduler, loss)
    return {n: p.detach().clone() for n, p in model.named_parameters()}, clipped
