#!/usr/bin/env bash
# The container image and a whole job in containers, with the README's commands as a user
# types them:
#   deploy/container/build.sh                      the OCI archive, from Debian's archive alone
#   podman load -i out/paramserver-VERSION.oci.tar
#   deploy/container/run.sh CONFIG                 a job in a pod, one container a daemon
# The image: an OCI archive podman loads, named paramserver:VERSION, running as an
# unprivileged user, one entry point for the binaries, the Python package with PyTorch.
# The job: the same final line as deploy/local/run.sh with the same config (sync, no
# shuffle: the same accuracy and steps); kill -9 of a server's container and the job
# carries on (replication 2) to the same accuracy; so does a killed scheduler's, which
# run.sh starts again; Ctrl-C stops it. Then the pods
# deploy/k8s/render.py renders for the same spec, each run in podman with its args, env,
# user and volumes as the kubelet gives them (tests/k8s_manifests.py run): the same final
# accuracy. Then SageMaker's contract (`paramserver train`): three containers given the
# files SageMaker gives (docs/DEPLOY_SAGEMAKER.md) finish the job with the weights in
# /opt/ml/model and checkpoints in /opt/ml/checkpoints; a bad hyperparameter is named in
# /opt/ml/output/failure; a worker killed in its container is started again; stopped mid-run (SIGTERM, as
# StopTrainingJob or a spot interruption), they say so in /opt/ml/output/failure, and
# started again with the checkpoints put back they resume and finish. Every run leaves
# no pod, container or secret behind; the image this test loaded is removed at the end.
# Needs root (mmdebstrap's root mode, rootful podman); elsewhere it prints SKIPPED.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
if [[ $(id -u) != 0 ]]; then
  echo "SKIPPED: the image is built and run as root (mmdebstrap --mode=root, rootful podman)"
  exit 0
fi

version=$("$ROOT/deploy/version.sh")
image=paramserver:$version
loaded_here=0
podman image exists "$image" || loaded_here=1
SM_POD=ps-sagemaker-$$
remove_loaded_image() {
  podman pod rm -f -t 5 "$SM_POD" >/dev/null 2>&1
  ((loaded_here)) && podman rmi -f "$image" >/dev/null 2>&1
  end_started
}
trap remove_loaded_image EXIT

echo "deploy/container/build.sh"
(cd "$ROOT" && deploy/container/build.sh) >"$WORK/build.out" 2>&1
build_status=$?
archive=$ROOT/out/paramserver-$version.oci.tar
check "it exits 0" test "$build_status" -eq 0
check "it prints the archive's path last" test "$(last_line "$WORK/build.out")" == "$archive"
check "it says one line a step and the size (at most 10 lines)" bash -c \
  "(( \$(wc -l <'$WORK/build.out') <= 10 )) && grep -Eq '^build.sh: paramserver:$version: [0-9]+ MB compressed, [0-9]+ MB unpacked$' '$WORK/build.out'"
sed 's/^/  /' "$WORK/build.out"
check "the archive is an OCI image layout" bash -c "tar -tf '$archive' | grep -qx './oci-layout' && tar -tf '$archive' | grep -qx './index.json'"

echo "podman load -i out/paramserver-$version.oci.tar"
podman load -i "$archive" >"$WORK/load.out" 2>&1
check "podman loads it as paramserver:$version" grep -q "Loaded image.*paramserver:$version$" "$WORK/load.out"
check "it runs as the unprivileged user ps (10001)" test "$(podman image inspect -f '{{.Config.User}}' "$image")" == 10001:10001
check "its entry point is paramserver" grep -q '/usr/local/bin/paramserver' <(podman image inspect -f '{{.Config.Entrypoint}}' "$image")
rm -f "$archive"

write_config "$WORK/job.yaml" replication 2 epochs 4

# launch_pod RUN_DIR ARGS...: `deploy/container/run.sh ARGS` as lib.sh's launch starts
# deploy/local/run.sh (wait_launcher waits for it).
launch_pod() { launch_script "$ROOT/deploy/container/run.sh" "$@"; }
pod_of() { grep -o "pod ps-job-[0-9a-f]*" "$1.out" | head -n 1 | sed 's/^pod //'; }
# nothing_left RUN_DIR: no pod, container or secret of the run's job is left.
nothing_left() {
  local job
  job=$(pod_of "$1")
  [[ -n $job ]] && ! podman pod exists "$job" && [[ -z $(podman ps -a -q --filter "name=$job") ]] &&
    ! podman secret ls --format '{{.Name}}' | grep -q "^$job"
}
accuracy_and_steps() { grep -E "^ *final test_accuracy=" "$1" | tail -n 1 | grep -Eo "test_accuracy=[0-9.]+|steps=[0-9]+" | tr '\n' ' '; }

echo "the same job under deploy/local/run.sh, for its final line"
launch "$WORK/local" "$WORK/job.yaml"
wait_launcher 600
check "it exits 0" test "$LAUNCHER_STATUS" -eq 0

echo "deploy/container/run.sh CONFIG: an undisturbed job in containers"
launch_pod "$WORK/pod" "$WORK/job.yaml"
wait_launcher 600
check "it exits 0" test "$LAUNCHER_STATUS" -eq 0
check "its last line is the job's final line" grep -Eq "^final test_accuracy=0\.[0-9]{4} samples_per_sec=[0-9]+ steps=[0-9]+$" \
  <(last_line "$WORK/pod.out")
check "the same accuracy and steps as deploy/local/run.sh's" \
  test "$(accuracy_and_steps "$WORK/pod.out")" == "$(accuracy_and_steps "$WORK/local.out")"
check "the servers registered through the scheduler's name" grep -q "registered with the scheduler at scheduler:7070" "$WORK/pod/server-0.log"
check "the scheduler ran as the image's user (its report is owned by 10001)" \
  test "$(stat -c %u "$WORK/pod/job/report.html")" == 10001
check "nothing is left: no pod, container or secret" nothing_left "$WORK/pod"

echo "kill -9 a server's container mid-run (replication 2)"
launch_pod "$WORK/kill" "$WORK/job.yaml"
check "training started" wait_for_line "$WORK/kill.out" "worker-0 .*training steps" 300
job=$(pod_of "$WORK/kill")
check "the launcher named the pod" test -n "$job"
sleep 2
echo "  podman kill -s KILL $job-server-1"
podman kill -s KILL "$job-server-1" >/dev/null
wait_launcher 600
check "it exits 0" test "$LAUNCHER_STATUS" -eq 0
check "its last line is the job's final line" grep -Eq "^final test_accuracy=" <(last_line "$WORK/kill.out")
check "the scheduler lost the server and went on" grep -Eq "ps-[0-9] lost" "$WORK/kill/scheduler.log"
check "the same accuracy and steps as the undisturbed run" \
  test "$(accuracy_and_steps "$WORK/kill.out")" == "$(accuracy_and_steps "$WORK/pod.out")"
check "nothing is left" nothing_left "$WORK/kill"

echo "kill -9 the scheduler's container mid-run: run.sh starts it again, it takes the job over"
launch_pod "$WORK/scheduler" "$WORK/job.yaml"
check "training started" wait_for_line "$WORK/scheduler.out" "worker-0 .*training steps" 300
job=$(pod_of "$WORK/scheduler")
sleep 2
echo "  podman kill -s KILL $job-scheduler"
podman kill -s KILL "$job-scheduler" >/dev/null
wait_launcher 600
check "it exits 0" test "$LAUNCHER_STATUS" -eq 0
check "the launcher started the scheduler again" grep -q "the scheduler's container ended (exit 137); starting it again" "$WORK/scheduler.out"
check "the same accuracy and steps as the undisturbed run" \
  test "$(accuracy_and_steps "$WORK/scheduler.out")" == "$(accuracy_and_steps "$WORK/pod.out")"
check "nothing is left" nothing_left "$WORK/scheduler"

echo "Ctrl-C stops the job"
launch_pod "$WORK/stop" "$WORK/job.yaml"
check "training started" wait_for_line "$WORK/stop.out" "worker-0 .*training steps" 300
kill -INT -- "-$LAUNCHER_PID"
wait_launcher 60
check "it exits 130" test "$LAUNCHER_STATUS" -eq 130
check "it says so" grep -q "stopped by the user (Ctrl-C); removing the pod" "$WORK/stop.out"
check "nothing is left" nothing_left "$WORK/stop"

echo "the pods deploy/k8s/render.py renders, run in podman as the kubelet would run them"
(cd "$ROOT" && deploy/k8s/render.py "$WORK/job.yaml" --name k8s-job --image "$image") >"$WORK/k8s.yaml" 2>"$WORK/k8s.err"
check "render.py exits 0" test $? -eq 0
# Podman's settings as run.sh found them for this host (none where its defaults work).
if [[ -f $WORK/pod/containers.conf ]]; then export CONTAINERS_CONF=$WORK/pod/containers.conf; fi
mkdir -p "$WORK/k8s"
/usr/bin/python3 "$ROOT/tests/k8s_manifests.py" run "$WORK/k8s.yaml" "$WORK/k8s" >"$WORK/k8s.out" 2>&1
check "the scheduler Job's pod, the StatefulSet's servers and the worker Job's pods ran the job" test $? -eq 0
sed 's/^/    /' "$WORK/k8s.out"
check "the same accuracy and steps as deploy/local/run.sh's" \
  test "$(accuracy_and_steps "$WORK/k8s.out")" == "$(accuracy_and_steps "$WORK/local.out")"
check "the scheduler wrote its report into the state volume, as uid 10001" \
  test "$(stat -c %u "$WORK/k8s/claim/report.html" 2>/dev/null)" == 10001

echo "SageMaker's contract: paramserver train in 3 containers (algo-1..3), given SageMaker's files"
# The job's spec as the user hands it in the `config` channel: checkpoints every 100
# steps (their folder is train's to set), the data in the image.
write_config "$WORK/sm.yaml"
printf 'checkpoint:\n  every_steps: 100\n' >>"$WORK/sm.yaml"
od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$WORK/sm.token"
chmod 0644 "$WORK/sm.token"  # as SageMaker downloads a channel's file: readable by all
printf '127.0.0.1\tlocalhost algo-1 algo-2 algo-3\n' >"$WORK/sm.hosts"
chmod 0644 "$WORK/sm.hosts"
sm_hosts=(algo-1 algo-2 algo-3)
# sm_prepare DIR: each host's /opt/ml (DIR/HOST) as SageMaker fills it before `train`.
# algo-1 runs as root (train hands the folders to uid 10001), algo-2 and algo-3 as the
# image's user, with folders it can write.
sm_prepare() {
  local dir=$1 host ml
  for host in "${sm_hosts[@]}"; do
    ml=$dir/$host
    mkdir -p "$ml/input/config" "$ml/input/data/config" "$ml/input/data/secrets" "$ml/model" \
      "$ml/checkpoints" "$ml/output/data"
    printf '{"current_host": "%s", "hosts": ["algo-1", "algo-2", "algo-3"], "network_interface_name": "eth0"}\n' \
      "$host" >"$ml/input/config/resourceconfig.json"
    printf '{"servers_per_host": "1", "workers_per_host": "\\"1\\"", "sagemaker_region": "\\"eu-west-1\\""}\n' \
      >"$ml/input/config/hyperparameters.json"
    cp "$WORK/sm.yaml" "$ml/input/data/config/job.yaml"
    cp -p "$WORK/sm.token" "$ml/input/data/secrets/cluster-token"
    [[ $host == algo-1 ]] || chown -R 10001:10001 "$ml/model" "$ml/checkpoints" "$ml/output"
  done
}
# sm_start DIR: the pod and one container per host, as SageMaker runs `docker run IMAGE train`.
sm_start() {
  local dir=$1 host user
  podman pod create --name "$SM_POD" --network none >/dev/null
  for host in "${sm_hosts[@]}"; do
    user=()
    [[ $host == algo-1 ]] && user=(--user 0:0)
    podman run -d --pod "$SM_POD" --name "$SM_POD-$host" "${user[@]}" -v "$dir/$host:/opt/ml" \
      -v "$WORK/sm.hosts:/etc/hosts:ro" "$image" train >/dev/null
  done
}
# sm_wait DIR: waits for the containers (10 minutes at most), keeps each one's output in
# DIR/HOST.log and its exit status in DIR/HOST.status, removes the pod.
sm_wait() {
  local dir=$1 host
  for host in "${sm_hosts[@]}"; do
    timeout 600 podman wait "$SM_POD-$host" >"$dir/$host.status" 2>&1
    podman logs "$SM_POD-$host" >"$dir/$host.log" 2>&1
  done
  podman pod rm -f -t 5 "$SM_POD" >/dev/null 2>&1
}
sm_all_exited() { local host; for host in "${sm_hosts[@]}"; do [[ $(cat "$1/$host.status") == "$2" ]] || return 1; done; }
# The weights file's tensors hold the 784-128-10 MLP's 101,770 parameters.
sm_weights_ok() {
  /usr/bin/python3 - "$1" <<'PYCHECK'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    (length,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(length))
count = 0
for name, tensor in header.items():
    if name == "__metadata__":
        continue
    size = 1
    for dim in tensor["shape"]:
        size *= dim
    count += size
sys.exit(0 if count == 101770 else 1)
PYCHECK
}
sm_weights() { ls "$1"/algo-*/model/weights.safetensors 2>/dev/null; }

sm_prepare "$WORK/sm"
sm_start "$WORK/sm"
sm_wait "$WORK/sm"
check "the three containers exit 0" sm_all_exited "$WORK/sm" 0
check "algo-1 ran the scheduler and its final line" grep -Eq "^\[scheduler\] .*final test_accuracy=0\.[0-9]{4} samples_per_sec=[0-9]+ steps=[0-9]+" "$WORK/sm/algo-1.log"
check "every host ran a server and a worker" bash -c "for h in ${sm_hosts[*]}; do grep -q '^\[server-0\] ' \"$WORK/sm/\$h.log\" && grep -q '^\[worker-0\] ' \"$WORK/sm/\$h.log\" || exit 1; done"
check "the scheduler formed a cluster of 3 servers and 3 workers" \
  grep -q "^\[scheduler\] .*cluster complete: 3 servers, 3 workers" "$WORK/sm/algo-1.log"
check "the servers registered through the first host's name" grep -q "registered with the scheduler at algo-1:7070" "$WORK/sm/algo-3.log"
check "one host's /opt/ml/model holds the weights" test "$(sm_weights "$WORK/sm" | wc -l)" -eq 1
check "the weights are the model's 101,770 parameters (safetensors)" sm_weights_ok "$(sm_weights "$WORK/sm" | head -n 1)"
shards_at() { ls "$WORK"/"$1"/algo-*/checkpoints/shard-*-step-"$2".ckpt 2>/dev/null | sed 's/.*shard-//' | sort -u | wc -l; }
check "every shard's checkpoint at step 3100 is in some host's /opt/ml/checkpoints" test "$(shards_at sm 3100)" -eq 8
check "algo-1 (root) handed /opt/ml/model to uid 10001" test "$(stat -c %u "$WORK/sm/algo-1/model")" == 10001
check "no failure was written" bash -c "! ls '$WORK'/sm/algo-*/output/failure 2>/dev/null"
check "nothing is left of the pod" bash -c "! podman pod exists '$SM_POD' && [[ -z \$(podman ps -a -q --filter name='$SM_POD') ]]"

echo "  a hyperparameter train does not know: refused by name, before any daemon starts"
sm_prepare "$WORK/sm-bad"
printf '{"epochs": "3"}\n' >"$WORK/sm-bad/algo-2/input/config/hyperparameters.json"
podman run --rm --network none -v "$WORK/sm-bad/algo-2:/opt/ml" "$image" train >"$WORK/sm-bad/algo-2.log" 2>&1
check "it exits 2" test $? -eq 2
check "FailureReason names it" grep -q "unknown hyperparameter 'epochs'" "$WORK/sm-bad/algo-2/output/failure"
check "no daemon started" bash -c "! grep -q 'started (pid' '$WORK/sm-bad/algo-2.log'"

echo "  stopped mid-run (SIGTERM to every container, as StopTrainingJob sends it), then started again"
sm_prepare "$WORK/sm-stop"
sm_start "$WORK/sm-stop"
every_shard_at_100() { (($(shards_at sm-stop 100) == 8)); }
check "every shard wrote its step-100 checkpoint" wait_until every_shard_at_100 300
check "each container's first process is catatonit (train gets the signals PID 1 would not)" \
  test "$(podman exec "$SM_POD-algo-2" cat /proc/1/comm 2>&1)" == catatonit
# A worker process dies in its container (kill -9): train starts it again, and it rejoins.
podman exec "$SM_POD-algo-2" /usr/bin/python3 -c '
import os, signal
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        if open(f"/proc/{pid}/comm").read().strip() == "ps_worker":
            os.kill(int(pid), signal.SIGKILL)
    except OSError:
        pass'
worker_rejoined() { (($(podman logs "$SM_POD-algo-2" 2>&1 | grep -c "^\[worker-0\] .*registered with the scheduler") >= 2)); }
check "train started the killed worker again, and it registered again" wait_until worker_rejoined 120
podman stop -t 30 "$SM_POD-algo-1" "$SM_POD-algo-2" "$SM_POD-algo-3" >/dev/null 2>&1
sm_wait "$WORK/sm-stop"
check "the three containers exit 1" sm_all_exited "$WORK/sm-stop" 1
check "algo-2's train said it restarted the worker" grep -q "^train: starting worker-0 again" "$WORK/sm-stop/algo-2.log"
check "each says why in /opt/ml/output/failure" bash -c "for h in ${sm_hosts[*]}; do grep -q 'stopped by SIGTERM' '$WORK'/sm-stop/\$h/output/failure || exit 1; done"
# SageMaker puts the union of the instances' checkpoints (one S3 prefix) on every instance.
mkdir -p "$WORK/sm-union"
cp "$WORK"/sm-stop/algo-*/checkpoints/* "$WORK/sm-union/"
sm_prepare "$WORK/sm-resume"
for host in "${sm_hosts[@]}"; do
  cp "$WORK"/sm-union/* "$WORK/sm-resume/$host/checkpoints/"
  [[ $host == algo-1 ]] || chown -R 10001:10001 "$WORK/sm-resume/$host/checkpoints"
done
sm_start "$WORK/sm-resume"
sm_wait "$WORK/sm-resume"
check "started again, the three containers exit 0" sm_all_exited "$WORK/sm-resume" 0
resumed_at=$(grep -Eo "^\[scheduler\] .*resuming from the checkpoint at step [0-9]+" "$WORK/sm-resume/algo-1.log" | grep -Eo "[0-9]+$")
check "the scheduler resumed past step 0 (at step ${resumed_at:-none})" test "${resumed_at:-0}" -ge 100
check "every server restored its shards from the checkpoints at that step" bash -c \
  "for h in ${sm_hosts[*]}; do grep -q '^\[server-0\] .*restored from its checkpoint at step ${resumed_at:-none}\$' '$WORK'/sm-resume/\$h.log || exit 1; done"
check "its final line" grep -Eq "^\[scheduler\] .*final test_accuracy=0\.[0-9]{4}" "$WORK/sm-resume/algo-1.log"
check "one host's /opt/ml/model holds the weights" test "$(sm_weights "$WORK/sm-resume" | wc -l)" -eq 1
if ((FAILURES > 0)); then
  for log in "$WORK"/sm*/algo-*.log; do echo "--- $log"; grep -Ev "info: (epoch [0-9]+ step|step [0-9]+)" "$log" | tail -n 25; done
fi

finish
