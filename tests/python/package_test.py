"""The Python package without a cluster: a script started outside a job, or for a job
that is not a torch one, gets a paramserver.Error that says what to do; the package's
argument checks raise before anything travels."""
import os
import subprocess
import tempfile
import unittest

import paramserver

PYTHON = "/usr/bin/python3"


def run_script(code, env_updates):
    env = dict(os.environ)
    env.pop("PARAMSERVER_CONFIG", None)
    env.pop("PARAMSERVER_WORKER_ARGS", None)
    env.update(env_updates)
    return subprocess.run([PYTHON, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60)


JOIN = """
import paramserver
try:
    paramserver.init()
except paramserver.Error as error:
    print("CODE", error.code)
    print("MESSAGE", error)
"""


def join_with_spec(spec_text, env_updates=None):
    """paramserver.init() in a fresh interpreter with PARAMSERVER_CONFIG naming a spec of
    `spec_text` (and `env_updates`)."""
    with tempfile.TemporaryDirectory() as folder:
        spec = os.path.join(folder, "job.yaml")
        with open(spec, "w") as f:
            f.write(spec_text)
        return run_script(JOIN, dict(env_updates or {}, PARAMSERVER_CONFIG=spec))


class OutsideAJob(unittest.TestCase):
    def test_init_without_a_job_says_how_to_start_one(self):
        result = run_script(JOIN, {})
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("CODE FAILED_PRECONDITION", result.stdout)
        self.assertIn("this script was not started for a job: PARAMSERVER_CONFIG is not set",
                      result.stdout)
        self.assertIn("deploy/local/run.sh job.yaml", result.stdout)

    def test_init_for_a_builtin_model_is_refused(self):
        result = join_with_spec("cluster: {scheduler: '127.0.0.1:1'}\n")
        self.assertIn("CODE FAILED_PRECONDITION", result.stdout)
        self.assertIn("model.type is mlp: ps_worker trains that model itself", result.stdout)

    def test_a_bad_spec_names_its_key(self):
        result = join_with_spec("cluster: {scheduler: '127.0.0.1:1'}\nmodel: {type: torch}\n")
        self.assertIn("worker.command: model.type torch needs the command each worker runs",
                      result.stdout)

    def test_unknown_worker_flags_are_an_error_not_an_exit(self):
        result = join_with_spec("cluster: {scheduler: '127.0.0.1:1'}\nmodel: {type: torch}\n"
                                "worker: {command: [python3, x.py]}\n",
                                {"PARAMSERVER_WORKER_ARGS": "--no_such_flag=1"})
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("PARAMSERVER_WORKER_ARGS: '--no_such_flag=1' is not a ps_worker flag",
                      result.stdout)

    def test_error_is_a_runtime_error(self):
        self.assertTrue(issubclass(paramserver.Error, RuntimeError))


class ArgumentChecks(unittest.TestCase):
    def test_embedding_needs_a_job(self):
        with self.assertRaisesRegex(TypeError, "job comes from paramserver.init"):
            paramserver.Embedding(None, "items", 4)

    def test_embedding_mode_is_embedding_bags(self):
        with self.assertRaisesRegex(ValueError, "mode='avg'\\): mode must be 'sum', 'mean' or "
                                                "'max', as nn.EmbeddingBag's"):
            paramserver.Embedding(None, "items", 4, mode="avg")


if __name__ == "__main__":
    unittest.main()
