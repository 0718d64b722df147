"""The Python package in real jobs: the scheduler, the servers and ps_worker running a
script (cluster.py), compared with one PyTorch process (agreement_model.train_reference)
to within 1e-5; a kill -9 of a server with replication 2; and bad use, each raising a
clear exception."""
import json
import os
import re
import time
import unittest

import numpy
import torch

import agreement_model as m
from cluster import Cluster, run_to_end, torch_job
from safetensors_io import load_safetensors

LR = 0.002
EPS = 1e-8
TABLE_LR = 0.01
# The agreement bound: one PyTorch process and the job add the same float32 numbers in
# other orders (the mean over workers, conv's reductions); over a few Adam steps that
# stays far below this.
TOLERANCE = 1e-5


def agreement_spec(servers, workers, steps, batch, folder, extra_args=(), **sections):
    spec = torch_job(servers, workers,
                     ["agreement_job.py", "--steps", str(steps), "--batch", str(batch)] +
                     list(extra_args),
                     training={"optimizer": {"learning_rate": LR, "epsilon": EPS},
                               "embedding_optimizer": {"type": "adam", "learning_rate": TABLE_LR,
                                                       "epsilon": EPS}},
                     output={"weights": os.path.join(folder, "final.safetensors")},
                     **sections)
    return spec


def max_difference(got, want):
    worst = 0.0
    for name, tensor in want.items():
        assert name in got, "output.weights lacks %s (has %s)" % (name, sorted(got))
        assert tuple(got[name].shape) == tuple(tensor.shape), name
        worst = max(worst, (got[name].double() - tensor.double()).abs().max().item())
    return worst


class Agreement(unittest.TestCase):
    def check_against_reference(self, servers, workers, shards):
        steps, batch = 8, 16
        with _TempFolder() as folder:
            spec = agreement_spec(servers, workers, steps, batch, folder)
            spec["cluster"]["shards"] = shards
            with Cluster(spec) as cluster:
                run_to_end(cluster)
                scheduler = cluster.log("scheduler")
            self.assertRegex(scheduler, r"final test_accuracy=0\.\d{4} samples_per_sec=\d+ "
                                        r"steps=%d" % steps)
            got = load_safetensors(os.path.join(folder, "final.safetensors"))
        want = m.train_reference(workers, steps, batch, LR, EPS)
        initial = m.seeded_cnn().state_dict()
        moved = max((want[n] - initial[n]).abs().max().item() for n in want)
        # Adam moves a weight by at most about LR a step.
        self.assertGreater(moved, steps * LR / 2, "training must move the weights for this to "
                                                  "mean much")
        difference = max_difference(got, want)
        print("%dx%d, %d shards: max |job - PyTorch| = %.3g over %d tensors (weights moved "
              "up to %.3g)" % (servers, workers, shards, difference, len(want), moved))
        self.assertLess(difference, TOLERANCE)

    def test_sync_1x1_matches_one_pytorch_process(self):
        self.check_against_reference(servers=1, workers=1, shards=1)

    def test_sync_2x2_matches_one_pytorch_process(self):
        self.check_against_reference(servers=2, workers=2, shards=3)

    def test_embedding_table_2x2_matches_pytorch(self):
        self.check_table_against_reference(2, 2, "sum")

    def test_mean_pooling_1x2_matches_embedding_bag_mean(self):
        self.check_table_against_reference(1, 2, "mean")

    def test_a_tables_own_optimizer_2x2_matches_rowwise_adagrad(self):
        # The spec's embedding_optimizer is SparseAdam; the table asks for row-wise Adagrad.
        self.check_table_against_reference(2, 2, "sum", rowwise_adagrad=(0.05, 1e-7))

    def test_async_tables_with_one_worker_match_pytorch(self):
        # training.embedding_mode async: the table's shards take each push as it comes. With
        # one worker that is the sync step (each row's update is that worker's gradient),
        # so the hybrid job must agree with PyTorch as the sync one does.
        self.check_table_against_reference(2, 1, "sum", async_tables=True)

    def check_table_against_reference(self, servers, workers, mode, rowwise_adagrad=None,
                                      async_tables=False):
        steps, batch = 8, 16
        with _TempFolder() as folder:
            rows_file = os.path.join(folder, "initial_rows.npy")
            extra = ["--table", "--table-rows", rows_file, "--table-mode", mode]
            if rowwise_adagrad is not None:
                lr, eps = rowwise_adagrad
                extra += ["--table-optimizer", json.dumps(
                    {"type": "rowwise_adagrad", "learning_rate": lr, "epsilon": eps})]
            spec = agreement_spec(servers, workers, steps, batch, folder, extra,
                                  cluster={"embedding_shards": 3})
            if async_tables:
                spec["training"]["embedding_mode"] = "async"
            with Cluster(spec) as cluster:
                run_to_end(cluster)
                if async_tables:
                    self.assertIn("mode sync (embedding tables async)", cluster.log("server-0"))
            got = load_safetensors(os.path.join(folder, "final.safetensors"))
            initial_rows = torch.from_numpy(numpy.load(rows_file))
        want = m.train_reference(workers, steps, batch, LR, EPS, table_rows=initial_rows,
                                 table_lr=TABLE_LR, table_mode=mode,
                                 table_rowwise_adagrad=rowwise_adagrad)
        ids = got.pop("items.ids")
        rows = got.pop("items.weight")
        self.assertGreater(len(ids), 0)
        table = want.pop("table.weight")
        self.assertEqual(rows.shape, (len(ids), m.TABLE_DIM))
        row_difference = (rows.double() - table[ids].double()).abs().max().item()
        dense_difference = max_difference(got, want)
        moved = (table - initial_rows).abs().max().item()
        print("embedding %dx%d, %s%s: max |job - PyTorch| = %.3g over %d rows, %.3g dense (rows "
              "moved up to %.3g)" % (servers, workers, mode,
                                     ", row-wise Adagrad" if rowwise_adagrad else "",
                                     row_difference, len(ids),
                                     dense_difference, moved))
        self.assertGreater(moved, TABLE_LR)
        self.assertLess(row_difference, TOLERANCE)
        self.assertLess(dense_difference, TOLERANCE)


class ByHand(unittest.TestCase):
    def test_a_script_started_by_hand_joins_and_agrees(self):
        # docs/PYTHON.md's "By hand": the script run directly with PARAMSERVER_CONFIG and
        # PARAMSERVER_WORKER_ARGS (here --scheduler and the job's token file), not by
        # ps_worker.
        steps, batch = 4, 16
        with _TempFolder() as folder:
            spec = agreement_spec(1, 2, steps, batch, folder)
            script = ["/usr/bin/python3", os.path.join(os.path.dirname(__file__),
                                                       "agreement_job.py"),
                      "--steps", str(steps), "--batch", str(batch)]
            with Cluster(spec) as cluster:
                statuses = cluster.start(by_hand=script).wait(180)
                self.assertEqual(set(statuses.values()), {0},
                                 "\n".join(cluster.log(n)[-2000:] for n in statuses))
            got = load_safetensors(os.path.join(folder, "final.safetensors"))
        self.assertLess(max_difference(got, m.train_reference(2, steps, batch, LR, EPS)),
                        TOLERANCE)


class Failover(unittest.TestCase):
    def test_kill9_of_a_server_changes_nothing(self):
        steps, batch = 40, 8
        weights = []
        for kill in (False, True):
            with _TempFolder() as folder:
                spec = agreement_spec(3, 2, steps, batch, folder,
                                      ["--step-delay", "0.05", "--progress",
                                       os.path.join(folder, "progress")],
                                      cluster={"replication": 2})
                with Cluster(spec) as cluster:
                    cluster.start()
                    if kill:
                        _wait_for_step(folder, 10)
                        cluster.kill9("server-1")
                    statuses = cluster.wait(240)
                    scheduler = cluster.log("scheduler")
                for name, status in statuses.items():
                    if name == "server-1" and kill:
                        self.assertEqual(status, -9)
                    else:
                        self.assertEqual(status, 0, "%s: %s" % (name, cluster.log(name)[-2000:]))
                if kill:
                    self.assertIn("promoted", scheduler)
                self.assertIn("steps=%d" % steps, scheduler)
                weights.append(load_safetensors(os.path.join(folder, "final.safetensors")))
        for name, tensor in weights[0].items():
            self.assertTrue(torch.equal(tensor, weights[1][name]),
                            "%s differs after the kill -9" % name)


class WholeClusterLoss(unittest.TestCase):
    """Every daemon and script of a torch job killed at once, then a new job with
    checkpoint.resume, on more servers and shards: it continues from the newest complete
    checkpoint, its model read from beside the checkpoints, and ends bit-identical to a
    job never killed. The script drops logits at random (--dropout), its masks seeded per
    step (job.seed_steps): without that the resumed job would draw other masks."""

    def test_a_torch_job_resumes_after_the_whole_cluster_is_lost(self):
        steps, batch = 40, 8
        dropout = ["--dropout", "0.3"]
        with _TempFolder() as reference_folder, _TempFolder() as folder:
            with Cluster(agreement_spec(2, 2, steps, batch, reference_folder,
                                        dropout)) as cluster:
                run_to_end(cluster)
            want = load_safetensors(os.path.join(reference_folder, "final.safetensors"))
            checkpoints = os.path.join(folder, "checkpoints")

            def spec(resume, extra_args=(), servers=2):
                job = agreement_spec(
                    servers, 2, steps, batch, folder,
                    ["--step-delay", "0.05", "--progress", os.path.join(folder, "progress")] +
                    dropout + list(extra_args),
                    checkpoint={"dir": checkpoints, "every_steps": 10, "resume": resume})
                job["cluster"]["shards"] = 2 * servers + 1
                return job

            with Cluster(spec(False)) as cluster:
                cluster.start()
                _wait_for_step(folder, 25)
                cluster.kill9_all()
            self.assertTrue(os.path.exists(os.path.join(checkpoints, "model.declaration")))
            self.assertFalse(os.path.exists(os.path.join(folder, "final.safetensors")))

            # Another model on those checkpoints is refused, naming the tensor.
            with Cluster(spec(True, ["--table"])) as cluster:
                self.assertNotEqual(cluster.start().wait_for_exit("worker-0", 120), 0)
                self.assertRegex(cluster.log("worker-0"),
                                 r"in the job's model \(declared by the job whose checkpoints "
                                 r"this one resumes\)")

            # Onto 3 servers and 7 shards where the lost job had 2 and 5.
            with Cluster(spec(True, servers=3)) as cluster:
                run_to_end(cluster)
                scheduler = cluster.log("scheduler")
            resumed = re.search(r"resuming from the checkpoint at step (\d+)", scheduler)
            self.assertIsNotNone(resumed, scheduler[-2000:])
            self.assertGreaterEqual(int(resumed.group(1)), 20)
            self.assertIn("steps=%d" % steps, scheduler)
            got = load_safetensors(os.path.join(folder, "final.safetensors"))
        for name, tensor in want.items():
            self.assertTrue(torch.equal(tensor, got[name]),
                            "%s differs after the whole cluster was lost and resumed" % name)

    def test_checkpoints_without_a_recorded_model_are_refused_at_start(self):
        with _TempFolder() as folder:
            checkpoints = os.path.join(folder, "checkpoints")
            os.makedirs(checkpoints)
            spec = agreement_spec(1, 1, 4, 8, folder,
                                  checkpoint={"dir": checkpoints, "every_steps": 2,
                                              "resume": True})
            with Cluster(spec) as cluster:
                with self.assertRaises(RuntimeError) as refused:
                    cluster.start()
            self.assertIn("checkpoint.resume: %s/model.declaration is missing" % checkpoints,
                          str(refused.exception))


def _wait_for_step(folder, step, timeout=120):
    """Waits until rank 0 of agreement_job.py (--progress FOLDER/progress) is at `step`."""
    marker = os.path.join(folder, "progress")
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with open(marker) as f:
                if int(f.read() or 0) >= step:
                    return
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    raise RuntimeError("rank 0 did not reach step %d in %d s" % (step, timeout))


class BadUse(unittest.TestCase):
    def read_cases(self, path):
        cases = {}
        with open(path) as f:
            for line in f:
                case, _, outcome = line.strip().partition(" ")
                cases[case] = outcome
        return cases

    def test_misuse_raises_clear_exceptions_and_training_goes_on(self):
        with _TempFolder() as folder:
            out = os.path.join(folder, "cases")
            # The script also spins for twice the failure timeout (2 s) holding the GIL:
            # its heartbeats come from the package's own thread and go on.
            spec = torch_job(1, 1, ["bad_use_job.py", out, "--steps", "3", "--busy-seconds",
                                    "4"])
            with Cluster(spec) as cluster:
                run_to_end(cluster)
                scheduler = cluster.log("scheduler")
            cases = self.read_cases(out + ".0")
        self.assertEqual(cases["step_before_register"],
                         "Error: job.step before job.register: register the model first "
                         "(job.register(model))")
        self.assertEqual(cases["finish_before_register"],
                         "Error: job.finish before job.register: nothing was trained")
        self.assertEqual(cases["register_float64"],
                         "TypeError: parameter '0.weight' is torch.float64: paramserver trains "
                         "float32 parameters (call model.float() first)")
        self.assertIn("TypeError: job.register takes an nn.Module or a list of (name, tensor) "
                      "pairs", cases["register_not_a_model"])
        self.assertEqual(cases["register"], "no exception")
        self.assertEqual(cases["register_twice"],
                         "Error: job.register was called already: a job trains one model")
        self.assertEqual(cases["embedding_after_register"],
                         "Error: paramserver.Embedding 'late' made after job.register: make every "
                         "table before registering the model")
        self.check_optimizer_refusals(cases)
        self.check_table_setting_refusals(cases)
        self.assertEqual(cases["finish_out_of_range"],
                         "ValueError: test_accuracy must be in [0, 1], got 1.5")
        self.assertEqual(cases["finish"], "no exception")
        self.assertEqual(cases["step_after_finish"], "Error: job.step after job.finish")
        self.assertIn("final test_accuracy=0.5000 samples_per_sec=", scheduler)
        self.assertNotIn("declared dead", scheduler)
        self.assertNotIn("has sent no heartbeat", scheduler)

    def check_table_setting_refusals(self, cases):
        self.assertEqual(cases["embedding_optimizer_not_a_dict"],
                         "TypeError: paramserver.Embedding 't1': optimizer must be a dict of "
                         "training.embedding_optimizer keys (e.g. {'type': 'ftrl', "
                         "'learning_rate': 0.1}), got str")
        self.assertEqual(cases["embedding_optimizer_unknown_type"],
                         "ValueError: paramserver.Embedding 't2': optimizer.type: must be adam, "
                         "adagrad, sgd, rowwise_adagrad or ftrl, got 'lion'")
        self.assertEqual(cases["embedding_optimizer_key_of_another_type"],
                         "ValueError: paramserver.Embedding 't3': optimizer.l1: is a setting of "
                         "ftrl only")
        self.assertEqual(cases["embedding_optimizer_bad_value"],
                         "ValueError: paramserver.Embedding 't4': optimizer.learning_rate_power: "
                         "must be a finite number <= 0 (as tf.keras.optimizers.Ftrl's)")
        self.assertEqual(cases["embedding_min_count_zero"],
                         "ValueError: paramserver.Embedding 't5': min_count: must be in [1, 10^6] "
                         "(1: a row at the first sighting)")
        self.assertEqual(cases["embedding_max_rows_text"],
                         "TypeError: paramserver.Embedding 't6': max_rows must be an int, got "
                         "'many'")

    def check_optimizer_refusals(self, cases):
        self.assertEqual(cases["optimizer_before_register"],
                         "Error: DistributedOptimizer before job.register: register the model "
                         "first (job.register(model))")
        self.assertEqual(cases["optimizer_unsupported"],
                         "TypeError: paramserver.DistributedOptimizer: Adadelta is not one the "
                         "servers run; they run torch.optim.SGD, torch.optim.Adam, "
                         "torch.optim.AdamW, torch.optim.Adagrad, torch.optim.RMSprop")
        self.assertEqual(cases["optimizer_other_type"],
                         "ValueError: the step's optimizer is 'sgd'; the servers keep the state "
                         "of adam (training.optimizer.type)")
        self.assertEqual(cases["optimizer_other_state"],
                         "ValueError: param_groups[0] keeps optimizer state (exp_avg, exp_avg_sq, "
                         "max_exp_avg_sq) where the servers keep (exp_avg, exp_avg_sq) for tensor "
                         "'0.weight', as training.optimizer sets it: a script's optimizer may "
                         "change its settings, not the state the servers keep (set the same "
                         "momentum, amsgrad, centered and initial_accumulator_value in the spec)")
        self.assertEqual(cases["optimizer_missing_tensor"],
                         "ValueError: registered parameters 2.weight, 2.bias in no param group: "
                         "give the optimizer every parameter job.register registered")
        self.assertEqual(cases["optimizer_foreign_tensor"],
                         "ValueError: param_groups[0] holds a tensor of shape (3,) that "
                         "job.register did not register: the servers train the registered "
                         "parameters only")
        self.assertEqual(cases["optimizer_clip_negative"],
                         "ValueError: DistributedOptimizer(clip_grad_norm=-1.0): it must be "
                         "finite and > 0")
        self.assertEqual(cases["optimizer_load_state_dict"], "no exception")
        self.assertEqual(cases["resume_schedule_plateau"],
                         "ValueError: DistributedOptimizer.resume_schedule: ReduceLROnPlateau's "
                         "rate depends on the losses, not on the step; save its state_dict and "
                         "load it when the job resumes")
        self.assertEqual(cases["resume_schedule_other_optimizer"],
                         "ValueError: DistributedOptimizer.resume_schedule: the scheduler was "
                         "made on another optimizer; make it on this DistributedOptimizer (or "
                         "the optimizer it wraps)")
        self.assertEqual(cases["seed_steps_not_int"],
                         "TypeError: job.seed_steps(seed): seed must be an int, got '7'")
        self.assertEqual(cases["data_position_zero"],
                         "ValueError: job.data_position: steps_per_epoch must be >= 1, got 0")
        self.assertEqual(cases["resume_schedule_every_zero"],
                         "ValueError: DistributedOptimizer.resume_schedule(every=0): it must be "
                         "an int >= 1 (optimizer steps per scheduler step)")
        self.assertEqual(cases["optimizer_negative_lr_step"],
                         "ValueError: the step's param_groups[0]'s lr is -0.5: it must be finite "
                         "and >= 0")

    def test_a_model_that_differs_is_refused_naming_the_tensor(self):
        with _TempFolder() as folder:
            out = os.path.join(folder, "cases")
            spec = torch_job(1, 2, ["bad_use_job.py", out, "--steps", "3",
                                    "--hidden-of-rank-1", "6"])
            with Cluster(spec) as cluster:
                statuses = cluster.start().wait(180)
            outcomes = [self.read_cases("%s.%d" % (out, rank))["register"] for rank in (0, 1)]
        # Whichever declared first placed its model; the other was told how it differs.
        refused = [o for o in outcomes if o != "no exception"]
        self.assertEqual(len(refused), 1, outcomes)
        self.assertRegex(refused[0],
                         r"^Error: tensor '0\.weight' has shape \[(6|8), 4\] here but \[(8|6), 4\] "
                         r"in the job's model \(declared by worker-[01]\)$")
        self.assertEqual(sorted(statuses[w] for w in ("worker-0", "worker-1")), [0, 3])

    def test_servers_gone_past_the_recovery_deadline_raise(self):
        with _TempFolder() as folder:
            # With checkpoints a server that joins could restore the lost shards, so the
            # scheduler waits for one (without, the job would end at once: nothing could
            # bring them back) and the worker's own deadline is what ends it.
            spec = torch_job(1, 1, ["agreement_job.py", "--steps", "100000", "--batch", "4",
                                    "--progress", os.path.join(folder, "progress")],
                             cluster={"recovery_timeout_ms": 4000},
                             checkpoint={"dir": os.path.join(folder, "checkpoints"),
                                         "every_steps": 1000})
            with Cluster(spec) as cluster:
                cluster.start()
                _wait_for_step(folder, 5)
                cluster.kill9("server-0")
                killed_at = time.time()
                status = cluster.wait_for_exit("worker-0", 120)
                waited = time.time() - killed_at
                log = cluster.log("worker-0")
        self.assertNotEqual(status, 0)
        self.assertIn("paramserver._native.Error: gave up after 4s of recovery at step", log)
        self.assertLess(waited, 60)


class Gpu(unittest.TestCase):
    @unittest.skipUnless(torch.cuda.is_available(), "no GPU on this machine")
    def test_parameters_on_a_gpu_agree_with_the_cpu(self):
        steps, batch = 8, 16
        with _TempFolder() as folder:
            spec = agreement_spec(1, 1, steps, batch, folder, ["--device", "cuda"])
            with Cluster(spec) as cluster:
                run_to_end(cluster)
            got = load_safetensors(os.path.join(folder, "final.safetensors"))
        want = m.train_reference(1, steps, batch, LR, EPS)
        # cuDNN's convolutions sum in other orders than the CPU's.
        self.assertLess(max_difference(got, want), 1e-4)


class _TempFolder:
    def __enter__(self):
        import tempfile
        self.folder = tempfile.mkdtemp(prefix="ps-python-", dir=os.environ.get("TEST_TMPDIR"))
        return self.folder

    def __exit__(self, *exc):
        import shutil
        shutil.rmtree(self.folder, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
