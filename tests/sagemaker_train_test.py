#!/usr/bin/python3
"""`paramserver train` (SageMaker's contract) without a container: what it reads from
/opt/ml (deploy/container/sagemaker_contract.py, on folders of the test's own), the spec
it writes, where each host's daemons listen, and how it supervises them
(deploy/container/sagemaker_train.py's supervise, with small shell processes standing in
for the daemons). tests/commands/container_test.sh runs the whole contract in three
containers with the real daemons.

Run by Bazel (//tests:sagemaker_train_test); prints Catch2's summary line
(tests/python/runner.py) so that tests/run.sh counts each case.
"""
import json
import os
import shutil
import sys
import tempfile
import threading
import unittest

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "deploy/container"))
import sagemaker_contract as contract  # noqa: E402
import sagemaker_train as train  # noqa: E402

NUMBERS = {"servers_per_host": 1, "workers_per_host": 1, "scheduler_port": 7070, "server_port": 7100,
           "worker_port": 8100}


class MlFolder(unittest.TestCase):
    """A fresh /opt/ml of the test's own."""

    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="sagemaker-train-test.")
        self.addCleanup(shutil.rmtree, self.root)
        self.paths = contract.MlPaths(self.root)
        for folder in ("input/config", "input/data/config", "input/data/secrets"):
            os.makedirs(os.path.join(self.root, folder))

    def write(self, relative, text):
        path = os.path.join(self.root, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as file:
            file.write(text)
        return path

    def write_json(self, relative, value):
        return self.write(relative, json.dumps(value))


class ResourceConfigTest(MlFolder):
    def test_current_host_and_hosts_in_order(self):
        self.write_json("input/config/resourceconfig.json",
                        {"current_host": "algo-2", "hosts": ["algo-1", "algo-2", "algo-3"],
                         "network_interface_name": "eth0"})
        self.assertEqual(contract.read_hosts(self.paths), ("algo-2", ["algo-1", "algo-2", "algo-3"]))

    def test_bad_files_are_named(self):
        with self.assertRaisesRegex(contract.BadInput, "resourceconfig.json is missing"):
            contract.read_hosts(self.paths)
        for config, message in [
                ({"current_host": "algo-4", "hosts": ["algo-1"]}, "current_host 'algo-4' is not one of hosts"),
                ({"current_host": "algo-1", "hosts": []}, "hosts must be a non-empty list"),
                ({"current_host": "algo-1", "hosts": ["algo-1", "algo-1"]}, "names a host twice"),
                ({"current_host": "a b", "hosts": ["a b"]}, "'a b' is not a host name"),
                (["algo-1"], "not a JSON object")]:
            self.write_json("input/config/resourceconfig.json", config)
            with self.assertRaisesRegex(contract.BadInput, message):
                contract.read_hosts(self.paths)
        self.write("input/config/resourceconfig.json", "{")
        with self.assertRaisesRegex(contract.BadInput, "resourceconfig.json: Expecting"):
            contract.read_hosts(self.paths)


class HyperparametersTest(MlFolder):
    def test_defaults_without_the_file(self):
        self.assertEqual(contract.read_hyperparameters(self.paths), ("", NUMBERS))

    def test_plain_and_json_quoted_values_and_sagemakers_own_keys(self):
        self.write_json("input/config/hyperparameters.json",
                        {"servers_per_host": "2", "workers_per_host": "\"4\"", "spec": "\"/job/x.yaml\"",
                         "sagemaker_region": "\"eu-west-1\"", "_tuning_objective_metric": "loss"})
        spec, numbers = contract.read_hyperparameters(self.paths)
        self.assertEqual(spec, "/job/x.yaml")
        self.assertEqual((numbers["servers_per_host"], numbers["workers_per_host"]), (2, 4))

    def test_refusals_name_the_key(self):
        for given, message in [({"epochs": "3"}, "unknown hyperparameter 'epochs'"),
                               ({"servers_per_host": "0"}, "servers_per_host: 0 is outside \\[1, 64\\]"),
                               ({"workers_per_host": "two"}, "workers_per_host: 'two' is not a whole number"),
                               ({"server_port": "70000"}, "server_port: 70000 is outside"),
                               ({"servers_per_host": True}, "servers_per_host: True is not a string")]:
            self.write_json("input/config/hyperparameters.json", given)
            with self.assertRaisesRegex(contract.BadInput, message):
                contract.read_hyperparameters(self.paths)


class LayoutTest(unittest.TestCase):
    def test_ports_of_each_host(self):
        layout = contract.Layout.of(["algo-1", "algo-2", "algo-3"], dict(NUMBERS, servers_per_host=2))
        self.assertEqual((layout.servers, layout.workers, layout.scheduler), (6, 3, "algo-1:7070"))
        self.assertEqual(layout.server_ports("algo-2"), [7102, 7103])
        self.assertEqual(layout.worker_ports("algo-3"), [8102])

    def test_overlapping_or_too_high_ports_are_refused(self):
        hosts = [f"algo-{i}" for i in range(1, 21)]
        with self.assertRaisesRegex(contract.BadInput, "server_port \\(7100..8379\\) and worker_port"):
            contract.Layout.of(hosts, dict(NUMBERS, servers_per_host=64))
        with self.assertRaisesRegex(contract.BadInput, "scheduler_port \\(7100..7100\\) and server_port"):
            contract.Layout.of(hosts, dict(NUMBERS, scheduler_port=7100))
        with self.assertRaisesRegex(contract.BadInput, "worker_port: ports 65530..65549 run past 65535"):
            contract.Layout.of(hosts, dict(NUMBERS, worker_port=65530))

    def test_daemon_commands(self):
        layout = contract.Layout.of(["algo-1", "algo-2"], dict(NUMBERS, workers_per_host=2))
        first = dict(contract.daemon_commands(layout, "algo-1", "/w/c.yaml", "/w/s.state", "/bin", gpus=0))
        self.assertEqual(sorted(first), ["scheduler", "server-0", "worker-0", "worker-1"])
        self.assertEqual(first["scheduler"], ["/bin/ps_scheduler", "--config", "/w/c.yaml", "--listen", "0.0.0.0:7070",
                                              "--state_file", "/w/s.state"])
        second = dict(contract.daemon_commands(layout, "algo-2", "/w/c.yaml", "/w/s.state", "/bin", gpus=2))
        self.assertNotIn("scheduler", second)
        self.assertEqual(second["server-0"][-4:], ["--listen", "0.0.0.0:7101", "--advertise", "algo-2:7101"])
        self.assertEqual(second["worker-1"][-6:], ["--listen", "0.0.0.0:8103", "--advertise", "algo-2:8103",
                                                   "--device", "gpu:1"])
        one_gpu = dict(contract.daemon_commands(layout, "algo-2", "/w/c.yaml", "/w/s.state", "/bin", gpus=1))
        self.assertNotIn("--device", one_gpu["worker-1"])


SPEC = """\
cluster: {scheduler: 127.0.0.1:0, servers: 2, workers: 2, replication: 2}
model: {type: mlp, layers: [784, 128, 10], init_from: init.safetensors}
training:
  optimizer: {type: adam, learning_rate: 1.0e-3, epsilon: 1e-7}
  odd_text: [on, 0755, "1:30", ""]
data:
  train_images: ../train/train-images.gz
  train_labels: /opt/ml/input/data/train/labels.gz
  test_images: s3://bucket/t10k-images.gz
  test_labels: ~/t10k-labels.gz
  sharding: fixed
output: {weights: final.safetensors, tensorboard_dir: tb}
security: {tls: {ca: ca.pem, cert: node.pem, key: node.key}}
"""


class EffectiveSpecTest(MlFolder):
    def effective(self, text, layout=None):
        spec_path = self.write("input/data/config/job.yaml", text)
        self.write("input/data/config/train.py", "print()\n")
        layout = layout or contract.Layout.of(["algo-1", "algo-2", "algo-3"], NUMBERS)
        spec = contract.effective_spec(self.paths, spec_path, layout, "/w/cluster-token", "")
        written = contract.write_spec(spec, spec_path, os.path.join(self.root, "work/spec"))
        with open(written, encoding="utf-8") as file:
            text = file.read()
        return yaml.load(text, Loader=yaml.BaseLoader), text, written

    def test_what_train_sets_and_what_it_keeps(self):
        spec, text, written = self.effective(SPEC)
        config = os.path.join(self.root, "input/data/config")
        self.assertEqual(spec["cluster"], {"scheduler": "algo-1:7070", "servers": "3", "workers": "3",
                                           "replication": "2"})
        self.assertEqual(spec["checkpoint"], {"dir": self.paths.checkpoints})
        self.assertEqual(spec["output"], {"weights": os.path.join(self.root, "model/weights.safetensors"),
                                          "tensorboard_dir": os.path.join(self.root, "output/tensorboard"),
                                          "report": os.path.join(self.root, "output/data/report.html")})
        self.assertEqual(spec["security"]["cluster_token_file"], "/w/cluster-token")
        self.assertEqual(spec["security"]["tls"]["ca"], os.path.join(config, "ca.pem"))
        self.assertEqual(spec["model"]["init_from"], os.path.join(config, "init.safetensors"))
        # Relative paths resolve against the spec's own folder, as the daemons would have
        # resolved them there; absolute, s3:// and ~/ paths are kept.
        self.assertEqual(spec["data"]["train_images"], os.path.join(config, "../train/train-images.gz"))
        self.assertEqual(spec["data"]["train_labels"], "/opt/ml/input/data/train/labels.gz")
        self.assertEqual(spec["data"]["test_images"], "s3://bucket/t10k-images.gz")
        self.assertEqual(spec["data"]["test_labels"], "~/t10k-labels.gz")
        # Every other scalar reaches the daemons' YAML parser as the same text.
        self.assertIn("learning_rate: 1.0e-3", text)
        self.assertIn("epsilon: 1e-7", text)
        self.assertIn("- on\n", text)
        self.assertIn("- 0755\n", text)
        self.assertIn("- 1:30\n", text)
        self.assertIn('- ""\n', text)
        self.assertEqual(spec["training"]["odd_text"], ["on", "0755", "1:30", ""])
        # Beside it, the spec folder's other files (a torch job's script runs there).
        self.assertEqual(os.readlink(os.path.join(os.path.dirname(written), "train.py")),
                         os.path.join(config, "train.py"))

    def test_resume_when_sagemaker_put_checkpoints_back(self):
        self.assertNotIn("resume", self.effective(SPEC)[0]["checkpoint"])
        self.write("checkpoints/shard-0-step-100.ckpt", "")
        self.assertEqual(self.effective(SPEC)[0]["checkpoint"]["resume"], "true")

    def test_a_torch_scripts_data_is_its_own(self):
        spec, _, _ = self.effective("model: {type: torch}\ndata: {train: rel/x.csv}\n")
        self.assertEqual(spec["data"], {"train": "rel/x.csv"})

    def test_bad_specs_are_named(self):
        with self.assertRaisesRegex(contract.BadInput, "not a YAML mapping"):
            self.effective("- a\n")
        with self.assertRaisesRegex(contract.BadInput, "cluster must be a mapping"):
            self.effective("cluster: [1]\n")
        with self.assertRaisesRegex(contract.BadInput, "job.yaml: while parsing"):
            self.effective("cluster: {a: [}\n")

    def test_the_config_channels_one_yaml_file(self):
        with self.assertRaisesRegex(contract.BadInput, "holds 0"):
            contract.find_spec(self.paths, "")
        path = self.write("input/data/config/job.yml", SPEC)
        self.assertEqual(contract.find_spec(self.paths, ""), path)
        self.write("input/data/config/other.yaml", SPEC)
        with self.assertRaisesRegex(contract.BadInput, "holds 2"):
            contract.find_spec(self.paths, "")
        self.assertEqual(contract.find_spec(self.paths, path), path)
        with self.assertRaisesRegex(contract.BadInput, "spec: /nowhere.yaml is not a file"):
            contract.find_spec(self.paths, "/nowhere.yaml")


class SuperviseTest(unittest.TestCase):
    """supervise() over shell processes standing in for the daemons."""

    def setUp(self):
        self.work = tempfile.mkdtemp(prefix="sagemaker-supervise-test.")
        self.addCleanup(shutil.rmtree, self.work)
        self.saved_work_dir = train.WORK_DIR
        train.WORK_DIR = self.work
        self.addCleanup(setattr, train, "WORK_DIR", self.saved_work_dir)
        self.stop = threading.Event()

    def daemon(self, name, script):
        return train.Daemon(name, ["/bin/sh", "-c", script], drop_privileges=False)

    def test_a_finished_job(self):
        daemons = [self.daemon("scheduler", "sleep 0.3"), self.daemon("server-0", "echo 'the scheduler reports the "
                                                                               "job finished'; sleep 0.5"),
                   self.daemon("worker-0", "exit 0")]
        self.assertEqual(train.supervise(daemons, self.stop), (0, ""))

    def test_a_dead_worker_is_started_again(self):
        once = os.path.join(self.work, "died-once")
        daemons = [self.daemon("worker-0", f"if [ -e {once} ]; then exit 0; fi; touch {once}; kill -9 $$")]
        self.assertEqual(train.supervise(daemons, self.stop), (0, ""))
        self.assertEqual(len(daemons[0].starts), 2)

    def test_five_deaths_a_minute_end_it(self):
        daemons = [self.daemon("server-0", "exit 1")]
        status, failure = train.supervise(daemons, self.stop)
        self.assertEqual((status, failure), (1, "server-0 exited 1, 5 times within a minute"))

    def test_a_drained_server_is_not_the_jobs_end(self):
        daemons = [self.daemon("server-0", "exit 0")]
        self.assertEqual(train.supervise(daemons, self.stop),
                         (1, "every daemon of this host ended, none of them with the job finished"))

    def test_a_refused_spec_is_a_bad_input_and_not_restarted(self):
        daemons = [self.daemon("scheduler", "exit 2"), self.daemon("worker-0", "exit 0")]
        self.assertEqual(train.supervise(daemons, self.stop), (2, "scheduler on this host exited 2"))
        self.assertEqual(len(daemons[0].starts), 1)

    def test_sigterm_stops_every_daemon(self):
        daemons = [self.daemon("server-0", "trap 'exit 143' TERM; while :; do sleep 0.1; done"),
                   self.daemon("worker-0", "sleep 30")]
        threading.Timer(0.5, self.stop.set).start()
        self.assertEqual(train.supervise(daemons, self.stop),
                         (1, "stopped by SIGTERM (StopTrainingJob) before the job finished"))
        self.assertEqual([d.final_status for d in daemons], [143, -15])

    def test_a_stop_after_the_job_finished_is_fine(self):
        daemons = [self.daemon("worker-0", "exit 0"),
                   self.daemon("server-0", "trap 'exit 143' TERM; while :; do sleep 0.1; done")]
        threading.Timer(1.0, self.stop.set).start()
        self.assertEqual(train.supervise(daemons, self.stop), (0, ""))
        self.assertEqual(daemons[1].final_status, 143)


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(ROOT, "tests/python"))
    import runner  # noqa: E402  (tests/python/runner.py: Catch2's summary line)
    sys.exit(runner.main(["__main__"]))
