"""job.batches() in a real async torch job: a worker killed -9 in the middle of a lease
(it stops itself after a known batch: PS_TEST_STOP_AFTER_BATCHES) and another joining in
its place, and every example of every epoch is trained exactly once (the test-only log
of each acknowledged batch's examples, PS_TEST_TRAINED_IDS_LOG); misuse raises."""
import collections
import os
import signal
import time
import unittest

from cluster import BINARIES, Cluster, torch_job

EXAMPLES, BATCH, EPOCHS, CHUNK = 2000, 10, 2, 5
# Each step paced (paced_script.py), so that the job is still training when the worker
# that joins has started (a torch import takes seconds): 400 steps of 2 workers, ~8 s.
PACE_SECONDS = "0.04"
VICTIM_BATCHES = 7  # two batches into its second lease


def stopped_process_in_group(pgid):
    """The pid of a stopped (state T) process in process group `pgid`, or None."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if fields[0] == "T" and int(fields[2]) == pgid:
            return int(entry)
    return None


def read_trained(path):
    trained = collections.defaultdict(collections.Counter)
    with open(path) as f:
        for line in f:
            fields = [int(x) for x in line.split()]
            trained[fields[0]].update(fields[1:])
    return trained


class DynamicData(unittest.TestCase):
    def test_every_example_once_with_a_worker_killed_mid_lease(self):
        here = os.path.dirname(os.path.abspath(__file__))
        spec = torch_job(2, 2, ["paced_script.py", os.path.join(here, "leased_job.py"), "--examples",
                                str(EXAMPLES), "--batch", str(BATCH)],
                         training={"mode": "async", "epochs": EPOCHS, "shuffle": True},
                         data={"chunk_batches": CHUNK})
        with Cluster(spec) as cluster:
            trained_log = os.path.join(cluster.dir, "trained.log")
            cluster.start(worker_env={"PS_TEST_TRAINED_IDS_LOG": trained_log,
                                      "PACE_SECONDS": PACE_SECONDS},
                          worker_env_for={0: {"PS_TEST_STOP_AFTER_BATCHES": str(VICTIM_BATCHES)}})
            victim = cluster.processes["worker-0"]
            deadline = time.time() + 120
            while stopped_process_in_group(victim.pid) is None:
                self.assertLess(time.time(), deadline, cluster.log("worker-0"))
                self.assertIsNone(victim.poll(), cluster.log("worker-0"))
                time.sleep(0.05)
            os.killpg(victim.pid, signal.SIGKILL)
            cluster.wait_for_log("scheduler", " lost", timeout=60)
            env = dict(os.environ, PS_TEST_TRAINED_IDS_LOG=trained_log, PACE_SECONDS=PACE_SECONDS)
            env["PYTHONPATH"] = os.path.dirname(os.path.abspath(__file__))
            cluster._start("worker-joined", [BINARIES["worker"], "--config", cluster.spec_path,
                                             "--scheduler", cluster.scheduler_address,
                                             "--listen", "127.0.0.1:0"], env=env)
            statuses = cluster.wait(timeout=240)
            scheduler = cluster.log("scheduler")
            self.assertIn("leased_job: trained", cluster.log("worker-joined"))
            for name, status in statuses.items():
                if name != "worker-0":
                    self.assertEqual(status, 0, "%s:\n%s" % (name, cluster.log(name)[-3000:]))
            self.assertIn("2 of its %d batches are trained; the rest goes to the next worker"
                          % CHUNK, scheduler)
            trained = read_trained(trained_log)
        self.assertEqual(sorted(trained), list(range(EPOCHS)))
        for epoch, counts in trained.items():
            self.assertEqual(sorted(counts), list(range(EXAMPLES)), "epoch %d" % epoch)
            twice = [example for example, count in counts.items() if count != 1]
            self.assertEqual(twice, [], "epoch %d: trained more than once" % epoch)

    def test_batches_in_a_sync_job_are_refused(self):
        spec = torch_job(1, 1, ["leased_job.py", "--examples", "100", "--batch", "10"])
        with Cluster(spec) as cluster:
            status = cluster.start().wait_for_exit("worker-0", timeout=120)
            worker = cluster.log("worker-0")
        self.assertNotEqual(status, 0)
        self.assertIn("data leases are for training.mode async; this job trains sync", worker)


if __name__ == "__main__":
    unittest.main()
