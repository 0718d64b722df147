"""Runs a job's script (argv[1], with argv[2:] as its arguments) unchanged but paced: each
paramserver.DistributedOptimizer.step, and job.step, sleeps PACE_SECONDS first, so that a
test can kill the whole cluster mid-run without racing a job that would end in a second."""
import os
import runpy
import sys
import time

import paramserver

PACE_SECONDS = float(os.environ.get("PACE_SECONDS", "0.1"))


def _paced(step):
    def paced_step(*args, **kwargs):
        time.sleep(PACE_SECONDS)
        return step(*args, **kwargs)
    return paced_step


paramserver.DistributedOptimizer.step = _paced(paramserver.DistributedOptimizer.step)
paramserver.Job.step = _paced(paramserver.Job.step)
script = sys.argv[1]
sys.argv = sys.argv[1:]
os.chdir(os.path.dirname(os.path.abspath(script)))
runpy.run_path(script, run_name="__main__")
