#!/usr/bin/env python3
"""PyTorch's version of bench/worker_step_bench: the same 784-128-10 MLP step, with the
same host<->device traffic (parameters and batch in from pinned host memory, gradient
out to pinned host memory), on the GPU. Prints lines like
  backend=pytorch batch=32 samples_per_sec=123456
(median of 5 runs of ~0.5 s)."""
import time

import torch


def main():
    if not torch.cuda.is_available():
        print("# pytorch: no CUDA device")
        return
    device = torch.device("cuda:0")
    torch.backends.cuda.matmul.allow_tf32 = False
    model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to(device)
    params = list(model.parameters())
    total = sum(p.numel() for p in params)
    host_params = torch.randn(total).pin_memory()
    host_gradient = torch.empty(total).pin_memory()
    for batch in (32, 256, 1024):
        host_x = torch.rand(batch, 784).pin_memory()
        host_y = torch.randint(0, 10, (batch,)).pin_memory()

        def step():
            flat = host_params.to(device, non_blocking=True)
            offset = 0
            with torch.no_grad():
                for p in params:
                    p.copy_(flat[offset:offset + p.numel()].view_as(p))
                    offset += p.numel()
            x = host_x.to(device, non_blocking=True)
            y = host_y.to(device, non_blocking=True)
            for p in params:
                p.grad = None
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            host_gradient.copy_(torch.cat([p.grad.reshape(-1) for p in params]), non_blocking=True)
            loss_value = loss.item()  # synchronises, as our backend returns the loss
            return loss_value

        for _ in range(5):
            step()
        rates = []
        for _ in range(5):
            steps = 0
            start = time.perf_counter()
            while time.perf_counter() - start < 0.5:
                step()
                steps += 1
            torch.cuda.synchronize()
            rates.append(steps * batch / (time.perf_counter() - start))
        rates.sort()
        print(f"backend=pytorch batch={batch} samples_per_sec={rates[len(rates) // 2]:.0f}", flush=True)


if __name__ == "__main__":
    main()
