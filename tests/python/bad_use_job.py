"""A job's script that misuses the package before training properly, for cluster_test:
each misuse must raise a clear exception (never crash or hang). Writes one line per case
to the file given, "<case> <ExceptionType>: <message>", then trains --steps steps.

  bad_use_job.py OUT --steps K [--hidden-of-rank-1 N] [--busy-seconds S]

With --busy-seconds the script spins in pure Python (holding the GIL) for S seconds
after registering: the package's heartbeats must go on meanwhile.
"""
import argparse
import sys
import time

import torch

import paramserver


def record(out, case, call):
    try:
        call()
        out.write("%s no exception\n" % case)
    except Exception as error:  # the test reads the type and the message
        out.write("%s %s: %s\n" % (case, type(error).__name__, str(error).replace("\n", " ")))
    out.flush()


def misuse_optimizers(out, job, model):
    """DistributedOptimizer's refusals (the spec's optimizer: adam, sync, no groups)."""
    wrap = paramserver.DistributedOptimizer
    params = list(model.parameters())
    record(out, "optimizer_unsupported", lambda: wrap(torch.optim.Adadelta(params), job))
    record(out, "optimizer_other_type", lambda: wrap(torch.optim.SGD(params, lr=0.1), job))
    record(out, "optimizer_other_state",
           lambda: wrap(torch.optim.Adam(params, amsgrad=True), job))
    record(out, "optimizer_missing_tensor",
           lambda: wrap(torch.optim.Adam(model[0].parameters()), job))
    stranger = torch.zeros(3, requires_grad=True)
    record(out, "optimizer_foreign_tensor",
           lambda: wrap(torch.optim.Adam(params + [stranger]), job))
    record(out, "optimizer_clip_negative",
           lambda: wrap(torch.optim.Adam(params), job, clip_grad_norm=-1))
    optimizer = wrap(torch.optim.Adam(params), job)
    optimizer.param_groups[0]["lr"] = -0.5
    model.zero_grad()
    model(torch.randn(2, 4)).sum().backward()
    record(out, "optimizer_negative_lr_step", optimizer.step)
    saved = optimizer.state_dict()
    saved["param_groups"][0]["lr"] = 0.002
    optimizer.load_state_dict(saved)

    def shares_the_loaded_groups():
        if optimizer.param_groups is not optimizer.optimizer.param_groups:
            raise AssertionError("the wrapper's groups are not the wrapped optimizer's")
        if optimizer._settings()[1][0][3][0] != 0.002:
            raise AssertionError("the next step would not send the loaded lr")
    record(out, "optimizer_load_state_dict", shares_the_loaded_groups)
    schedulers = torch.optim.lr_scheduler
    record(out, "resume_schedule_plateau",
           lambda: optimizer.resume_schedule(schedulers.ReduceLROnPlateau(optimizer)))
    record(out, "resume_schedule_other_optimizer", lambda: optimizer.resume_schedule(
        schedulers.StepLR(torch.optim.Adam(params), step_size=2)))
    record(out, "resume_schedule_every_zero", lambda: optimizer.resume_schedule(
        schedulers.StepLR(optimizer, step_size=2), every=0))
    record(out, "seed_steps_not_int", lambda: job.seed_steps("7"))
    record(out, "data_position_zero", lambda: job.data_position(0))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--hidden-of-rank-1", type=int, default=8)
    parser.add_argument("--busy-seconds", type=float, default=0.0)
    args = parser.parse_args()
    job = paramserver.init()
    out = open("%s.%d" % (args.out, job.rank), "w")
    torch.manual_seed(5)
    hidden = args.hidden_of_rank_1 if job.rank == 1 else 8
    model = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, 2))
    record(out, "step_before_register", lambda: job.step(model))
    record(out, "finish_before_register", lambda: job.finish())
    record(out, "optimizer_before_register", lambda: paramserver.DistributedOptimizer(
        torch.optim.Adam(model.parameters()), job))
    embedding = paramserver.Embedding
    record(out, "embedding_optimizer_not_a_dict",
           lambda: embedding(job, "t1", 4, optimizer="ftrl"))
    record(out, "embedding_optimizer_unknown_type",
           lambda: embedding(job, "t2", 4, optimizer={"type": "lion"}))
    record(out, "embedding_optimizer_key_of_another_type",
           lambda: embedding(job, "t3", 4, optimizer={"type": "sgd", "l1": 0.1}))
    record(out, "embedding_optimizer_bad_value",
           lambda: embedding(job, "t4", 4, optimizer={"type": "ftrl", "learning_rate_power": 1}))
    record(out, "embedding_min_count_zero", lambda: embedding(job, "t5", 4, min_count=0))
    record(out, "embedding_max_rows_text", lambda: embedding(job, "t6", 4, max_rows="many"))
    record(out, "register_float64", lambda: job.register(model.double()))
    model.float()
    record(out, "register_not_a_model", lambda: job.register([("w", 3)]))
    record(out, "register", lambda: job.register(model))
    if job._params is None:  # this worker's model is not the job's: nothing to train
        out.close()
        return 3
    busy_until = time.time() + args.busy_seconds
    spins = 0
    while time.time() < busy_until:  # the script's own work, never yielding the GIL
        spins += 1
    record(out, "register_twice", lambda: job.register(model))
    record(out, "embedding_after_register", lambda: paramserver.Embedding(job, "late", 4))
    misuse_optimizers(out, job, model)
    x = torch.randn(16, 4)
    for _ in range(args.steps):
        model.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        model[0].bias.grad = None  # a parameter without a gradient pushes zeros
        job.step(model, loss=loss)
    record(out, "finish_out_of_range", lambda: job.finish(test_accuracy=1.5))
    record(out, "finish", lambda: job.finish(test_accuracy=0.5))
    record(out, "step_after_finish", lambda: job.step(model))
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
