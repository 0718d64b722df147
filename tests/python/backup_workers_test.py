"""Backup workers in a real sync torch job (training.sync.backup_workers: 1 of 3): one
worker sleeps 1 s before every 10th of its steps. Every step completes without waiting
for it; its late pushes are dropped and counted by the servers, its job.step_number jumps
to the servers' step, the job finishes and the model learns."""
import re
import unittest

from cluster import Cluster, torch_job

STEPS = 300


class BackupWorkers(unittest.TestCase):
    def test_a_straggler_does_not_pace_the_steps(self):
        spec = torch_job(2, 3, ["straggler_job.py", "--steps", str(STEPS)],
                         training={"mode": "sync", "sync": {"backup_workers": 1},
                                   "optimizer": {"type": "sgd", "learning_rate": 0.05}})
        with Cluster(spec) as cluster:
            cluster.start(worker_env={"PYTHONUNBUFFERED": "1"},
                          worker_env_for={2: {"SLOW_SECONDS": "1.0", "SLOW_EVERY": "10"}})
            statuses = cluster.wait(timeout=240)
            for name, status in statuses.items():
                self.assertEqual(status, 0, "%s:\n%s" % (name, cluster.log(name)[-3000:]))
            late = sum(int(n) for s in range(2)
                       for n in re.findall(r"(\d+) late pushes dropped", cluster.log("server-%d" % s)))
            straggler = cluster.log("worker-2")
            others = [cluster.log("worker-%d" % w) for w in range(2)]
        self.assertGreater(late, 0)
        ran = re.search(r"straggler_job: (\d+) steps run, longest jump (\d+), loss ([0-9.]+) before, "
                        r"([0-9.]+) after", straggler)
        self.assertIsNotNone(ran, straggler[-3000:])
        steps_run, longest_jump = int(ran.group(1)), int(ran.group(2))
        # Its 1 s sleeps were not waited for: the others went on, and it jumped past them.
        self.assertGreater(longest_jump, 5, straggler[-3000:])
        self.assertLess(steps_run, STEPS)
        for log in others:
            fast = re.search(r"straggler_job: \d+ steps run, longest jump \d+, loss ([0-9.]+) before, "
                             r"([0-9.]+) after", log)
            self.assertIsNotNone(fast, log[-3000:])
            self.assertLess(float(fast.group(2)), 0.1 * float(fast.group(1)))


if __name__ == "__main__":
    unittest.main()
