# Helpers for the tests that run README commands exactly as a user types them. Sourced.
# Every launcher a test starts runs in a process group of its own, ended (and waited
# for) when the test exits, pass or fail.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
WORK=$(mktemp -d /tmp/ps-command-test.XXXXXX)
STARTED_GROUPS=()
FAILURES=0
FAILED_CHECKS=()

end_started() {
  for group in "${STARTED_GROUPS[@]}"; do kill -TERM -- "-$group" 2>/dev/null || true; done
  for group in "${STARTED_GROUPS[@]}"; do
    for _ in $(seq 100); do kill -0 -- "-$group" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$group" 2>/dev/null || true
  done
  # PS_KEEP_TEST_DIR=1 keeps the runs' logs for a look afterwards.
  if [[ ${PS_KEEP_TEST_DIR:-} == 1 ]]; then echo "(kept $WORK)"; else rm -rf "$WORK"; fi
}
trap end_started EXIT

# check DESCRIPTION COMMAND...: runs COMMAND; a failure is reported and counted.
check() {
  local what=$1
  shift
  if "$@"; then
    echo "  ok: $what"
  else
    echo "  FAILED: $what"
    FAILURES=$((FAILURES + 1))
    FAILED_CHECKS+=("$what")
  fi
}

# The Fashion-MNIST job with KEY=VALUE edits of the reference config, into FILE.
# Edits: "replication N", "epochs N", "weights PATH", "recovery MS", "checkpoint DIR".
write_config() {
  local file=$1
  shift
  sed -e 's/shuffle: true/shuffle: false/' "$ROOT/deploy/local/fashion_mnist.yaml" >"$file"
  while (($#)); do
    case "$1" in
      replication) sed -i "s/^  failure_timeout_ms: .*/&\n  replication: $2/" "$file" ;;
      epochs) sed -i "s/^  epochs: .*/  epochs: $2/" "$file" ;;
      weights) sed -i "s|^  weights: .*|  weights: $2|" "$file" ;;
      recovery) sed -i "s/^  failure_timeout_ms: .*/&\n  recovery_timeout_ms: $2/" "$file" ;;
    esac
    shift 2
  done
}

# launch RUN_DIR ARGS...: starts `deploy/local/run.sh ARGS` (as the README has it) in a
# process group of its own, its output in RUN_DIR.out; sets LAUNCHER_PID.
launch() { launch_script "$ROOT/deploy/local/run.sh" "$@"; }

# launch_script SCRIPT RUN_DIR ARGS...: the same for another launcher (deploy/container/run.sh).
launch_script() {
  local script=$1 run_dir=$2
  shift 2
  mkdir -p "$run_dir"
  # With job control on, the launcher gets a process group of its own and, unlike a
  # plain background job, may receive SIGINT (Ctrl-C), as from a terminal. `env
  # --default-signal=INT` undoes an ignored SIGINT inherited from whatever started this
  # test (a shell that put it in the background, nohup): bash cannot trap a signal that
  # was ignored when it started, and a user's terminal never ignores Ctrl-C.
  set -m
  PS_RUN_DIR=$run_dir env --default-signal=INT "$script" "$@" >"$run_dir.out" 2>&1 &
  LAUNCHER_PID=$!
  set +m
  STARTED_GROUPS+=("$LAUNCHER_PID")
}

# wait_launcher SECONDS: waits for the launcher to end; sets LAUNCHER_STATUS (124: it
# did not end in time, and was ended).
wait_launcher() {
  local deadline=$((SECONDS + $1))
  while kill -0 "$LAUNCHER_PID" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
  if kill -0 "$LAUNCHER_PID" 2>/dev/null; then
    kill -TERM -- "-$LAUNCHER_PID" 2>/dev/null
    wait "$LAUNCHER_PID" 2>/dev/null
    LAUNCHER_STATUS=124
  else
    wait "$LAUNCHER_PID"
    LAUNCHER_STATUS=$?
  fi
}

# wait_for_line FILE PATTERN SECONDS: until FILE has a line matching PATTERN (grep -E).
wait_for_line() {
  local deadline=$((SECONDS + $3))
  until grep -Eq "$2" "$1" 2>/dev/null; do
    ((SECONDS < deadline)) || return 1
    sleep 0.1
  done
}

# wait_until COMMAND SECONDS: until COMMAND (a function or program, no arguments) succeeds.
wait_until() {
  local deadline=$((SECONDS + $2))
  until "$1"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.5
  done
}

# kill9 RUN_DIR NAME: kill -9 the daemon's live process, by the pid file the launcher keeps.
kill9() {
  local pid
  pid=$(cat "$1/$2.pid")
  echo "  kill -9 $2 (pid $pid)"
  kill -KILL "$pid"
}

last_line() { tail -n 1 "$1"; }

# node_name RUN_DIR DAEMON: the node name the scheduler gave the launcher's daemon
# (server-1 is not necessarily ps-1: names follow the order of registration).
node_name() { grep -Eo "\[(ps|worker)-[0-9]+\]" "$1/$2.log" | head -n 1 | tr -d '[]'; }

# daemon_named RUN_DIR NODE: the launcher's daemon (server-N, worker-N) the scheduler
# named NODE (ps-0, worker-0).
daemon_named() {
  local log
  for log in "$1"/server-*.log "$1"/worker-*.log; do
    if [[ $(node_name "$1" "$(basename "$log" .log)") == "$2" ]]; then basename "$log" .log; return; fi
  done
}

finish() {
  if ((FAILURES > 0)); then
    echo "$(basename "$0"): $FAILURES check(s) failed; the launchers' output:"
    for out in "$WORK"/*.out; do [[ -f $out ]] && { echo "--- $out"; tail -n 30 "$out"; }; done
    # The scheduler's view of each run, whose launcher output may end before the cause.
    for log in "$WORK"/*/scheduler.log; do
      [[ -f $log ]] && { echo "--- $log"; grep -Ev "\] info: (epoch [0-9]+ step|step [0-9]+)" "$log" | tail -n 40; }
    done
    # Last, where tests/run.sh's tail of this output shows them: the checks that failed.
    local failed
    for failed in "${FAILED_CHECKS[@]}"; do echo "$(basename "$0"): FAILED check: $failed"; done
    exit 1
  fi
  echo "$(basename "$0"): passed"
}
