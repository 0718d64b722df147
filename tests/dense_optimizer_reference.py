#!/usr/bin/python3
"""The dense optimizers' reference: torch.optim's own, on the gradients of a case.

  dense_optimizer_reference.py CASE...   (writes CASE.out for each: one torch import)

Reads each case tests/dense_optimizer_agreement_test writes: a line with the optimizer's
class name (SGD, Adam, AdamW, Adagrad, RMSprop) and its keyword arguments as name=value
pairs (floats in Python's syntax, True/False for flags), a line of initial values, then
one line of gradient values per step, every float as float.hex. Runs that optimizer on
one float32 parameter with each step's gradient in .grad (torch 1.13's default,
single-tensor path on the CPU) and writes the final values and then each state tensor
the optimizer keeps (sorted by name), one line each, every float as float.hex.
"""
import sys

import torch


def parse_value(text):
    if text in ("True", "False"):
        return text == "True"
    return float(text)


def run(path):
    with open(path) as case:
        lines = [line.split() for line in case if line.strip()]
    header = lines.pop(0)
    kind = header[0]
    kwargs = {}
    for pair in header[1:]:
        name, value = pair.split("=")
        kwargs[name] = parse_value(value)
    if "beta1" in kwargs:
        kwargs["betas"] = (kwargs.pop("beta1"), kwargs.pop("beta2"))
    parameter = torch.nn.Parameter(
        torch.tensor([float.fromhex(x) for x in lines.pop(0)], dtype=torch.float32))
    optimizer = getattr(torch.optim, kind)([parameter], **kwargs)
    for line in lines:
        parameter.grad = torch.tensor([float.fromhex(x) for x in line], dtype=torch.float32)
        optimizer.step()
    lines = [" ".join(float(x).hex() for x in parameter.detach().tolist())]
    state = optimizer.state[parameter]
    for name in sorted(state):
        if name == "step" or not torch.is_tensor(state[name]):
            continue
        lines.append(name + " " + " ".join(float(x).hex() for x in state[name].flatten().tolist()))
    with open(path + ".out", "w") as out:
        out.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    torch.set_num_threads(1)
    for case_path in sys.argv[1:]:
        run(case_path)
