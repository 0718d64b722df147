"""Training recipes through paramserver.DistributedOptimizer in real jobs (scheduler,
servers, ps_worker running recipe_job.py), each compared with one PyTorch process that
replays the same batches under the same recipe (agreement_model.train_recipe_reference):
torch's optimizers, param groups and schedulers, sync and async; a kill -9 of a primary
mid-run (replication 2), bit for bit; and two workers whose settings for a step differ,
refused by name."""
import os
import re
import unittest

import torch

import agreement_model as m
from cluster import Cluster, torch_job
from cluster_test import TOLERANCE, _TempFolder, _wait_for_step, max_difference, run_to_end
from safetensors_io import load_safetensors

STEPS, BATCH = 10, 16


def recipe_spec(recipe, servers, workers, folder, mode="sync", extra_args=(), steps=STEPS,
                spec_clip=None):
    optimizer = dict(m.RECIPE_SPECS[recipe])
    if spec_clip is not None:
        optimizer["clip_grad_norm"] = spec_clip
    return torch_job(servers, workers,
                     ["recipe_job.py", "--recipe", recipe, "--steps", str(steps), "--batch",
                      str(BATCH)] + list(extra_args),
                     training={"mode": mode, "optimizer": optimizer},
                     output={"weights": os.path.join(folder, "final.safetensors")})


class RecipeAgreement(unittest.TestCase):
    def check_recipe(self, recipe, servers=1, workers=1, mode="sync", clip_grad_norm=None,
                     spec_clip=None, job_step=False):
        """`clip_grad_norm`: DistributedOptimizer's; `spec_clip`: the spec's
        training.optimizer.clip_grad_norm; `job_step`: the script trains with job.step."""
        extra = [] if clip_grad_norm is None else ["--clip-grad-norm", str(clip_grad_norm)]
        extra += ["--job-step"] if job_step else []
        with _TempFolder() as folder:
            spec = recipe_spec(recipe, servers, workers, folder, mode, extra, spec_clip=spec_clip)
            with Cluster(spec) as cluster:
                run_to_end(cluster)
            got = load_safetensors(os.path.join(folder, "final.safetensors"))
        clip = clip_grad_norm if clip_grad_norm is not None else spec_clip
        want, clipped = m.train_recipe_reference(recipe, workers, STEPS, BATCH, clip)
        initial = m.seeded_cnn().state_dict()
        moved = max((want[n] - initial[n]).abs().max().item() for n in want)
        difference = max_difference(got, want)
        print("%s %dx%d %s%s: max |job - PyTorch| = %.3g (weights moved up to %.3g)" % (
            recipe, servers, workers, mode,
            ("" if clip is None else ", clipped %d of %d steps" % (clipped, STEPS)) +
            (", job.step" if job_step else ""),
            difference, moved))
        self.assertGreater(moved, 100 * TOLERANCE, "the recipe must move the weights")
        self.assertLess(difference, TOLERANCE)
        return clipped

    def test_adamw_onecycle_two_groups_sync_2x2(self):
        self.check_recipe("adamw_onecycle", servers=2, workers=2)

    def test_sgd_nesterov_step_schedule_two_rates_sync_2x2(self):
        self.check_recipe("sgd_step", servers=2, workers=2)

    def test_rmsprop_centered_reduce_on_plateau_sync_1x1(self):
        self.check_recipe("rmsprop_plateau")

    def test_adagrad_lambda_sync_1x1(self):
        self.check_recipe("adagrad_lambda")

    def test_adam_amsgrad_exponential_sync_1x2(self):
        self.check_recipe("adam_amsgrad_exponential", workers=2)

    def test_sync_2x2_clips_the_mean_gradient_as_one_process_after_averaging(self):
        clipped = self.check_recipe("adamw_onecycle", servers=2, workers=2, clip_grad_norm=0.4)
        self.assertTrue(0 < clipped < STEPS, "clipping must act on some steps and not others")

    def test_spec_clip_grad_norm_clips_job_step_and_the_wrapped_optimizer(self):
        """training.optimizer.clip_grad_norm: job.step clips with it (sync 2x2: the mean
        gradient, on the servers; async 1x1: each push, on the worker), and so does a
        DistributedOptimizer given no clip_grad_norm of its own."""
        for job_step in (True, False):
            clipped = self.check_recipe("sgd_constant", servers=2, workers=2, spec_clip=0.4,
                                        job_step=job_step)
            self.assertTrue(0 < clipped < STEPS, clipped)
        clipped = self.check_recipe("sgd_constant", mode="async", spec_clip=0.5, job_step=True)
        self.assertTrue(0 < clipped < STEPS, clipped)

    def test_async_1x1_each_push_is_one_update(self):
        self.check_recipe("sgd_step", mode="async")
        clipped = self.check_recipe("adamw_onecycle", mode="async", clip_grad_norm=0.5)
        self.assertTrue(0 < clipped < STEPS, "clipping must act on some steps and not others")


class Failover(unittest.TestCase):
    def test_kill9_of_a_primary_under_a_script_schedule_changes_nothing(self):
        """Replication 2, sync, SGD with momentum under CosineAnnealingLR, the mean
        gradient clipped to 0.5 (on 6 of the 30 steps): the replicas hold each step's
        settings and its scaled mean, so the promoted backups go on bit for bit."""
        steps = 30
        weights = []
        for kill in (False, True):
            with _TempFolder() as folder:
                spec = recipe_spec("sgd_cosine", 3, 2, folder, steps=steps,
                                   extra_args=["--step-delay", "0.05", "--progress",
                                               os.path.join(folder, "progress"),
                                               "--clip-grad-norm", "0.5"])
                spec["cluster"]["replication"] = 2
                with Cluster(spec) as cluster:
                    cluster.start()
                    if kill:
                        _wait_for_step(folder, 10)
                        cluster.kill9("server-1")
                    statuses = cluster.wait(240)
                    scheduler = cluster.log("scheduler")
                for name, status in statuses.items():
                    want = -9 if kill and name == "server-1" else 0
                    self.assertEqual(status, want, "%s: %s" % (name, cluster.log(name)[-2000:]))
                if kill:
                    self.assertIn("promoted", scheduler)
                weights.append(load_safetensors(os.path.join(folder, "final.safetensors")))
        for name, tensor in weights[0].items():
            self.assertTrue(torch.equal(tensor, weights[1][name]),
                            "%s differs after the kill -9" % name)
        want, clipped = m.train_recipe_reference("sgd_cosine", 2, steps, BATCH, 0.5)
        self.assertTrue(0 < clipped < steps, clipped)
        self.assertLess(max_difference(weights[1], want), TOLERANCE)


    def test_a_script_schedule_resumes_after_the_whole_cluster_is_lost(self):
        """Sync 2x2, AdamW in two groups under OneCycleLR: every daemon and script killed
        at once past step 15, then a new job with checkpoint.resume whose script brings
        its scheduler to job.step_number (DistributedOptimizer.resume_schedule): the
        servers restore AdamW's moments and update count, the script the schedule, and
        the weights equal a job never killed, bit for bit."""
        steps = 30
        with _TempFolder() as reference_folder, _TempFolder() as folder:
            with Cluster(recipe_spec("adamw_onecycle", 2, 2, reference_folder,
                                     steps=steps)) as cluster:
                run_to_end(cluster)
            want = load_safetensors(os.path.join(reference_folder, "final.safetensors"))

            def spec(resume):
                job = recipe_spec("adamw_onecycle", 2, 2, folder, steps=steps,
                                  extra_args=["--step-delay", "0.05", "--progress",
                                              os.path.join(folder, "progress")])
                job["checkpoint"] = {"dir": os.path.join(folder, "checkpoints"),
                                     "every_steps": 5, "resume": resume}
                return job

            with Cluster(spec(False)) as cluster:
                cluster.start()
                _wait_for_step(folder, 17)
                cluster.kill9_all()
            with Cluster(spec(True)) as cluster:
                run_to_end(cluster)
                scheduler = cluster.log("scheduler")
            resumed = re.search(r"resuming from the checkpoint at step (\d+)", scheduler)
            self.assertIsNotNone(resumed, scheduler[-2000:])
            self.assertGreaterEqual(int(resumed.group(1)), 15)
            got = load_safetensors(os.path.join(folder, "final.safetensors"))
        for name, tensor in want.items():
            self.assertTrue(torch.equal(tensor, got[name]),
                            "%s differs after the whole cluster was lost and resumed" % name)


class LossScaling(unittest.TestCase):
    def test_steps_one_worker_overflows_are_skipped_on_every_server(self):
        """Sync 2x2, AdamW under OneCycleLR with GradScaler's protocol: worker 1 overflows
        at steps 2 and 5 only; every server skips exactly those, and the weights equal one
        process that skips them (AdamW's bias corrections counting the updates made)."""
        skipped = (2, 5)
        with _TempFolder() as folder:
            spec = recipe_spec("adamw_onecycle", 2, 2, folder,
                               extra_args=["--rank-1-overflows-at", "2,5"])
            with Cluster(spec) as cluster:
                run_to_end(cluster)
                servers = [cluster.log("server-%d" % i) for i in (0, 1)]
            got = load_safetensors(os.path.join(folder, "final.safetensors"))
        for log in servers:
            lines = re.findall(r"shard \d+: (\d+) updates applied, .* (\d+) steps skipped", log)
            self.assertTrue(lines, log[-2000:])
            for applied, skips in lines:
                self.assertEqual((int(applied), int(skips)), (STEPS, len(skipped)))
        want, _ = m.train_recipe_reference("adamw_onecycle", 2, STEPS, BATCH, skipped=skipped)
        unskipped, _ = m.train_recipe_reference("adamw_onecycle", 2, STEPS, BATCH)
        self.assertGreater(max_difference(unskipped, want), 100 * TOLERANCE,
                           "skipping the steps must change the weights for this to mean much")
        difference = max_difference(got, want)
        print("loss scaling, steps %s skipped: max |job - PyTorch| = %.3g (the skips move "
              "the weights by %.3g)" % (skipped, difference, max_difference(unskipped, want)))
        self.assertLess(difference, TOLERANCE)

    @unittest.skipUnless(torch.cuda.is_available(), "no GPU on this machine")
    def test_torch_grad_scaler_on_a_gpu_skips_the_same_steps(self):
        skipped = (2, 5)
        with _TempFolder() as folder:
            spec = recipe_spec("adamw_onecycle", 1, 2, folder,
                               extra_args=["--rank-1-overflows-at", "2,5", "--torch-grad-scaler",
                                           "--device", "cuda"])
            with Cluster(spec) as cluster:
                run_to_end(cluster)
                server = cluster.log("server-0")
            got = load_safetensors(os.path.join(folder, "final.safetensors"))
        self.assertRegex(server, r"%d updates applied, .* %d steps skipped" % (STEPS, len(skipped)))
        want, _ = m.train_recipe_reference("adamw_onecycle", 2, STEPS, BATCH, skipped=skipped)
        # cuDNN's convolutions sum in other orders than the CPU's.
        self.assertLess(max_difference(got, want), 1e-4)


class Mismatch(unittest.TestCase):
    def test_two_workers_different_rates_for_one_step_are_refused_by_name(self):
        with _TempFolder() as folder:
            out = os.path.join(folder, "error")
            spec = recipe_spec("sgd_step", 1, 2, folder,
                               extra_args=["--rank-1-lr-at", "3", "--out", out])
            with Cluster(spec) as cluster:
                cluster.start()
                statuses = {w: cluster.wait_for_exit(w, 180) for w in ("worker-0", "worker-1")}
            errors = []
            for rank in (0, 1):
                with open("%s.%d" % (out, rank)) as f:
                    errors.append(f.read().strip())
        self.assertEqual(statuses["worker-0"], 1, errors)
        self.assertEqual(statuses["worker-1"], 1, errors)
        # StepLR halves 0.05 at step 3: worker 1 doubled it to 0.05, the other has 0.025.
        # The worker that pushed first hears of it in its pull, which names the server.
        pattern = (r"^step 3: (?:(?:push|pull) shard 0 on ps-0 \(127\.0\.0\.1:\d+\): )?"
                   r"shard 0, sync step 3: workers ([01]) and ([01]) pushed it with "
                   r"different optimizer settings \(group 0's lr: (0\.025|0\.05) and "
                   r"(0\.025|0\.05)\): in sync mode every worker's optimizer must hold the same "
                   r"param_groups settings at each step; the step is not applied$")
        for error in errors:
            self.assertRegex(error, pattern)
            first, second, lr1, lr2 = re.match(pattern, error).groups()
            self.assertNotEqual(first, second)
            self.assertEqual({lr1, lr2}, {"0.025", "0.05"})


if __name__ == "__main__":
    unittest.main()
