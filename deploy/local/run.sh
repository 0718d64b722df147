#!/usr/bin/env bash
# Runs a whole cluster on this machine: the scheduler, the servers and the workers of
# CONFIG as separate processes on 127.0.0.1, streaming their logs, and ends with the
# job's final line:
#   final test_accuracy=0.XXXX samples_per_sec=N steps=N
# (a ctr model's: final test_auc=0.XXXX test_logloss=0.XXXX samples_per_sec=N steps=N; a
# torch script's that reports no accuracy: final samples_per_sec=N steps=N)
#
# Usage: deploy/local/run.sh [--restart] [--status-port PORT] [--metrics] [CONFIG]
#   CONFIG           the cluster spec (default: deploy/local/fashion_mnist.yaml)
#   --restart        restart a server or worker that dies, as systemd's
#                    Restart=on-failure does on EC2: it comes back and rejoins. At most 5
#                    restarts of one daemon a minute.
#   --status-port P  the scheduler serves its status page, /api/status and /metrics on
#                    http://127.0.0.1:P/ (0: a free port, printed)
#   --metrics        every server and worker serves /metrics on a free port (in its log)
#
# The scheduler is restarted whatever the flags, as its EC2 unit is: it comes back on its
# port and takes the job over from its state file (at most 5 starts a minute).
#
# It supervises; it is not a tripwire. A daemon that dies is logged and the cluster
# recovers as it would on EC2 (replicas take over, the scheduler re-shards). The launcher
# ends when the job ends: it exits 0 with the final line when the job finished, whatever
# died on the way (also when the scheduler was lost for good and rank 0 finished training
# and wrote the weights without it: its line is the last); 1 when it did not finish; 130
# on Ctrl-C. It stops everything at once
# when a daemon cannot start at all (a bad config: exit 2, or a bad data file: its error),
# and when its last worker has failed and will not be restarted (exit 1, the worker's
# last line last: a script's exception).
#
# $PS_RUN_DIR (default: a new /tmp/ps-run.XXXXXX) holds each daemon's log
# (scheduler.log, server-N.log, worker-N.log, appended to across restarts), its pid file
# (NAME.pid, the live process), cluster.token and scheduler.state; and the set-up's
# output (install.log, apt-get's, when packages were missing; build.log, Bazel's): the
# terminal gets one line a step, and the file's name and last lines if it fails. Every
# process it started is gone when it exits.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
RESTART=0
STATUS_PORT=""
METRICS=0
CONFIG_ARG=""
while (($#)); do
  case "$1" in
    --restart) RESTART=1; shift ;;
    --status-port) STATUS_PORT=${2:?--status-port needs a port}; shift 2 ;;
    --metrics) METRICS=1; shift ;;
    -h|--help) sed -n '2,/^set -euo pipefail$/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) [[ -z $CONFIG_ARG ]] || { echo "run.sh: one CONFIG only" >&2; exit 2; }; CONFIG_ARG=$1; shift ;;
  esac
done
CONFIG=$(realpath "${CONFIG_ARG:-$ROOT/deploy/local/fashion_mnist.yaml}")
RUN_DIR=${PS_RUN_DIR:-$(mktemp -d /tmp/ps-run.XXXXXX)}
# Owner-only, as is every file in it: its logs name the job's members, its token
# admits a process to the job (docs/SECURITY.md says what each file gives its reader).
(umask 077 && mkdir -p "$RUN_DIR")
chmod 700 "$RUN_DIR"

say() { echo "run.sh: $*" >&2; }

# One line a step on the terminal; apt-get's and Bazel's own output in the run folder,
# named (with its last lines) should the step fail.
"$ROOT/deploy/install_deps.sh" --log "$RUN_DIR/install.log"
say "building the daemons with Bazel (from an empty cache about 10 minutes on 2 cores; its output: $RUN_DIR/build.log)"
if ! (cd "$ROOT" && bazel build -c opt --noshow_progress //scheduler:ps_scheduler //ps:ps_server //worker:ps_worker \
  //psctl:psctl //tools:ps_ctr_generate) >"$RUN_DIR/build.log" 2>&1 </dev/null; then
  say "the build failed; its whole output is in $RUN_DIR/build.log, which ends:"
  tail -n 25 "$RUN_DIR/build.log" | sed 's/^/  /' >&2
  exit 1
fi
BIN="$ROOT/bazel-bin"


# Validates the config and reads the cluster's size.
if ! describe=$("$BIN/scheduler/ps_scheduler" --config "$CONFIG" --describe); then exit 2; fi
read -r scheduler_kv servers_kv workers_kv failure_timeout_kv <<<"$describe"
scheduler_address=${scheduler_kv#scheduler=}
servers=${servers_kv#servers=}
workers=${workers_kv#workers=}
# A restarted server or worker waits until the scheduler has declared the dead one dead
# (its slot is kept for it until then), as RestartSec does on EC2.
restart_delay_s=$(( ${failure_timeout_kv#failure_timeout_ms=} / 1000 + 2 ))

declare -A name_of=()     # live pid -> daemon name
declare -A started_at=()  # daemon name -> the start times (epoch s) of its last minute
declare -A restart_at=()  # daemon name -> when (epoch s) to restart it
tail_pid=""
tick_pid=""

# The generated CTR data (deploy/local/ctr.yaml) is written on first use.
CTR_DEMO="$HOME/.cache/paramserver/ctr-demo"
if grep -q "~/.cache/paramserver/ctr-demo/" "$CONFIG" &&
   ! [[ -s $CTR_DEMO/train.tsv.gz && -s $CTR_DEMO/test.tsv.gz ]]; then
  say "writing the generated CTR data into $CTR_DEMO (once)"
  mkdir -p "$CTR_DEMO.part.$$"
  if ! "$BIN/tools/ps_ctr_generate" --out "$CTR_DEMO.part.$$" >"$RUN_DIR/ctr-generate.log" 2>&1; then
    say "writing the CTR data failed; its output is in $RUN_DIR/ctr-generate.log:"
    tail -n 10 "$RUN_DIR/ctr-generate.log" | sed 's/^/  /' >&2
    rm -rf "$CTR_DEMO.part.$$"
    exit 1
  fi
  rm -rf "$CTR_DEMO" && mv "$CTR_DEMO.part.$$" "$CTR_DEMO"
fi

cleanup() {
  local status=$?
  trap - EXIT INT TERM
  local pids=("${!name_of[@]}")
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  for pid in $tail_pid $tick_pid; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  exit "$status"
}
trap cleanup EXIT
trap 'say "stopped by the user (Ctrl-C); stopping the cluster (logs in $RUN_DIR)"; exit 130' INT
trap 'say "stopped (SIGTERM); stopping the cluster (logs in $RUN_DIR)"; exit 143' TERM

# A fresh cluster token for this job (used unless the config names its own in
# security.cluster_token_file): only this job's daemons, and psctl given the file, get in.
TOKEN_FILE="$RUN_DIR/cluster.token"
(umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$TOKEN_FILE")
STATE_FILE="$RUN_DIR/scheduler.state"
rm -f "$STATE_FILE" "$RUN_DIR/scheduler.port"  # a new job: nothing to take over
echo "logs: $RUN_DIR" >&2

scheduler_listen=$scheduler_address  # port 0 until the first start has bound one
scheduler=""

# Starts daemon NAME (scheduler, server-N, worker-N), appending to its log.
start_daemon() {
  local name=$1 command=()
  case "$name" in
    scheduler)
      command=("$BIN/scheduler/ps_scheduler" --config "$CONFIG" --listen "$scheduler_listen"
               --state_file "$STATE_FILE" --port_file "$RUN_DIR/scheduler.port"
               --report_file "$RUN_DIR/report.html")
      if [[ -n $STATUS_PORT ]]; then command+=(--metrics_port "$STATUS_PORT"); fi ;;
    server-*) command=("$BIN/ps/ps_server" --config "$CONFIG" --scheduler "$scheduler" --listen 127.0.0.1:0) ;;
    worker-*) command=("$BIN/worker/ps_worker" --config "$CONFIG" --scheduler "$scheduler" --listen 127.0.0.1:0) ;;
  esac
  command+=(--cluster_token_file "$TOKEN_FILE")
  if ((METRICS)) && [[ $name != scheduler ]]; then command+=(--metrics_port 0); fi
  "${command[@]}" >>"$RUN_DIR/$name.log" 2>&1 &
  local pid=$!
  name_of[$pid]=$name
  echo "$pid" >"$RUN_DIR/$name.pid"
  started_at[$name]="${started_at[$name]:-} $(date +%s)"
}

# Whether NAME's log shows it started up (so that a failure is not a start-up error).
started_up() {
  case "$1" in
    scheduler) grep -q "serving on port" "$RUN_DIR/$1.log" ;;
    *) grep -q "registered with the scheduler" "$RUN_DIR/$1.log" ;;
  esac
}

job_finished() { grep -Eq "final (test_(accuracy|auc)=|samples_per_sec=)" "$RUN_DIR/scheduler.log" 2>/dev/null; }
shutdown_requested() { grep -q "shutdown of the whole job requested" "$RUN_DIR/scheduler.log" 2>/dev/null; }

: >"$RUN_DIR/scheduler.log"
start_daemon scheduler
for _ in $(seq 100); do [[ -s $RUN_DIR/scheduler.port ]] && break; sleep 0.1; done
if [[ ! -s $RUN_DIR/scheduler.port ]]; then
  say "the scheduler did not start; see $RUN_DIR/scheduler.log"
  cat "$RUN_DIR/scheduler.log" >&2
  exit 1
fi
scheduler="${scheduler_address%:*}:$(cat "$RUN_DIR/scheduler.port")"
scheduler_listen=$scheduler  # a restarted scheduler comes back where the nodes dial
if [[ $STATUS_PORT == 0 ]]; then
  for _ in $(seq 50); do grep -q "status page on" "$RUN_DIR/scheduler.log" && break; sleep 0.1; done
  STATUS_PORT=$(grep -o "status page on http[s]*://[^ ]*" "$RUN_DIR/scheduler.log" | head -n 1 | sed -E 's/.*:([0-9]+)\/$/\1/')
fi
echo "scheduler: $scheduler (PSCTL_CLUSTER_TOKEN_FILE=$TOKEN_FILE $BIN/psctl/psctl --scheduler $scheduler status)" >&2
if [[ -n $STATUS_PORT ]]; then echo "status page: http://127.0.0.1:$STATUS_PORT/ (metrics: /metrics)" >&2; fi

for i in $(seq 0 $((servers - 1))); do : >"$RUN_DIR/server-$i.log"; start_daemon "server-$i"; done
for i in $(seq 0 $((workers - 1))); do : >"$RUN_DIR/worker-$i.log"; start_daemon "worker-$i"; done
# The daemons' logs (not the set-up's: install.log, build.log).
tail -q -n +1 -F "$RUN_DIR"/scheduler.log "$RUN_DIR"/server-*.log "$RUN_DIR"/worker-*.log 2>/dev/null &
tail_pid=$!

# Describes how process status STATUS ended: "exit 1", "killed by SIGKILL".
how_it_ended() {
  if (($1 > 128)); then echo "killed by SIG$(kill -l $(($1 - 128)) 2>/dev/null || echo $(($1 - 128)))"; else echo "exit $1"; fi
}

# Whether NAME may be restarted now: fewer than 5 starts in the last minute.
may_restart() {
  local now recent=() t
  now=$(date +%s)
  for t in ${started_at[$1]}; do ((now - t < 60)) && recent+=("$t"); done
  started_at[$1]="${recent[*]:-}"
  ((${#recent[@]} < 5))
}

# Ends the stream of the daemons' logs, so that what the launcher says next is last.
stop_log_stream() {
  sleep 0.3  # let tail print the last lines
  kill "$tail_pid" 2>/dev/null || true
  wait "$tail_pid" 2>/dev/null || true
  tail_pid=""
}

# Whether a worker is alive or will be restarted: without one, the job cannot finish.
# True while the scheduler is down: workers that gave up on it end nothing early (the
# servers keep their own, longer deadline, and the launcher waits for them).
workers_remain() {
  local name
  [[ -n ${name_of[$(cat "$RUN_DIR/scheduler.pid")]:-} ]] || return 0
  for name in ${name_of[@]+"${name_of[@]}"} ${restart_at[@]+"${!restart_at[@]}"}; do
    [[ $name == worker-* ]] && return 0
  done
  return 1
}

# Whether NAME, which failed and stays down, was the last worker of a job that had not
# ended: with the scheduler up, nothing is left that could finish it.
last_worker_gone() {
  [[ $1 == worker-* ]] && ! job_finished && ! shutdown_requested && ! workers_remain
}

# What becomes of the job without NAME, which failed and stays down ([HINT] for a daemon
# that --restart would bring back): it carries on, unless NAME was its last worker.
carries_on_without() {
  if last_worker_gone "$1"; then
    echo "no worker is left and none will be restarted: the job cannot finish; stopping the cluster"
  else
    echo "the cluster carries on without it${2:+ $2}"
  fi
}

# Supervise until every daemon has exited. A one-second tick wakes the loop, so that
# once the job has finished the daemons still up get a bounded time to follow.
job_done_at=""
while ((${#name_of[@]} + ${#restart_at[@]} > 0)); do
  if [[ -z $tick_pid ]]; then sleep 1 & tick_pid=$!; fi
  exited=""
  status=0
  # A daemon killed by a signal while this loop was not in `wait` has been reported by
  # bash already and is no longer a job `wait -n` waits for: find it by its pid (its
  # status is still there for `wait PID`), or it would never be noticed or restarted.
  for pid in ${name_of[@]+"${!name_of[@]}"}; do
    if ! kill -0 "$pid" 2>/dev/null; then
      exited=$pid
      wait "$pid" || status=$?
      break
    fi
  done
  if [[ -z $exited ]]; then
    wait -n -p exited ${name_of[@]+"${!name_of[@]}"} "$tick_pid" || status=$?
  fi
  if [[ -z $job_done_at ]] && job_finished && [[ -z ${name_of[$(cat "$RUN_DIR/scheduler.pid")]:-} ]]; then
    job_done_at=$(date +%s)
  fi
  if [[ -n $job_done_at ]] && (($(date +%s) - job_done_at > 30)); then
    say "the job finished 30 s ago; stopping the daemons still up: ${name_of[*]}"
    for pid in "${!name_of[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    job_done_at=$((job_done_at + 10))  # TERM again in 10 s if need be
  fi
  for name in "${!restart_at[@]}"; do
    if (($(date +%s) >= restart_at[$name])); then
      unset "restart_at[$name]"
      if job_finished; then continue; fi
      say "restarting $name"
      start_daemon "$name"
    fi
  done
  if [[ -z $exited || $exited == "$tick_pid" ]]; then
    [[ $exited == "$tick_pid" ]] && tick_pid=""
    continue
  fi
  name=${name_of[$exited]}
  unset "name_of[$exited]"
  ((status == 0)) && continue
  # 143: stopped by SIGTERM (after a clean shutdown), as this loop stops the stragglers.
  ((status == 143)) && job_finished && continue
  why=$(how_it_ended "$status")
  if ((status == 2)); then
    say "$name refused its config ($why): no restart can fix that; stopping the cluster. See $RUN_DIR/$name.log"
    tail -n 5 "$RUN_DIR/$name.log" >&2
    exit 2
  fi
  # Its log is appended to across restarts: this asks whether any of its lives started up.
  if ((status < 128)) && ! started_up "$name"; then
    say "$name could not start ($why): no restart can fix that; stopping the cluster. See $RUN_DIR/$name.log"
    tail -n 5 "$RUN_DIR/$name.log" >&2
    exit 1
  fi
  what="$name (pid $exited) $( ((status > 128)) && echo died || echo failed) ($why)"
  # A scheduler that ended the job unfinished (exit 3: no worker came back in time, or a
  # shard's only state was lost) is not restarted: a new one would start the job afresh.
  if [[ $name == scheduler ]] && ((status == 3)); then
    stop_log_stream
    say "the job did not finish: the scheduler ended it ($(sed -n 's/.*\] error: \(.*\); telling every node to stop$/\1/p' "$RUN_DIR/scheduler.log" | tail -n 1 || true))"
    exit 1
  fi
  if job_finished; then
    say "$what after the job finished"
  elif [[ $name == scheduler ]] && may_restart "$name"; then
    say "$what; restarting it"
    start_daemon "$name"
  elif [[ $name == scheduler ]]; then
    say "$what, its 5th time in a minute: not restarting it; the servers and workers carry on until their own deadlines"
  elif ((RESTART)) && may_restart "$name"; then
    say "$what; restarting it in ${restart_delay_s} s, once the scheduler has declared it dead"
    restart_at[$name]=$(($(date +%s) + restart_delay_s))
  elif ((RESTART)); then
    say "$what, its 5th time in a minute: not restarting it; $(carries_on_without "$name")"
  else
    say "$what; $(carries_on_without "$name" "(--restart would bring it back)")"
  fi
  if last_worker_gone "$name"; then
    stop_log_stream
    say "the job did not finish: every worker failed. $name's last line:"
    grep -v '^[[:space:]]*$' "$RUN_DIR/$name.log" | tail -n 1 >&2 || true
    exit 1
  fi
done
stop_log_stream
final=$(grep -hEo "final ((test_accuracy=[0-9.]*|test_auc=[0-9.]* test_logloss=[0-9.]*) )?samples_per_sec=[0-9]* steps=[0-9]*" \
  "$RUN_DIR/scheduler.log" | tail -n 1 || true)
report=$(grep -o "final report (the status page as the job ended) in .*" "$RUN_DIR/scheduler.log" | tail -n 1 | sed 's/.* in //' || true)
[[ -z $report ]] || say "final report: $report (open it in a browser)"
if [[ -n $final ]]; then
  echo "$final"
  exit 0
fi
if shutdown_requested; then
  say "an operator shut the job down (psctl shutdown); logs in $RUN_DIR"
  exit 0
fi
# No scheduler recorded the end, but rank 0 trained every step and wrote the weights.
finished_alone=$(grep -ho "training finished ([0-9]* steps, final .*) and the final weights were written to [^,]*" \
  "$RUN_DIR"/worker-*.log 2>/dev/null | tail -n 1 || true)
if [[ -n $finished_alone ]]; then
  say "the scheduler was lost, but the job finished without it; logs in $RUN_DIR"
  echo "$finished_alone"
  exit 0
fi
say "the job did not finish; logs in $RUN_DIR"
exit 1
