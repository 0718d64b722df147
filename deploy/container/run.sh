#!/usr/bin/env bash
# Runs a whole job in containers on this machine with podman, from the image that
# deploy/container/build.sh makes: one pod per job (its own network namespace, loopback
# only), the scheduler addressed by name (`scheduler`, in the job's /etc/hosts), one
# container per daemon, each started as Kubernetes would start it:
#   paramserver scheduler --config /etc/ps/cluster.yaml --listen 127.0.0.1:7070 ...
#   paramserver server|worker --config /etc/ps/cluster.yaml --scheduler scheduler:7070 ...
# the cluster token a podman secret (readable by the image's user only), the config
# mounted read-only, the job's folder (outputs, the scheduler's state) mounted at
# /var/lib/paramserver/job. It streams the pod's logs and ends with the job's final
# line, as deploy/local/run.sh does:
#   final test_accuracy=0.XXXX samples_per_sec=N steps=N
# kill -9 a server's container (`podman kill -s KILL NAME`, the names are printed) and
# the job carries on: its backups take over. The scheduler's container is started again
# when it dies (at most 5 times a minute), taking the job over from its state file. When it
# exits, the pod, its containers and the secret are gone.
#
# Usage: deploy/container/run.sh [--image REF] [CONFIG]
#   CONFIG        the cluster spec (default: deploy/local/fashion_mnist.yaml); its data
#                 paths are read inside the image (the reference job's data is in it)
#   --image REF   the image to run (default: paramserver:VERSION of this checkout,
#                 built with deploy/container/build.sh and loaded when podman lacks it)
# $PS_RUN_DIR (default: a new /tmp/ps-pod.XXXXXX) holds each container's log
# (scheduler.log, server-N.log, worker-N.log), the job's folder (job/) and the set-up's
# output (install.log, image.log). Exit status: 0 when the job finished, 1 when it did not.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
IMAGE=""
CONFIG_ARG=""
while (($#)); do
  case "$1" in
    --image) IMAGE=${2:?--image needs an image}; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo pipefail$/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) [[ -z $CONFIG_ARG ]] || { echo "run.sh: one CONFIG only" >&2; exit 2; }; CONFIG_ARG=$1; shift ;;
  esac
done
CONFIG=$(realpath "${CONFIG_ARG:-$ROOT/deploy/local/fashion_mnist.yaml}")
[[ -r $CONFIG ]] || { echo "run.sh: cannot read the config $CONFIG" >&2; exit 2; }
say() { echo "run.sh: $*" >&2; }
if [[ $(id -u) != 0 ]]; then
  say "run me as root: the job's pod runs under rootful podman"
  exit 2
fi
RUN_DIR=${PS_RUN_DIR:-$(mktemp -d /tmp/ps-pod.XXXXXX)}
(umask 077 && mkdir -p "$RUN_DIR")
# Root writes here and hands job/ to the image's user: the folder must be root's own,
# not a link (nothing in it may lead elsewhere).
if [[ -L $RUN_DIR || ! -O $RUN_DIR ]]; then
  say "the run folder $RUN_DIR must be a folder of root's own, not a link"
  exit 2
fi
chmod 700 "$RUN_DIR"
RUN_DIR=$(cd "$RUN_DIR" && pwd)
for entry in job hosts containers.conf image; do
  if [[ -L $RUN_DIR/$entry ]]; then say "$RUN_DIR/$entry is a link: refused"; exit 2; fi
done

"$ROOT/deploy/install_deps.sh" --log "$RUN_DIR/install.log" --with container
if [[ -z $IMAGE ]]; then
  # deploy/version.sh names a checkout with changes by a digest of them too.
  IMAGE=paramserver:$("$ROOT/deploy/version.sh")
  if ! podman image exists "$IMAGE"; then
    say "building and loading the image $IMAGE (deploy/container/build.sh; its output: $RUN_DIR/image.log)"
    if ! archive=$("$ROOT/deploy/container/build.sh" --out "$RUN_DIR/image" 2>>"$RUN_DIR/image.log" | tail -n 1) ||
       ! podman load -i "$archive" >>"$RUN_DIR/image.log" 2>&1; then
      say "building or loading the image failed; see $RUN_DIR/image.log and $RUN_DIR/image/container-build.log:"
      tail -n 15 "$RUN_DIR/image.log" | sed 's/^/  /' >&2
      exit 1
    fi
    rm -f "$archive"
  fi
fi
podman image exists "$IMAGE" || { say "podman has no image $IMAGE (podman load -i the archive build.sh wrote)"; exit 2; }

# Podman's settings for this job. Where its defaults cannot start a container here, a
# containers.conf of the job's own (CONTAINERS_CONF, for every podman call below, the
# pod's infra container included): limits no higher than this shell's own (podman's
# defaults are higher; raising a hard limit needs a privilege this host may not give),
# processes at most pid_max; then runc as the OCI runtime where crun cannot start one
# (crun refuses cgroup v1 with an empty cgroup v2 hierarchy beside it).
can_start() { podman run --rm --network none "$IMAGE" version >>"$RUN_DIR/image.log" 2>&1; }
if ! can_start; then
  nofile=$(ulimit -Hn)
  nproc=$(ulimit -Hu)
  pid_max=$(cat /proc/sys/kernel/pid_max)
  if [[ $nproc == unlimited ]] || ((nproc > pid_max)); then nproc=$pid_max; fi
  [[ $nofile == unlimited ]] && nofile=1048576
  export CONTAINERS_CONF=$RUN_DIR/containers.conf
  printf '[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=%s:%s"]\n' "$nofile" "$nofile" "$nproc" "$nproc" \
    >"$CONTAINERS_CONF"
  if ! can_start; then
    command -v runc >/dev/null || "$ROOT/deploy/install_deps.sh" --log "$RUN_DIR/install.log" --with runc
    printf '[engine]\nruntime = "runc"\n' >>"$CONTAINERS_CONF"
  fi
  if ! can_start; then
    say "podman cannot start a container of $IMAGE here; its errors:"
    tail -n 5 "$RUN_DIR/image.log" | sed 's/^/  /' >&2
    exit 1
  fi
fi

# Validates the config and reads the cluster's size, in the image.
if ! describe=$(podman run --rm --network none -v "$CONFIG:/etc/ps/cluster.yaml:ro" "$IMAGE" \
  scheduler --config /etc/ps/cluster.yaml --describe); then
  exit 2
fi
read -r _ servers_kv workers_kv _ <<<"$describe"
servers=${servers_kv#servers=}
workers=${workers_kv#workers=}

JOB=ps-job-$(od -An -tx1 -N4 /dev/urandom | tr -d ' \n')
SECRET=$JOB-cluster-token
mkdir -p "$RUN_DIR/job"
chown -h 10001:10001 "$RUN_DIR/job"
rm -f "$RUN_DIR/job/scheduler.state" "$RUN_DIR/job/report.html"  # a new job: nothing to take over
cleanup() {
  local status=$?
  # Nothing interrupts the clean-up (a second Ctrl-C included), and no failure in it
  # stops it before the pod and the secret are gone.
  trap '' INT TERM
  trap - EXIT
  if [[ -n ${logs_pid:-} ]]; then kill "$logs_pid" 2>/dev/null || true; fi
  for name in scheduler $(seq -f "server-%g" 0 $((servers - 1))) $(seq -f "worker-%g" 0 $((workers - 1))); do
    podman logs "$JOB-$name" >"$RUN_DIR/$name.log" 2>&1 || true
  done
  podman pod rm -f -t 5 "$JOB" >/dev/null 2>&1 || true
  podman secret rm "$SECRET" >/dev/null 2>&1 || true
  exit "$status"
}
trap cleanup EXIT
trap 'say "stopped by the user (Ctrl-C); removing the pod $JOB (logs in $RUN_DIR)"; exit 130' INT
trap 'say "stopped (SIGTERM); removing the pod $JOB (logs in $RUN_DIR)"; exit 143' TERM

# The cluster token, made here, handed to the containers as a secret: mode 0400, owned
# by the image's user, never in an environment variable or on a command line.
od -An -tx1 -N32 /dev/urandom | tr -d ' \n' | podman secret create "$SECRET" - >/dev/null
# The pod's names: podman writes no /etc/hosts entries into a pod without a network, so
# the job's own is mounted into each container.
printf '127.0.0.1\tlocalhost scheduler\n::1\tlocalhost\n' >"$RUN_DIR/hosts"
chmod 0644 "$RUN_DIR/hosts"
podman pod create --name "$JOB" --network none >/dev/null
say "pod $JOB: the scheduler, $servers servers, $workers workers ($IMAGE); logs: $RUN_DIR"

# start NAME COMMAND...: one daemon's container in the pod.
start() {
  local name=$1
  shift
  podman run -d --pod "$JOB" --name "$JOB-$name" \
    --secret "$SECRET,type=mount,target=cluster-token,uid=10001,gid=10001,mode=0400" \
    -v "$CONFIG:/etc/ps/cluster.yaml:ro" -v "$RUN_DIR/hosts:/etc/hosts:ro" \
    -v "$RUN_DIR/job:/var/lib/paramserver/job" "$IMAGE" "$@" --config /etc/ps/cluster.yaml --cluster_token_file /run/secrets/cluster-token >/dev/null
}
start scheduler scheduler --listen 127.0.0.1:7070 \
  --state_file /var/lib/paramserver/job/scheduler.state \
  --report_file /var/lib/paramserver/job/report.html
for i in $(seq 0 $((servers - 1))); do start "server-$i" server --scheduler scheduler:7070; done
for i in $(seq 0 $((workers - 1))); do start "worker-$i" worker --scheduler scheduler:7070; done
podman pod logs -f --names "$JOB" >&2 &
logs_pid=$!

# The job ends when the scheduler exits 0 (it says why in its log first). A scheduler
# that dies is started again, as deploy/local/run.sh and systemd on EC2 restart it (podman's
# own restart policy does not apply to a container stopped by `podman kill`): it takes the
# job over from its state file. At most 5 starts a minute; then the job is given up.
starts=()
while true; do
  if ! state=$(podman inspect -f '{{.State.Status}} {{.State.ExitCode}}' "$JOB-scheduler" 2>/dev/null); then
    podman container exists "$JOB-scheduler" && { sleep 0.5; continue; }
    state=gone
    break
  fi
  case "$state" in
    # Podman reports a container that has just ended as stopped, then as exited.
    "exited 0" | "stopped 0") break ;;
    # 2: the spec is bad; 3: the scheduler ended the job unfinished (no worker in time, a
    # lost server held the only copy). No restart helps, as on EC2 (RestartPreventExitStatus).
    "exited 2" | "stopped 2" | "exited 3" | "stopped 3") break ;;
    exited* | stopped*)
      now=$SECONDS
      recent=()
      for start in "${starts[@]}"; do ((now - start < 60)) && recent+=("$start"); done
      starts=("${recent[@]}")
      if ((${#starts[@]} >= 5)); then
        say "the scheduler died 5 times within a minute (exit ${state#* }); giving up"
        break
      fi
      # The exit status alone: podman's word for the state (stopped, then exited) races.
      say "the scheduler's container ended (exit ${state#* }); starting it again"
      podman start "$JOB-scheduler" >/dev/null 2>&1 || true
      starts+=("$now") ;;
  esac
  sleep 0.5
done
sleep 0.5
kill "$logs_pid" 2>/dev/null || true
logs_pid=""
final=$(podman logs "$JOB-scheduler" 2>&1 |
  grep -hEo "final ((test_accuracy=[0-9.]*|test_auc=[0-9.]* test_logloss=[0-9.]*) )?samples_per_sec=[0-9]* steps=[0-9]*" | tail -n 1 || true)
if [[ -n $final ]]; then
  echo "$final"
  exit 0
fi
say "the job did not finish (the scheduler: $state); logs in $RUN_DIR"
exit 1
