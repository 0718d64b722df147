#!/usr/bin/python3
"""The learning-rate schedules' reference: torch.optim.lr_scheduler's own rates.

  lr_schedule_reference.py CASES OUT

Each line of CASES is "NAME BASE_LR STEPS DESCRIPTION..." (DESCRIPTION as
tests/torch_schedules.py reads it); writes to OUT a line "NAME RATE..." per case: the rate
each of STEPS optimizer steps used, the scheduler stepped after each, as float.hex.
"""
import sys
import warnings

from torch_schedules import learning_rates


def main(cases, out_path):
    warnings.simplefilter("ignore")  # SequentialLR's step(0) deprecation notice
    lines = []
    with open(cases) as f:
        for line in f:
            if not line.strip():
                continue
            name, base, steps, *description = line.split()
            rates = learning_rates(float(base), " ".join(description), int(steps))
            lines.append(name + " " + " ".join(float(r).hex() for r in rates))
    with open(out_path, "w") as out:
        out.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
