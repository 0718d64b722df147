"""torch.optim.lr_scheduler objects for the spec's training.optimizer.lr_schedule, for the
tests' references: make_scheduler(optimizer, "warmup_steps=5 warmup_start_factor=0.25
decay=cosine total_steps=40 min_learning_rate=0.001") builds what a script would write
(SequentialLR of LinearLR and the decay when there is a warm-up), to be stepped once after
each optimizer.step(). Keys as the spec names them.
"""
import torch
from torch.optim import lr_scheduler


def parse(description):
    settings = {}
    for pair in description.split():
        name, value = pair.split("=")
        if name == "milestones":
            settings[name] = [int(x) for x in value.split(",")]
        elif name == "decay":
            settings[name] = value
        elif name in ("warmup_steps", "step_size", "total_steps"):
            settings[name] = int(value)
        else:
            settings[name] = float(value)
    return settings


def make_scheduler(optimizer, description):
    s = parse(description)
    warmup = s.get("warmup_steps", 0)
    decay = s.get("decay", "constant")
    span = s.get("total_steps", 0) - warmup
    gamma = s.get("gamma", 0.1)
    if decay == "constant":
        after = lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)
    elif decay == "step":
        after = lr_scheduler.StepLR(optimizer, step_size=s["step_size"], gamma=gamma)
    elif decay == "multistep":
        after = lr_scheduler.MultiStepLR(optimizer, milestones=s["milestones"], gamma=gamma)
    elif decay == "exponential":
        after = lr_scheduler.ExponentialLR(optimizer, gamma=gamma)
    elif decay == "cosine":
        after = lr_scheduler.CosineAnnealingLR(optimizer, T_max=span,
                                               eta_min=s.get("min_learning_rate", 0.0))
    elif decay == "linear":
        after = lr_scheduler.LinearLR(optimizer, start_factor=1.0,
                                      end_factor=s.get("end_factor", 0.0), total_iters=span)
    elif decay == "polynomial":
        after = lr_scheduler.PolynomialLR(optimizer, total_iters=span, power=s.get("power", 1.0))
    else:
        raise ValueError(f"unknown decay {decay}")
    if warmup == 0:
        return after
    warm = lr_scheduler.LinearLR(optimizer, start_factor=s.get("warmup_start_factor", 1.0 / 3),
                                 end_factor=1.0, total_iters=warmup)
    return lr_scheduler.SequentialLR(optimizer, [warm, after], milestones=[warmup])


def learning_rates(base_lr, description, steps):
    """The rate each of `steps` optimizer steps uses, the scheduler stepped after each."""
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=base_lr)
    scheduler = make_scheduler(optimizer, description)
    rates = []
    for _ in range(steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates
