"""A click-through-rate model from a PyTorch script: its categorical features index one
paramserver.Embedding table whose rows live on the servers (only the rows a batch reads
travel), its MLP is a plain nn.Sequential. Copy it and put your own model in.

Run it as a job (2 servers, 2 workers, sync):
    deploy/local/run.sh examples/pytorch_ctr/job.yaml
It reads Criteo-format files (label, 13 integer features, 26 hex categorical fields,
tab-separated, gzipped or not) named in the spec's data section; deploy/local/run.sh
writes the generated ones into ~/.cache/paramserver/ctr-demo on first use. Rank 0
reports the test AUC it prints and, as the job's result, the accuracy at 0.5.
"""
import gzip
import os

import numpy
import torch

import paramserver

DENSE, FIELDS, DIM = 13, 26, 16


def read_criteo(path):
    """(dense features log(1 + x), ids, labels): ids are field * 2^32 + the field's value,
    so every field's values are rows of the one table."""
    labels, dense, ids = [], [], []
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        for line in f:
            columns = line.rstrip("\n").split("\t")
            labels.append(float(columns[0]))
            dense.append([numpy.log1p(max(int(c), 0)) if c else 0.0 for c in columns[1:1 + DENSE]])
            ids.append([(field << 32) + (int(c, 16) if c else 0)
                        for field, c in enumerate(columns[1 + DENSE:1 + DENSE + FIELDS])])
    return (torch.tensor(dense, dtype=torch.float32), torch.tensor(ids, dtype=torch.int64),
            torch.tensor(labels, dtype=torch.float32))


class Ctr(torch.nn.Module):
    def __init__(self, job):
        super().__init__()
        self.features = paramserver.Embedding(job, "features", DIM)  # rows on the servers
        self.mlp = torch.nn.Sequential(torch.nn.Linear(DENSE + FIELDS * DIM, 128),
                                       torch.nn.ReLU(), torch.nn.Linear(128, 1))

    def forward(self, dense, ids):
        batch = ids.shape[0]
        # One row per (example, field): bags of one id each.
        rows = self.features(ids.reshape(-1), torch.arange(batch * FIELDS))
        return self.mlp(torch.cat([dense, rows.reshape(batch, FIELDS * DIM)], dim=1)).squeeze(1)


def auc(scores, labels):
    """Area under the ROC curve: the chance a random click outscores a random non-click."""
    order = torch.argsort(scores)
    ranks = torch.empty_like(scores)
    ranks[order] = torch.arange(1, len(scores) + 1, dtype=scores.dtype)
    positives = labels.sum()
    negatives = len(labels) - positives
    return ((ranks[labels == 1].sum() - positives * (positives + 1) / 2) /
            (positives * negatives)).item()


def main():
    job = paramserver.init()
    data, training = job.config["data"], job.config.get("training", {})
    batch_size = training.get("batch_size", 256)
    dense, ids, labels = read_criteo(os.path.expanduser(data["train"]))
    torch.manual_seed(0)
    model = Ctr(job)
    job.register(model)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    batches = len(labels) // batch_size
    for epoch in range(training.get("epochs", 1)):
        # Rank r of W takes batches r, r + W, ...: every worker the same number of steps.
        for b in range(job.rank, batches - batches % job.num_workers, job.num_workers):
            rows = slice(b * batch_size, (b + 1) * batch_size)
            model.zero_grad()
            loss = loss_fn(model(dense[rows], ids[rows]), labels[rows])
            loss.backward()
            job.step(model, loss=loss, batch_size=batch_size)
        print("worker %d: epoch %d done, last loss %.4f" % (job.rank, epoch, loss.item()),
              flush=True)
    accuracy = None
    if job.rank == 0:
        test_dense, test_ids, test_labels = read_criteo(os.path.expanduser(data["test"]))
        with torch.no_grad():
            scores = torch.cat([model(test_dense[i:i + 4096], test_ids[i:i + 4096])
                                for i in range(0, len(test_labels), 4096)])
        accuracy = ((scores > 0).float() == test_labels).float().mean().item()
        print("test auc %.4f accuracy %.4f" % (auc(scores, test_labels), accuracy), flush=True)
    job.finish(test_accuracy=accuracy)


if __name__ == "__main__":
    main()
