"""paramserver.DistributedOptimizer: a script's torch.optim optimizer, run by the servers.

The servers hold the weights and the optimizer's state; the script keeps what torch
users change while training, the ``param_groups`` (rates, weight decay, betas, ...).
Each :meth:`DistributedOptimizer.step` pushes the gradients with every group's current
settings and pulls the new values, so any ``torch.optim.lr_scheduler`` (it takes a
DistributedOptimizer, an ``Optimizer``) or the script's own code drives the servers'
update. See docs/PYTHON.md, "porting a recipe".
"""

import math
import warnings

import torch
from torch.cuda.amp.grad_scaler import OptState

from . import _native

# torch.optim's classes the servers implement, exactly (ps/dense_optimizer.h), by the
# name training.optimizer.type gives each.
SUPPORTED = (
    (torch.optim.SGD, "sgd"),
    (torch.optim.Adam, "adam"),
    (torch.optim.AdamW, "adamw"),
    (torch.optim.Adagrad, "adagrad"),
    (torch.optim.RMSprop, "rmsprop"),
)

def _type_name(optimizer):
    for cls, name in SUPPORTED:
        if type(optimizer) is cls:
            return name
    return None


def _float(value):
    return float(value.item() if isinstance(value, torch.Tensor) else value)


def _group_values(group):
    """The 13 values the native step reads from one param group (defaults: torch's)."""
    beta1, beta2 = group.get("betas", (0.9, 0.999))
    return (_float(group["lr"]), _float(group.get("weight_decay", 0.0)),
            _float(group.get("momentum", 0.0)), _float(group.get("dampening", 0.0)),
            bool(group.get("nesterov", False)), _float(beta1), _float(beta2),
            _float(group.get("eps", 1e-8)), bool(group.get("amsgrad", False)),
            _float(group.get("lr_decay", 0.0)), _float(group.get("alpha", 0.99)),
            bool(group.get("centered", False)),
            _float(group.get("initial_accumulator_value", 0.0)))


class DistributedOptimizer(torch.optim.Optimizer):
    """Runs `optimizer`'s update on the servers: ``step()`` pushes, the servers apply.

    `optimizer` is a torch.optim SGD, Adam, AdamW, Adagrad or RMSprop over the
    parameters `job` registered (every one of them, each in one group); its type must be
    the spec's ``training.optimizer.type``, whose state the servers keep. This object
    shares its ``param_groups`` (the same dicts) and ``defaults``, so a scheduler made on
    either changes what the next step sends (make it on this one: torch warns that a
    scheduler on the wrapped optimizer steps before an optimizer.step() it never sees). Between steps a group may change any
    setting (lr, weight_decay, betas, momentum's value, ...) but not the state the
    servers keep for it: momentum on or off, amsgrad, centered, Adagrad's
    initial_accumulator_value (set those in the spec; a step that changes them raises
    ValueError naming the group and tensor).

    `clip_grad_norm` (> 0; None: the spec's training.optimizer.clip_grad_norm, if it
    sets one): the gradients' global 2-norm is clipped to it, as
    ``torch.nn.utils.clip_grad_norm_`` would. In sync mode that of the step's mean
    gradient over every worker, as one process clipping after averaging: each server
    holds the step once every worker's push is in and reports its shards' sums of
    squares with the push's reply; every worker adds them (in shard order, so all get
    the same norm) and its pull of the next step brings the coefficient the servers then
    apply the step with. In async and ssp modes that of this worker's gradient, clipped
    before it is pushed.

    Loss scaling: ``torch.cuda.amp.GradScaler`` works as its documentation shows
    (``scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()``). Its
    step() calls this one's, which unscales the gradients (unless ``scaler.unscale_``
    did) and pushes them, or, where the scaler found them not finite, tells the servers
    that this worker skips the step: in sync mode every server then skips it, whatever
    the other workers pushed, and the optimizer's update count stays where it was, as
    torch's would. A loop of its own scaling passes ``found_inf`` to :meth:`step`.

    Raises TypeError for an optimizer the servers do not implement, ValueError for a
    group or setting they cannot run, :class:`paramserver.Error` before job.register.
    """

    # GradScaler.step(optimizer) then calls step(grad_scaler=scaler) on every step, so
    # that a skipped step still reaches the servers (sync: the other workers wait on it).
    _step_supports_amp_scaling = True

    def __init__(self, optimizer, job, clip_grad_norm=None):
        name = _type_name(optimizer)
        if name is None:
            raise TypeError(
                "paramserver.DistributedOptimizer: %s is not one the servers run; they run "
                "%s" % (type(optimizer).__name__,
                        ", ".join("torch.optim." + cls.__name__ for cls, _ in SUPPORTED)))
        if job._params is None:
            raise _native.Error("DistributedOptimizer before job.register: register the "
                                "model first (job.register(model))")
        if clip_grad_norm is not None:
            clip_grad_norm = float(clip_grad_norm)
            if not (math.isfinite(clip_grad_norm) and clip_grad_norm > 0):
                raise ValueError("DistributedOptimizer(clip_grad_norm=%r): it must be finite "
                                 "and > 0" % clip_grad_norm)
        # Optimizer's own constructor sets up its hooks; it appends the same group dicts.
        super().__init__(optimizer.param_groups, optimizer.defaults)
        self.state = optimizer.state
        self._wrapped = optimizer
        self._type = name
        self._job = job
        self._clip_grad_norm = (clip_grad_norm if clip_grad_norm is not None
                                else job._spec_clip_grad_norm())
        self._layout_key = None
        self._runs = None  # [(begin, end, group index)], with _layout_key
        job._native.check_optimizer(self._settings())

    @property
    def optimizer(self):
        """The wrapped torch optimizer (its param_groups are this one's)."""
        return self._wrapped

    def _group_runs(self):
        """The flat vector's runs [(begin, end, group)], recomputed when groups change."""
        key = tuple(tuple(id(p) for p in group["params"]) for group in self.param_groups)
        if key == self._layout_key:
            return self._runs
        job = self._job
        where = {id(tensor): (offset, size, name)
                 for (name, tensor), (offset, size) in zip(job._params, job._offsets)}
        pieces = []
        seen = set()
        for index, group in enumerate(self.param_groups):
            for p in group["params"]:
                if id(p) not in where:
                    raise ValueError(
                        "param_groups[%d] holds a tensor of shape %s that job.register did "
                        "not register: the servers train the registered parameters only"
                        % (index, tuple(p.shape)))
                offset, size, _ = where[id(p)]
                seen.add(id(p))
                pieces.append((offset, offset + size, index))
        missing = [name for name, tensor in job._params if id(tensor) not in seen]
        if missing:
            raise ValueError("registered parameter%s %s in no param group: give the optimizer "
                             "every parameter job.register registered"
                             % ("s" if len(missing) > 1 else "", ", ".join(missing)))
        pieces.sort()
        runs = []
        for begin, end, index in pieces:
            if runs and runs[-1][2] == index and runs[-1][1] == begin:
                runs[-1] = (runs[-1][0], end, index)
            else:
                runs.append((begin, end, index))
        self._layout_key, self._runs = key, runs
        return runs

    def _settings(self):
        """This step's (type, runs) for the native step, from the groups as they are now."""
        for index, group in enumerate(self.param_groups):
            if group.get("fused"):
                raise ValueError("param_groups[%d] sets fused: the servers run the update "
                                 "themselves; drop fused" % index)
        values = [_group_values(group) for group in self.param_groups]
        return (self._type, [(begin, end, index, values[index])
                             for begin, end, index in self._group_runs()])

    def _negated_runs(self):
        return [(begin, end) for begin, end, index in self._group_runs()
                if self.param_groups[index].get("maximize", False)]

    @torch.no_grad()
    def step(self, closure=None, loss=None, batch_size=None, grad_scaler=None, found_inf=None):
        """Pushes the registered parameters' gradients with every group's settings; the
        parameters then hold the servers' new values.

        `closure` (torch's): re-evaluates the model and returns the loss; it runs first,
        with gradients enabled. `loss` and `batch_size` feed psctl's progress as
        :meth:`Job.step`'s do (a closure's loss is used when `loss` is None).
        `grad_scaler` (GradScaler.step passes itself): unscale with it and skip the step
        where it found the gradients not finite. `found_inf` (a bool or a tensor; a loop
        of its own loss scaling): True skips the step, on every server in sync mode; the
        gradients are not read. Returns the closure's loss, or None.
        """
        closure_loss = None
        if closure is not None:
            with torch.enable_grad():
                closure_loss = closure()
        if grad_scaler is not None:
            found_inf = self._unscale_with(grad_scaler)
        skip = bool(found_inf) if found_inf is not None else False
        self._job._push_step(loss if loss is not None else closure_loss, batch_size,
                             self._settings(), self._negated_runs(), skip, self._clip_grad_norm)
        return closure_loss

    def _unscale_with(self, grad_scaler):
        """Unscales the gradients with `grad_scaler` (unless its unscale_ did already) and
        says whether it found any not finite, as GradScaler.step would."""
        state = grad_scaler._per_optimizer_states[id(self)]
        if state["stage"] is OptState.READY:
            grad_scaler.unscale_(self)
        return sum(v.item() for v in state["found_inf_per_device"].values()) > 0

    def resume_schedule(self, scheduler, every=1):
        """Brings `scheduler`, made on this optimizer or the one it wraps, to where the job resumes: after
        ``checkpoint.resume``, ``job.step_number`` is the checkpoint's step (0 in a fresh
        job), and the script's scheduler starts again from its first rate. This steps it
        ``job.step_number // every`` times, as the lost job did (`every`: the optimizer
        steps per ``scheduler.step()``; a scheduler stepped once an epoch takes the
        batches per epoch), so that the next step sends the rates the lost job would have
        sent. Call it after making the scheduler, before training. Returns the number of
        scheduler steps replayed.

        For schedulers that are a function of their step count: every torch scheduler but
        ReduceLROnPlateau, whose rate depends on the losses (ValueError: save and load its
        state_dict yourself). ValueError, too, for a scheduler made on another optimizer
        or an `every` < 1.
        """
        if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            raise ValueError("DistributedOptimizer.resume_schedule: ReduceLROnPlateau's rate "
                             "depends on the losses, not on the step; save its state_dict "
                             "and load it when the job resumes")
        if not any(getattr(scheduler, "optimizer", None) is mine
                   for mine in (self, self.optimizer)):
            raise ValueError("DistributedOptimizer.resume_schedule: the scheduler was made on "
                             "another optimizer; make it on this DistributedOptimizer (or the "
                             "optimizer it wraps)")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError("DistributedOptimizer.resume_schedule(every=%r): it must be an "
                             "int >= 1 (optimizer steps per scheduler step)" % (every,))
        replayed = self._job.step_number // every
        with warnings.catch_warnings():
            # "lr_scheduler.step() before optimizer.step()": replaying is what is meant.
            warnings.simplefilter("ignore", UserWarning)
            for _ in range(replayed):
                scheduler.step()
        return replayed

    def load_state_dict(self, state_dict):
        """torch's, into the wrapped optimizer (whose groups this one goes on sharing): its
        settings come back; the state the servers hold is theirs (a checkpoint restores
        it)."""
        self._wrapped.load_state_dict(state_dict)
        self.param_groups = self._wrapped.param_groups
        self.state = self._wrapped.state
        self._layout_key = None  # the groups are new dicts: map them again

    def add_param_group(self, param_group):
        # torch's constructor calls this for each group; afterwards the servers' tensors
        # are fixed, and a group of new tensors would hold tensors they do not train.
        if getattr(self, "_job", None) is not None:
            raise ValueError("DistributedOptimizer.add_param_group: the servers train the "
                             "tensors job.register registered; regroup them in the wrapped "
                             "optimizer before wrapping it")
        super().add_param_group(param_group)
