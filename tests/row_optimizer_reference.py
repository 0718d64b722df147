#!/usr/bin/python3
"""Row-wise Adagrad and FTRL-Proximal, written from their published update rules, for
tests/sparse_optimizer_agreement_test (torch has neither).

  row-wise Adagrad (FBGEMM's EXACT_ROWWISE_ADAGRAD, TorchRec's default): one accumulator
    per row; for each row in a step's gradient g (a row of dim floats):
      a += sum(g * g) / dim;  w -= lr / (sqrt(a) + eps) * g
  FTRL-Proximal (TensorFlow's ApplyFtrl, which tf.keras.optimizers.Ftrl runs, without
    L2 shrinkage; beta folded into l2 as Keras folds it), per element, p = -lr_power:
      n' = n + g^2;  z += g - (n'^p - n^p) / lr * w
      w = 0 if |z| <= l1 else (sign(z) l1 - z) / ((beta + n'^p) / lr + 2 l2);  n = n'
    where x^p is sqrt(x) if lr_power is -0.5 (ApplyFtrl's special case), else pow(x, p).

Reads the case file tests/sparse_optimizer_agreement_test writes (see
tests/sparse_optimizer_reference.py; the header here also carries the initial
accumulator, lr_power, l1, l2 and beta) and prints the final table, one row per line,
each float as float.hex. Every operation is numpy float32, in the order written above.
"""
import sys

import numpy as np

f32 = np.float32


def main(path):
    with open(path) as case:
        lines = [line.split() for line in case if line.strip()]
    header = lines.pop(0)
    kind = header[0]
    lr, eps = f32(float(header[1])), f32(float(header[4]))
    rows, dim, steps = map(int, header[5:8])
    initial, lr_power, l1, l2, beta = (f32(float(x)) for x in header[8:13])
    power = f32(-lr_power)

    def to_power(x):
        return f32(np.sqrt(x)) if lr_power == f32(-0.5) else f32(np.power(x, power))

    table = np.array([[float.fromhex(x) for x in lines.pop(0)] for _ in range(rows)], dtype=f32)
    if kind == "rowwise_adagrad":
        accumulator = np.full(rows, initial, dtype=f32)
    else:
        n = np.full((rows, dim), initial, dtype=f32)
        z = np.zeros((rows, dim), dtype=f32)
    for _ in range(steps):
        count = int(lines.pop(0)[0])
        for _ in range(count):
            entry = lines.pop(0)
            r = int(entry[0])
            g = np.array([float.fromhex(x) for x in entry[1:]], dtype=f32)
            if kind == "rowwise_adagrad":
                total = f32(0)
                for x in g:
                    total = f32(total + f32(x * x))
                accumulator[r] = f32(accumulator[r] + f32(total / f32(dim)))
                multiplier = f32(lr / f32(np.sqrt(accumulator[r]) + eps))
                for i in range(dim):
                    table[r, i] = f32(table[r, i] - f32(multiplier * g[i]))
            else:
                for i in range(dim):
                    n_new = f32(n[r, i] + f32(g[i] * g[i]))
                    n_power = to_power(n_new)
                    sigma = f32(f32(n_power - to_power(n[r, i])) / lr)
                    z[r, i] = f32(z[r, i] + f32(g[i] - f32(sigma * table[r, i])))
                    n[r, i] = n_new
                    if abs(z[r, i]) <= l1:
                        table[r, i] = f32(0)
                    else:
                        quadratic = f32(f32(f32(beta + n_power) / lr) + f32(f32(2) * l2))
                        signed_l1 = l1 if z[r, i] > 0 else -l1
                        table[r, i] = f32(f32(signed_l1 - z[r, i]) / quadratic)
    for row in table:
        print(" ".join(float(x).hex() for x in row.tolist()))


if __name__ == "__main__":
    main(sys.argv[1])
