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
# accuracy. Every run leaves no pod, container or secret behind; the image this test
# loaded is removed at the end.
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
remove_loaded_image() {
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
check "the launcher started the scheduler again" grep -q "the scheduler's container ended (exited 137); starting it again" "$WORK/scheduler.out"
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

finish
