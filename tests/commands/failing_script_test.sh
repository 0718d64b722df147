#!/usr/bin/env bash
# `deploy/local/run.sh CONFIG` as a user types it, for a PyTorch job whose script raises
# on every worker: the job ends within 10 s of the last worker's exit, with exit 1 and
# the script's exception as its last line, not after a silent wait. With --restart the
# launcher brings the workers back (the scheduler says meanwhile that the job waits for
# one), and ends the job the same way once it stops restarting them.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# The CNN example's job, its script replaced by one that fails once it has registered.
# A failure timeout of 1 s makes the launcher restart a worker 3 s after it failed, so
# that five lives fit in its minute on a slow machine too.
mkdir -p "$WORK/job"
sed 's/^  shards: .*/&\n  failure_timeout_ms: 1000/' "$ROOT/examples/pytorch_cnn/job.yaml" >"$WORK/job/job.yaml"
cat >"$WORK/job/train.py" <<'SCRIPT'
import paramserver

job = paramserver.init()
job.no_such_method()
SCRIPT

# workers_gone RUN_DIR SECONDS: until both workers' processes have exited.
workers_gone() {
  local deadline=$((SECONDS + $2)) pid
  for name in worker-0 worker-1; do
    wait_for_line "$1/$name.log" "registered with the scheduler" "$2" || return 1
    pid=$(cat "$1/$name.pid")
    while kill -0 "$pid" 2>/dev/null; do ((SECONDS < deadline)) || return 1; sleep 0.1; done
  done
}

echo "a script that raises on both workers, no --restart"
launch "$WORK/plain" "$WORK/job/job.yaml"
check "both workers ran the script and exited" workers_gone "$WORK/plain" 300
wait_launcher 10
check "the launcher ended within 10 s of the last worker's exit, with exit 1" test "$LAUNCHER_STATUS" -eq 1
check "its last line is the script's exception" \
  grep -q "^AttributeError: 'Job' object has no attribute 'no_such_method'$" <(last_line "$WORK/plain.out")
check "it said why the job ended" \
  grep -q "run.sh: the job did not finish: every worker failed. worker-[01]'s last line:" "$WORK/plain.out"
check "the first failure left the job to the other worker" \
  grep -q "failed (exit 1); the cluster carries on without it (--restart would bring it back)" "$WORK/plain.out"
check "the second ended it" \
  grep -q "failed (exit 1); no worker is left and none will be restarted: the job cannot finish" "$WORK/plain.out"
check "no daemon is left" bash -c "for f in '$WORK'/plain/*.pid; do ! kill -0 \$(cat \$f) 2>/dev/null || exit 1; done"

echo "the same script with --restart: the workers come back until the launcher stops restarting them"
launch "$WORK/restart" --restart "$WORK/job/job.yaml"
wait_launcher 300
check "the launcher exits 1" test "$LAUNCHER_STATUS" -eq 1
check "its last line is the script's exception" \
  grep -q "^AttributeError: 'Job' object has no attribute 'no_such_method'$" <(last_line "$WORK/restart.out")
check "the workers were restarted" grep -q "run.sh: worker-[01] (pid [0-9]*) failed (exit 1); restarting it in 3 s" "$WORK/restart.out"
check "until their 5th failure in a minute" \
  grep -q "its 5th time in a minute: not restarting it; no worker is left and none will be restarted" "$WORK/restart.out"
check "meanwhile the scheduler said the job waits for a worker, and how long it will" \
  grep -q "no worker is alive: the job waits for one to join ([0-9]* s so far; it gives up at 1800 s, cluster.no_worker_timeout_ms)" \
  "$WORK/restart/scheduler.log"

finish
