"""Row optimizers torch lacks, as torch.optim optimizers of a sparse gradient (an
nn.EmbeddingBag(sparse=True) weight's), written from their published rules for the
references that train one process against our servers (tests/ctr_cluster_reference.py,
tests/python/agreement_model.py)."""
import torch


class RowwiseAdagrad(torch.optim.Optimizer):
    """FBGEMM's EXACT_ROWWISE_ADAGRAD on a sparse gradient: one accumulator per row, for
    each row r in the step's gradient g: a[r] += mean(g[r]^2); w[r] -= lr / (sqrt(a[r]) +
    eps) * g[r]. float32 throughout."""

    def __init__(self, params, lr, eps):
        super().__init__(params, {"lr": lr, "eps": eps})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for weight in group["params"]:
                if weight.grad is None:
                    continue
                grad = weight.grad.coalesce()
                rows, values = grad.indices()[0], grad.values()
                state = self.state[weight]
                if not state:
                    state["accumulator"] = torch.zeros(weight.shape[0], dtype=torch.float32)
                accumulator = state["accumulator"]
                accumulator[rows] += (values * values).sum(dim=1) / weight.shape[1]
                multiplier = group["lr"] / (accumulator[rows].sqrt() + group["eps"])
                weight[rows] -= multiplier.unsqueeze(1) * values
