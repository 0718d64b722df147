"""paramserver: train your own PyTorch model on the parameter servers.

A script started by ps_worker for a job of ``model.type: torch`` (deploy/local/run.sh
job.yaml, or the EC2 worker unit) joins the job with ``paramserver.init()``, registers
its model, and calls ``job.step(model)`` after each backward pass: the gradients go to
the servers, which apply the spec's training.optimizer (sync, async or ssp, as the spec
says), and the model comes back holding the servers' new values. A script that drives
its own torch.optim optimizer and schedulers wraps it in :class:`DistributedOptimizer`
and calls its ``step()`` instead. See docs/PYTHON.md.

    import paramserver
    job = paramserver.init()
    model = MyNet().to(device)
    job.register(model)
    for x, y in my_batches(job.rank, job.num_workers):
        model.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        job.step(model, loss=loss)
    job.finish(test_accuracy=accuracy)
"""

import json
import math

import numpy
import torch

from . import _native
from .optimizer import DistributedOptimizer
from .weights import load_file, load_state_dict

__all__ = ["DistributedOptimizer", "Error", "Embedding", "Job", "init", "load_file",
           "load_state_dict"]

#: Every failure the servers, the scheduler or the package report: a RuntimeError whose
#: message says what is wrong and whose ``code`` is the status's name
#: ("FAILED_PRECONDITION", "UNAVAILABLE", ...).
Error = _native.Error


def init():
    """Joins the job this process was started for and returns its :class:`Job`.

    Registers with the scheduler (this gives the rank) and starts sending heartbeats from
    the package's own thread. Raises :class:`Error` when the process was not started for
    a job (``PARAMSERVER_CONFIG`` unset), when its spec is not a ``model.type: torch``
    one, or when init() was called already.
    """
    return Job(_native.Worker.join())


def _persistent_buffers(module, parameters):
    """`module`'s buffers that its state_dict() holds, as (name, tensor), in its order: a
    buffer registered with persistent=False, or set to None, is not one. TypeError for a
    dtype other than float32 and int64."""
    parameter_ids = {id(tensor) for _, tensor in parameters}
    parameter_names = {name for name, _ in parameters}
    buffer_ids = {id(b) for b in module.buffers()}
    buffers = []
    for name, tensor in module.state_dict(keep_vars=True).items():
        if name in parameter_names or id(tensor) in parameter_ids:
            continue  # a parameter (or one shared under a second name)
        if not isinstance(tensor, torch.Tensor) or id(tensor) not in buffer_ids:
            continue  # extra state (get_extra_state), not a buffer
        if tensor.dtype not in (torch.float32, torch.int64):
            raise TypeError("buffer '%s' is %s: paramserver carries float32 and int64 buffers "
                            "(call model.float() first)" % (name, tensor.dtype))
        buffers.append((name, tensor))
    return buffers


def _flat_buffer(size, pinned):
    """A float32 CPU tensor of `size` values (page-locked when a GPU is in use)."""
    return torch.empty(size, dtype=torch.float32, pin_memory=pinned)


class Job:
    """One worker's part of a job. Made by :func:`init`."""

    def __init__(self, native):
        self._native = native
        self._params = None  # [(name, tensor)] once registered
        self._tables = []  # Embedding modules, in declaration order
        self._finished = False
        self._config = None
        self._step_seed = None  # seed_steps

    @property
    def rank(self):
        """This worker's rank: 0 .. num_workers - 1."""
        return self._native.rank

    @property
    def num_workers(self):
        """The number of worker ranks in the job: cluster.workers, or for a range
        ``{min, max}`` its max (ranks past min are taken by workers that join later).
        A script that cuts its data by rank cuts it into this many shares."""
        return self._native.num_workers

    @property
    def config(self):
        """The cluster spec, as a dict (the YAML file's keys and values)."""
        if self._config is None:
            self._config = self._native.config()
        return self._config

    def _spec_clip_grad_norm(self):
        """training.optimizer.clip_grad_norm (validated at start), or None."""
        optimizer = (self.config.get("training") or {}).get("optimizer") or {}
        clip = optimizer.get("clip_grad_norm")
        return None if clip is None else float(clip)

    def _servers_clip(self):
        """Whether the servers clip (sync: the step's mean gradient) rather than this
        worker (async and ssp: its own push)."""
        return (self.config.get("training") or {}).get("mode", "sync") == "sync"

    @property
    def step_number(self):
        """The step the next :meth:`step` trains (0 in a fresh job)."""
        return self._native.step_number

    def data_position(self, steps_per_epoch):
        """Where in its data this worker's next step is: ``(epoch, step_in_epoch)`` for
        :attr:`step_number` when each epoch is `steps_per_epoch` steps of this worker's
        (``divmod``). A fresh job is at ``(0, 0)``; one resumed from a checkpoint
        (checkpoint.resume, after its whole cluster was lost) at the checkpoint's step, so
        a script that skips the epochs and steps before it, and draws each epoch's order
        from the epoch number (not from a random state carried over from the epochs
        before), trains the batches the lost job would have. Random numbers a step draws
        (dropout, augmentation) come out the same with :meth:`seed_steps`: no random
        state is saved with the checkpoints."""
        steps_per_epoch = int(steps_per_epoch)
        if steps_per_epoch < 1:
            raise ValueError("job.data_position: steps_per_epoch must be >= 1, got %d"
                             % steps_per_epoch)
        return divmod(self.step_number, steps_per_epoch)

    def batches(self, dataset_size, batch_size):
        """Yields the example indices (an int64 torch tensor of `batch_size`) of each batch
        this worker trains, handed out by the scheduler in leases: every epoch
        (training.epochs) of ``range(dataset_size)``, in each epoch's order
        (training.shuffle and training.seed), is trained once across the workers, however
        many come and go. Train each batch with exactly one :meth:`step` before taking the
        next: that step's push acknowledges the batch. A worker that dies leaves the rest
        of its lease to another; a slow one takes fewer leases. Ends when every epoch is
        trained. Async mode (training.mode: async) only: :class:`Error` otherwise. The
        batches past the last whole one of an epoch are not trained. See docs/PYTHON.md::

            for indices in job.batches(len(dataset), 64):
                x, y = dataset[indices]
                ...
                job.step(model, loss=loss)
        """
        dataset_size = int(dataset_size)
        batch_size = int(batch_size)
        if batch_size < 1 or dataset_size < batch_size:
            raise ValueError("job.batches(dataset_size=%d, batch_size=%d): the set must hold "
                             "at least one batch" % (dataset_size, batch_size))
        while True:
            indices = self._native.next_leased_batch(dataset_size, batch_size)
            if indices is None:
                return
            yield torch.from_numpy(indices)

    def seed_steps(self, seed):
        """Makes the random numbers of each step a function of (`seed`, this worker's rank,
        the step number): from now on, and after every :meth:`step`, torch's generators
        (``torch.manual_seed``: the CPU's and every GPU's) are seeded for the next step.
        Dropout masks, random augmentation and anything else drawn from torch's default
        generators then come out the same in a job resumed from a checkpoint (or rolled
        back) as in one never stopped, which a random state carried over from the steps
        before cannot do: no random state is saved with the checkpoints. Draws from
        Python's ``random`` or NumPy are the script's to seed likewise."""
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError("job.seed_steps(seed): seed must be an int, got %r" % (seed,))
        self._step_seed = seed
        self._seed_step()

    def _seed_step(self):
        if self._step_seed is None:
            return
        mixed = self._step_seed & 0xFFFFFFFFFFFFFFFF
        for part in (self.rank, self.step_number):
            mixed = (mixed * 0x9E3779B97F4A7C15 + part + 1) & 0xFFFFFFFFFFFFFFFF
            mixed ^= mixed >> 31
        torch.manual_seed(mixed & 0x7FFFFFFFFFFFFFFF)

    def _add_table(self, module, name, dim):
        if self._params is not None:
            raise Error("paramserver.Embedding '%s' made after job.register: make every "
                        "table before registering the model" % name)
        if any(table.name == name for table in self._tables):
            raise Error("paramserver.Embedding '%s' is made twice" % name)
        self._tables.append(module)
        return len(self._tables) - 1

    def register(self, model):
        """Declares the model's parameters and buffers and makes them hold the servers'
        values.

        `model` is an ``nn.Module`` (its ``named_parameters()`` and the buffers its
        ``state_dict()`` holds: BatchNorm's running_mean, running_var and
        num_batches_tracked) or a list of ``(name, tensor)`` pairs (parameters only).
        The job's first registration places its tensors (names, shapes, kinds) and
        embedding tables on the servers, with these values as the initial ones unless
        ``model.init_from`` names a file; every later worker's must match (an
        :class:`Error` names the tensor that does not) and receives the values.
        Parameters must be float32, buffers float32 or int64; they may live on a GPU.

        Buffers are not trained: each :meth:`step` pushes the change this worker's
        forward passes made to them since the last pull, and the servers add it (sync:
        the mean of the workers' changes, so every worker's buffers hold the mean of
        what each computed; async and ssp: each worker's change as it comes).
        """
        if self._finished:
            raise Error("job.register after job.finish")
        if self._params is not None:
            raise Error("job.register was called already: a job trains one model")
        buffers = []
        if isinstance(model, torch.nn.Module):
            named = list(model.named_parameters())
            buffers = _persistent_buffers(model, named)
        else:
            named = list(model)
        for entry in named:
            if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], str)
                    and isinstance(entry[1], torch.Tensor)):
                raise TypeError("job.register takes an nn.Module or a list of (name, tensor) "
                                "pairs, got an entry %r" % (entry,))
        for name, tensor in named:
            if tensor.dtype != torch.float32:
                raise TypeError("parameter '%s' is %s: paramserver trains float32 parameters "
                                "(call model.float() first)" % (name, tensor.dtype))
        self._params = named
        self._buffers = buffers
        self._offsets = []
        total = 0
        for _, tensor in named:
            self._offsets.append((total, tensor.numel()))
            total += tensor.numel()
        self._trained = total  # the buffers' changes follow the gradient
        self._buffer_offsets = []
        for _, tensor in buffers:
            self._buffer_offsets.append((total, tensor.numel()))
            total += tensor.numel()
        everything = named + buffers
        pinned = torch.cuda.is_available() and any(t.is_cuda for _, t in everything)
        self._pinned = pinned
        self._values = _flat_buffer(total, pinned)
        self._gradient = _flat_buffer(total, pinned)
        with torch.no_grad():
            for (_, tensor), (offset, size) in zip(everything,
                                                   self._offsets + self._buffer_offsets):
                self._values[offset:offset + size].copy_(tensor.detach().reshape(-1))
        tables = [(table.name, table.dim, table._optimizer_text, table.max_rows, table.min_count)
                  for table in self._tables]
        kinds = (["parameter"] * len(named) +
                 ["integer_buffer" if tensor.dtype == torch.int64 else "float_buffer"
                  for _, tensor in buffers])
        wire = (self.config.get("training") or {}).get("wire_dtype", "float32")
        counters = [name for name, tensor in buffers if tensor.dtype == torch.int64]
        if counters and wire != "float32":
            self._params = None
            raise Error("buffer '%s' is an int64 count, which training.wire_dtype %s cannot carry "
                        "exactly (past 2048 steps it rounds, past 65504 it overflows): train "
                        "with wire_dtype float32, or register the buffer with persistent=False"
                        % (counters[0], wire))
        try:
            self._native.declare([name for name, _ in everything],
                                 [list(tensor.shape) for _, tensor in everything], kinds, tables,
                                 self._values.numpy())
            self._native.pull_current(self._values.numpy())
        except BaseException:
            self._params = None
            raise
        self._scatter_values()

    def _scatter_values(self):
        with torch.no_grad():
            for (_, tensor), (offset, size) in zip(self._params, self._offsets):
                tensor.copy_(self._values[offset:offset + size].view(tensor.shape),
                             non_blocking=True)
            for (_, tensor), (offset, size) in zip(self._buffers, self._buffer_offsets):
                value = self._values[offset:offset + size].view(tensor.shape)
                if tensor.dtype == torch.int64:  # the servers hold it rounded
                    value = value.round()
                tensor.copy_(value, non_blocking=True)
        if self._pinned:
            torch.cuda.synchronize()

    def _gather_buffer_changes(self):
        """Writes each buffer's change since the last pull (its value now less the value
        pulled) after the gradient."""
        if not self._buffers:
            return
        with torch.no_grad():
            for (_, tensor), (offset, size) in zip(self._buffers, self._buffer_offsets):
                self._gradient[offset:offset + size].copy_(tensor.detach().reshape(-1),
                                                           non_blocking=True)
            if self._pinned:
                torch.cuda.synchronize()
            start = self._trained
            self._gradient[start:].sub_(self._values[start:])

    def step(self, model=None, loss=None, batch_size=None):
        """Pushes every registered parameter's ``grad``, then pulls the new values in.

        Call it once per batch, after ``loss.backward()``. The gradient is the one the
        loss produced (that of this worker's mean batch loss); in sync mode the servers
        apply the mean over workers. A parameter whose ``grad`` is None pushes zeros. The
        rows each :class:`Embedding` read in this step push their gradients too. `loss`
        (a number or a scalar tensor) and `batch_size` (examples in the batch; default
        training.batch_size) feed the progress that ``psctl`` shows. `model` may be given
        for readability; the registered parameters are what is pushed. With
        training.optimizer.clip_grad_norm the gradient's global norm is clipped to it, as
        ``torch.nn.utils.clip_grad_norm_`` does: in sync mode the norm of the step's mean
        gradient (the servers gather it), else that of this worker's push.
        """
        self._push_step(loss, batch_size, None, [], clip_grad_norm=self._spec_clip_grad_norm())

    def _push_step(self, loss, batch_size, optimizer_settings, negated_runs, skip=False,
                   clip_grad_norm=None):
        """step()'s work; `optimizer_settings`: DistributedOptimizer's for this step (None:
        the spec's), `negated_runs`: [(begin, end)] of the flat gradient to push negated
        (groups that maximize); `skip`: this worker skips the step (a loss scaler found its
        gradient not finite): no gradient is sent, and the parameters get the next step's
        values; `clip_grad_norm` (> 0; None: none): the global norm to clip to, by the
        servers in sync mode (the step's mean gradient), else here (this push's)."""
        if self._params is None:
            raise Error("job.step before job.register: register the model first "
                        "(job.register(model))")
        if self._finished:
            raise Error("job.step after job.finish")
        servers_clip = 0.0
        if clip_grad_norm is not None and not skip:
            if self._servers_clip():
                servers_clip = clip_grad_norm
            else:
                torch.nn.utils.clip_grad_norm_(
                    [tensor for _, tensor in self._params if tensor.grad is not None],
                    clip_grad_norm)
        for (name, tensor), (offset, size) in zip([] if skip else self._params, self._offsets):
            grad = tensor.grad
            target = self._gradient[offset:offset + size]
            if grad is None:
                target.zero_()
            elif grad.dtype != torch.float32:
                raise TypeError("parameter '%s' has a %s gradient; float32 is trained"
                                % (name, grad.dtype))
            elif grad.is_sparse:
                raise TypeError("parameter '%s' has a sparse gradient: use paramserver."
                                "Embedding for sparse tables" % name)
            else:
                target.copy_(grad.detach().reshape(-1), non_blocking=True)
        if self._pinned:
            torch.cuda.synchronize()
        if not skip:
            self._gather_buffer_changes()
        for begin, end in negated_runs:
            self._gradient[begin:end].neg_()
        tables = [table._take_step() for table in self._tables]
        if isinstance(loss, torch.Tensor):
            loss = float(loss.detach())
        loss = math.nan if loss is None else float(loss)
        samples = -1 if batch_size is None else int(batch_size)
        if skip:
            tables = []
        self._native.step(self._gradient.numpy(), tables, self._values.numpy(), loss, samples,
                          optimizer_settings, skip, servers_clip)
        self._scatter_values()
        self._seed_step()

    def finish(self, test_accuracy=None):
        """Ends training. Every worker calls it once its steps are done.

        The lowest-ranked live worker (rank 0) then waits for the others, writes
        ``output.weights`` if the spec sets it, and reports the result: `test_accuracy`
        (in [0, 1]; None: the final line has none). Others return once the result is in.
        """
        if self._params is None:
            raise Error("job.finish before job.register: nothing was trained")
        if self._finished:
            raise Error("job.finish was called already")
        if test_accuracy is not None:
            test_accuracy = float(test_accuracy)
            if not 0.0 <= test_accuracy <= 1.0:
                raise ValueError("test_accuracy must be in [0, 1], got %r" % test_accuracy)
        self._finished = True
        self._native.finish(test_accuracy)


class Embedding(torch.nn.Module):
    """A table of `dim`-wide rows keyed by int64 ids, held by the servers.

    ``forward(ids, offsets)`` is ``nn.EmbeddingBag(mode=mode)``'s: bag i pools the rows of
    ``ids[offsets[i]:offsets[i + 1]]``, their sum (``mode='sum'``, the default), mean
    (``'mean'``) or element-wise max (``'max'``). Only the rows a batch reads travel: their values
    when the batch reads them, their gradients with :meth:`Job.step`. Rows start as
    N(0, 1) draws (seeded by model.init_seed), as ``nn.EmbeddingBag``'s do. Make every
    table before :meth:`Job.register`.

    The servers update the rows with training.embedding_optimizer unless the table gives
    its own settings:

    - ``optimizer``: a dict of the spec's embedding_optimizer keys, e.g.
      ``{"type": "rowwise_adagrad", "learning_rate": 0.05}`` or ``{"type": "ftrl",
      "learning_rate": 0.1, "l1": 0.001}``. ``type`` defaults to the spec's; with the
      spec's type every key left out is the spec's, with another that type's default.
    - ``max_rows``: the table's bound over all servers (0: none), in place of
      model.max_rows.
    - ``min_count``: the sightings an id needs for a row, in place of model.min_count.

    A setting out of range is a ``ValueError`` naming the table and the key; every worker
    must give a table the same settings (the job refuses a worker whose differ).
    """

    MODES = ("sum", "mean", "max")

    def __init__(self, job, name, dim, mode="sum", optimizer=None, max_rows=None,
                 min_count=None):
        super().__init__()
        if mode not in Embedding.MODES:
            raise ValueError("paramserver.Embedding(..., mode=%r): mode must be 'sum', 'mean' or "
                             "'max', as nn.EmbeddingBag's" % (mode,))
        if not isinstance(job, Job):
            raise TypeError("paramserver.Embedding(job, name, dim): job comes from "
                            "paramserver.init()")
        if not isinstance(name, str) or not name:
            raise ValueError("an Embedding needs a non-empty name")
        dim = int(dim)
        if dim < 1:
            raise ValueError("Embedding '%s': dim must be >= 1, got %d" % (name, dim))
        if optimizer is not None and not isinstance(optimizer, dict):
            raise TypeError("paramserver.Embedding '%s': optimizer must be a dict of "
                            "training.embedding_optimizer keys (e.g. {'type': 'ftrl', "
                            "'learning_rate': 0.1}), got %s" % (name, type(optimizer).__name__))
        for argument, value in (("max_rows", max_rows), ("min_count", min_count)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError("paramserver.Embedding '%s': %s must be an int, got %r" %
                                (name, argument, value))
        try:
            optimizer_text = None if optimizer is None else json.dumps(optimizer)
        except (TypeError, ValueError) as error:
            raise TypeError("paramserver.Embedding '%s': optimizer must hold names and numbers "
                            "only: %s" % (name, error)) from None
        job._native.check_table_settings(name, optimizer_text, max_rows, min_count)
        self.name = name
        self.dim = dim
        self.mode = mode
        self._settings = (None if optimizer is None else dict(optimizer), max_rows, min_count)
        self._optimizer_text = optimizer_text
        self._job = job
        self._index = job._add_table(self, name, dim)
        self._read = []  # (unique ids, rows leaf) of each forward in this step

    # The table's own settings, as made (read-only: the servers hold them from
    # job.register on).
    optimizer = property(lambda self: None if self._settings[0] is None
                         else dict(self._settings[0]))
    max_rows = property(lambda self: self._settings[1])
    min_count = property(lambda self: self._settings[2])

    def forward(self, ids, offsets):
        if ids.dtype not in (torch.int64, torch.int32):
            raise TypeError("Embedding '%s': ids must be int64, got %s" % (self.name, ids.dtype))
        unique, inverse = torch.unique(ids.detach().to("cpu", torch.int64), sorted=True,
                                       return_inverse=True)
        rows = torch.from_numpy(
            self._job._native.pull_rows(self._index, unique.numpy())).to(ids.device)
        if torch.is_grad_enabled():
            rows.requires_grad_(True)
            self._read.append((unique, rows))
        return torch.nn.functional.embedding_bag(inverse.to(ids.device), rows,
                                                 offsets.to(ids.device), mode=self.mode)

    def _take_step(self):
        """This step's (ids, row gradients) as NumPy arrays, or None; and forgets them."""
        read, self._read = self._read, []
        read = [(ids, rows) for ids, rows in read if rows.grad is not None]
        if not read:
            return None
        if len(read) == 1:  # one forward: its ids are unique and sorted already
            ids, rows = read[0]
            return (numpy.ascontiguousarray(ids.numpy()),
                    numpy.ascontiguousarray(rows.grad.detach().to("cpu", torch.float32).numpy()))
        ids = torch.cat([ids for ids, _ in read])
        grads = torch.cat([rows.grad.detach().to("cpu", torch.float32) for _, rows in read])
        unique, inverse = torch.unique(ids, sorted=True, return_inverse=True)
        summed = torch.zeros(len(unique), self.dim, dtype=torch.float32)
        summed.index_add_(0, inverse, grads)
        return (numpy.ascontiguousarray(unique.numpy()),
                numpy.ascontiguousarray(summed.numpy()))
