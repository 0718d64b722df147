#!/usr/bin/env bash
# Runs a whole cluster on this machine: the scheduler, the servers and the workers of
# CONFIG as separate processes on 127.0.0.1, streaming their logs, and ends with
#   final test_accuracy=0.XXXX samples_per_sec=N steps=N
# Usage: deploy/local/run.sh [CONFIG]   (default: deploy/local/fashion_mnist.yaml)
# Exits non-zero if any daemon failed. Every process it started is gone when it exits.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CONFIG=$(realpath "${1:-$ROOT/deploy/local/fashion_mnist.yaml}")
RUN_DIR=${PS_RUN_DIR:-$(mktemp -d /tmp/ps-run.XXXXXX)}
mkdir -p "$RUN_DIR"

"$ROOT/deploy/install_deps.sh"
(cd "$ROOT" && bazel build -c opt --noshow_progress //scheduler:ps_scheduler //ps:ps_server //worker:ps_worker) >&2
BIN="$ROOT/bazel-bin"

# Validates the config and reads the cluster's size.
describe=$("$BIN/scheduler/ps_scheduler" --config "$CONFIG" --describe)
read -r scheduler_kv servers_kv workers_kv <<<"$describe"
scheduler_address=${scheduler_kv#scheduler=}
servers=${servers_kv#servers=}
workers=${workers_kv#workers=}

pids=()
tail_pid=""
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if [[ -n $tail_pid ]]; then kill "$tail_pid" 2>/dev/null || true; wait "$tail_pid" 2>/dev/null || true; fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A fresh cluster token for this job (used unless the config names its own in
# security.cluster_token_file): only this job's daemons, and psctl given the file, get in.
TOKEN_FILE="$RUN_DIR/cluster.token"
(umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$TOKEN_FILE")
echo "logs: $RUN_DIR" >&2
: >"$RUN_DIR/scheduler.log"
"$BIN/scheduler/ps_scheduler" --config "$CONFIG" --listen "$scheduler_address" \
  --cluster_token_file "$TOKEN_FILE" --port_file "$RUN_DIR/scheduler.port" >"$RUN_DIR/scheduler.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [[ -s $RUN_DIR/scheduler.port ]] && break; sleep 0.1; done
if [[ ! -s $RUN_DIR/scheduler.port ]]; then
  echo "run.sh: the scheduler did not start; see $RUN_DIR/scheduler.log" >&2
  cat "$RUN_DIR/scheduler.log" >&2
  exit 1
fi
scheduler="${scheduler_address%:*}:$(cat "$RUN_DIR/scheduler.port")"
echo "scheduler: $scheduler (PSCTL_CLUSTER_TOKEN_FILE=$TOKEN_FILE psctl --scheduler $scheduler status)" >&2

for i in $(seq 0 $((servers - 1))); do
  : >"$RUN_DIR/server-$i.log"
  "$BIN/ps/ps_server" --config "$CONFIG" --scheduler "$scheduler" --listen 127.0.0.1:0 \
    --cluster_token_file "$TOKEN_FILE" \
    >"$RUN_DIR/server-$i.log" 2>&1 &
  pids+=($!)
done
for i in $(seq 0 $((workers - 1))); do
  : >"$RUN_DIR/worker-$i.log"
  "$BIN/worker/ps_worker" --config "$CONFIG" --scheduler "$scheduler" --listen 127.0.0.1:0 \
    --cluster_token_file "$TOKEN_FILE" \
    >"$RUN_DIR/worker-$i.log" 2>&1 &
  pids+=($!)
done
tail -q -n +1 -F "$RUN_DIR"/*.log 2>/dev/null &
tail_pid=$!

# Wait for every daemon; the first failure stops the rest.
failed=0
live=("${pids[@]}")
while ((${#live[@]} > 0)); do
  exited=""
  if wait -n -p exited "${live[@]}"; then
    still=()
    for pid in "${live[@]}"; do [[ $pid == "$exited" ]] || still+=("$pid"); done
    live=("${still[@]}")
  else
    failed=1
    echo "run.sh: a daemon (pid $exited) failed; stopping the cluster (logs in $RUN_DIR)" >&2
    break
  fi
done
sleep 0.3  # let tail print the last lines
final=$(grep -ho "final test_accuracy=[0-9.]* samples_per_sec=[0-9]* steps=[0-9]*" "$RUN_DIR/scheduler.log" || true)
if ((!failed)) && [[ -z $final ]] && grep -q "shutdown of the whole job requested" "$RUN_DIR/scheduler.log"; then
  kill "$tail_pid" 2>/dev/null || true
  echo "run.sh: an operator shut the job down (psctl shutdown); logs in $RUN_DIR" >&2
  exit 0
fi
if ((failed)) || [[ -z $final ]]; then
  echo "run.sh: the job did not finish; logs in $RUN_DIR" >&2
  exit 1
fi
kill "$tail_pid" 2>/dev/null || true
wait "$tail_pid" 2>/dev/null || true
tail_pid=""
echo "$final"
