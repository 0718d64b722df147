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
# carries on (replication 2) to the same accuracy; Ctrl-C stops it. Every run leaves no
# pod, container or secret behind; the image this test loaded is removed at the end.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

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

# launch_pod RUN_DIR ARGS...: `deploy/container/run.sh ARGS` in a process group of its
# own, its output in RUN_DIR.out; sets LAUNCHER_PID (lib.sh's wait_launcher waits for it).
launch_pod() {
  local run_dir=$1
  shift
  mkdir -p "$run_dir"
  set -m
  PS_RUN_DIR=$run_dir env --default-signal=INT "$ROOT/deploy/container/run.sh" "$@" >"$run_dir.out" 2>&1 &
  LAUNCHER_PID=$!
  set +m
  STARTED_GROUPS+=("$LAUNCHER_PID")
}
pod_of() { grep -o "pod ps-job-[0-9a-f]*" "$1.out" | head -n 1 | sed 's/^pod //'; }
# nothing_left RUN_DIR: no pod, container or secret of the run's job is left.
nothing_left() {
  local job
  job=$(pod_of "$1")
  [[ -n $job ]] && ! podman pod exists "$job" && [[ -z $(podman ps -a -q --filter "name=$job") ]] &&
    ! podman secret ls --format '{{.Name}}' | grep -q "^$job"
}
accuracy_and_steps() { last_line "$1" | grep -Eo "test_accuracy=[0-9.]+|steps=[0-9]+" | tr '\n' ' '; }

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
job=""
for _ in $(seq 600); do job=$(pod_of "$WORK/kill"); [[ -n $job ]] && break; sleep 0.1; done
check "training started" wait_for_line "$WORK/kill.out" "worker-0 .*training steps" 300
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

echo "Ctrl-C stops the job"
launch_pod "$WORK/stop" "$WORK/job.yaml"
check "training started" wait_for_line "$WORK/stop.out" "worker-0 .*training steps" 300
kill -INT -- "-$LAUNCHER_PID"
wait_launcher 60
check "it exits 130" test "$LAUNCHER_STATUS" -eq 130
check "it says so" grep -q "stopped by the user (Ctrl-C); removing the pod" "$WORK/stop.out"
check "nothing is left" nothing_left "$WORK/stop"

finish
