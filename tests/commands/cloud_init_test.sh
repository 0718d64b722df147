#!/usr/bin/env bash
# The EC2 boot, run here: `deploy/ec2/launch.py up` (against the stand-in AWS endpoint,
# tests/stand_ins/aws_endpoint.py) renders each role's user data; each is then run as cloud-init runs it on first boot
# (tests/stand_ins/run_cloud_init.py) in a throwaway root (a mount namespace: a copy of
# /etc, empty /opt, /var/lib, /var/log and /usr/local/sbin) inside a network namespace
# this test made, holding the scheduler's private address and a stand-in metadata
# service (tests/stand_ins/imds.py at 169.254.169.254). apt-get, dpkg, curl, systemctl,
# modprobe, nvidia-smi and the CloudWatch agent's control are stand-ins that record their
# calls (tests/stand_ins/boot); systemctl starts the unit as systemd would. The three
# daemons then run the job for real, over TLS, from the secrets SSM handed them, and the
# weights arrive in the stand-in S3 bucket.
# Needs root (namespaces); elsewhere it prints SKIPPED with the reason.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
if [[ ${1:-} == --* ]]; then  # an inner step: the outer run's folder, which it cleans up
  trap - EXIT
  rmdir "$WORK"
  WORK=$CLOUD_INIT_TEST_WORK
else
  # The daemons run as the user ps and call the stand-in aws: a copy in the test's folder,
  # which ps may enter, wherever the clone lies (under /root, or a folder of mode 0700).
  cp -r "$ROOT/tests/stand_ins" "$WORK/stand_ins"
  chmod -R a+rX "$WORK/stand_ins"
fi
STANDINS=$WORK/stand_ins
export CLOUD_INIT_TEST_WORK=$WORK
SCHEDULER_IP=10.1.2.3  # what the stand-in endpoint answers for the scheduler's instance

# ---- inside a role's throwaway root: boot it, then note what a check needs to see.
if [[ ${1:-} == --boot-role ]]; then
  role=$2 user_data=$3 facts=$4 boot=$5
  mount --make-rprivate /
  # /etc: a copy (users and groups made here vanish with it); the rest: empty.
  mkdir -p "$WORK/etc-$role"
  cp -a /etc/. "$WORK/etc-$role/"
  mount --bind "$WORK/etc-$role" /etc
  for dir in /opt /var/lib /var/log /usr/local/sbin; do mount -t tmpfs "tmpfs-$role" "$dir"; done
  mkdir -p /etc/systemd/system
  export TMPDIR=$WORK/tmp-$boot BOOT_STANDIN_DIR=$WORK/$boot
  export BOOT_STANDIN_LOG=$BOOT_STANDIN_DIR/calls.log
  mkdir -p "$TMPDIR" "$BOOT_STANDIN_DIR"
  PATH="$STANDINS/boot:$STANDINS:$PATH" /usr/bin/python3 "$STANDINS/run_cloud_init.py" "$user_data" \
    >"$BOOT_STANDIN_DIR/cloud-init.log" 2>&1
  echo "boot_status=$?" >"$facts"
  {
    for file in /etc/ps/cluster.token /etc/ps/admin.token /etc/ps/tls/ca.pem /etc/ps/tls/node.key; do
      [[ -e $file ]] && echo "file $file $(stat -c '%U:%G %a' "$file")"
    done
    cat /etc/ps/node.env
    python3 -m json.tool /opt/aws/amazon-cloudwatch-agent/etc/amazon-cloudwatch-agent.json >/dev/null &&
      echo "cloudwatch config: valid JSON"
    grep -o '"file_path": "[^"]*"' /opt/aws/amazon-cloudwatch-agent/etc/amazon-cloudwatch-agent.json
    grep -o 'targets: \[[^]]*\]' /opt/aws/amazon-cloudwatch-agent/etc/prometheus.yaml
    id ps
  } >>"$facts" 2>&1
  exit 0
fi

# ---- inside the network namespace: addresses, the metadata service, the three boots.
# $2: the folder of launch.py's user data; $3: the weights rank 0 writes last; $4: the
# boot folders' suffix (boot-ROLE$4).
if [[ ${1:-} == --inside-network ]]; then
  user_data_dir=$2 weights=$3 suffix=$4
  ip link set lo up
  ip addr add 169.254.169.254/32 dev lo
  ip addr add "$SCHEDULER_IP/32" dev lo
  /usr/bin/python3 "$STANDINS/imds.py" --address 169.254.169.254 --port 80 --local-ipv4 "$SCHEDULER_IP" &
  imds=$!
  for role in scheduler server worker; do
    unshare --mount "$0" --boot-role "$role" "$user_data_dir/user-data-$role.yaml.gz" \
      "$WORK/facts-$role$suffix.txt" "boot-$role$suffix"
  done
  # The job runs; rank 0 writes the weights to S3 when it is done.
  for _ in $(seq 1200); do
    [[ -s $weights ]] && break
    sleep 0.1
  done
  for _ in $(seq 100); do  # the daemons exit by themselves once the job is over
    alive=0
    for pid in $(cat "$WORK"/boot-*"$suffix"/pids 2>/dev/null); do kill -0 "$pid" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.2
  done
  for pid in $(cat "$WORK"/boot-*"$suffix"/pids 2>/dev/null) "$imds"; do kill -KILL "$pid" 2>/dev/null || true; done
  exit 0
fi

if [[ $(id -u) != 0 ]] || ! unshare --net --mount true 2>/dev/null; then
  echo "SKIPPED: namespaces cannot be made here (needs root and CAP_SYS_ADMIN)"
  exit 0
fi

echo "the release, and the user data launch.py renders for a GPU cluster with TLS"
cd "$ROOT"
bazel build -c opt --noshow_progress //scheduler:ps_scheduler //ps:ps_server //worker:ps_worker \
  //psctl:psctl //ps:ps_checkpoint_export >"$WORK/build.log" 2>&1 || { cat "$WORK/build.log"; exit 1; }
release=$(deploy/package.sh --bin-dir "$ROOT/bazel-bin" --out "$WORK/out" 2>"$WORK/package.err" | tail -n 1)
check "the release is packaged" test -s "$release"
export AWS_STANDIN_ROOT=$WORK/aws BOOT_STANDIN_RELEASE=$release
export BOOT_STANDIN_RELEASE_URL=https://releases.example/paramserver.tar.gz
mkdir -p "$AWS_STANDIN_ROOT/s3/ps-out"
# The stand-in AWS endpoint launch.py talks to (it keeps SSM parameters and S3 objects
# where the daemons' stand-in `aws` reads them), on a port of its own choosing.
launch_script "$STANDINS/aws_endpoint.py" "$WORK/endpoint" --port-file "$WORK/endpoint.port"
wait_for_line "$WORK/endpoint.port" '^[0-9]+$' 30 || { echo "the stand-in AWS endpoint did not start"; cat "$WORK/endpoint.out"; exit 1; }
ENDPOINT=http://127.0.0.1:$(cat "$WORK/endpoint.port")
export AWS_ACCESS_KEY_ID=AKIASTANDIN AWS_SECRET_ACCESS_KEY=standin-secret  # signed as boto3 signs
cat >"$WORK/job.yaml" <<'SPEC'
cluster:
  scheduler: 127.0.0.1:7000
  servers: 1
  workers: 1
  shards: 4
  heartbeat_interval_ms: 500
  failure_timeout_ms: 3000
training:
  mode: sync
  batch_size: 32
  epochs: 1
  max_steps: 300
  shuffle: false
output:
  weights: s3://ps-out/job/weights.safetensors
  report: s3://ps-out/job/report.html
checkpoint:
  dir: s3://ps-out/job/checkpoints
  every_steps: 100
SPEC
deploy/ec2/launch.py up --spec "$WORK/job.yaml" --name boot --region eu-west-1 --endpoint-url "$ENDPOINT" \
  --vpc vpc-1 --subnet subnet-1 --release-url "$BOOT_STANDIN_RELEASE_URL" --worker-types g5.xlarge \
  --tls --work "$WORK/work" >"$WORK/up.out" 2>&1
check "launch.py up succeeds" grep -q "cluster boot started" "$WORK/up.out"
# The daemons run as the user ps: they write the stand-in's S3 objects and its log.
chmod a+x "$WORK"
chmod -R a+rwX "$AWS_STANDIN_ROOT"

echo "each role's user data booted in a throwaway root and network namespace"
unshare --net --mount --fork "$0" --inside-network "$WORK/work" "$AWS_STANDIN_ROOT/s3/ps-out/job/weights.safetensors" ""
for role in scheduler server worker; do
  facts=$WORK/facts-$role.txt
  log=$WORK/boot-$role/calls.log
  echo "$role:"
  check "cloud-init's runcmd finished" grep -qx "boot_status=0" "$facts"
  check "the cluster token came from SSM, readable by root and ps only" \
    grep -qx "file /etc/ps/cluster.token root:ps 640" "$facts"
  check "so did the TLS key" grep -qx "file /etc/ps/tls/node.key root:ps 640" "$facts"
  check "the CloudWatch agent got a valid config for the journal and the metrics" \
    grep -qx "cloudwatch config: valid JSON" "$facts"
  check "it was started" grep -q "^amazon-cloudwatch-agent-ctl -a fetch-config -m ec2 -s" "$log"
  check "the journal exporter was enabled" grep -qx "systemctl enable --now ps-journal-export.service" "$log"
  check "Debian's runtime libraries were installed" \
    grep -q "^apt-get install -y --no-install-recommends libabsl20220623 .*libgrpc++1.51" "$log"
done
check "the scheduler alone got the admin token" grep -qx "file /etc/ps/admin.token root:ps 640" "$WORK/facts-scheduler.txt"
check "the server did not" bash -c "! grep -q admin.token '$WORK/facts-server.txt'"
check "the worker's boot installed the NVIDIA driver, the CUDA runtime and cuBLAS" bash -c \
  "grep -q 'apt-get install -y --no-install-recommends cuda-cudart-13-0 libcublas-13-0' '$WORK/boot-worker/calls.log' &&
   grep -q 'apt-get install -y --no-install-recommends nvidia-open' '$WORK/boot-worker/calls.log' &&
   grep -q '^nvidia-smi -L' '$WORK/boot-worker/calls.log'"
check "the server's did not" bash -c "! grep -q -e nvidia -e cuda '$WORK/boot-server/calls.log'"
check "the scheduler's unit started with its flags and files" grep -qx \
  "started ps-scheduler.service: /opt/paramserver/bin/ps_scheduler --config /etc/ps/cluster.yaml --cluster_token_file /etc/ps/cluster.token --admin_token_file /etc/ps/admin.token --tls_dir /etc/ps/tls --listen 0.0.0.0:7000 --state_file /var/lib/ps/scheduler.state --report_file /var/lib/ps/report.html --metrics_port 9100 --metrics_host 0.0.0.0" \
  "$WORK/boot-scheduler/calls.log"
check "the server's" grep -qx \
  "started ps-server.service: /opt/paramserver/bin/ps_server --config /etc/ps/cluster.yaml --cluster_token_file /etc/ps/cluster.token --tls_dir /etc/ps/tls --listen 0.0.0.0:7001 --advertise imds --watch_spot_interruptions --metrics_port 9101 --metrics_host 0.0.0.0" \
  "$WORK/boot-server/calls.log"
check "the worker's" grep -qx \
  "started ps-worker.service: /opt/paramserver/bin/ps_worker --config /etc/ps/cluster.yaml --cluster_token_file /etc/ps/cluster.token --tls_dir /etc/ps/tls --listen 0.0.0.0:7002 --advertise imds --watch_spot_interruptions --metrics_port 9102 --metrics_host 0.0.0.0" \
  "$WORK/boot-worker/calls.log"
check "the server registered under the address the metadata service gave" \
  grep -q "registered with the scheduler at $SCHEDULER_IP:7000; serving on $SCHEDULER_IP:7001" "$WORK/boot-server/ps-server.service.log"
check "the worker says plainly that this machine has no GPU" \
  grep -q "no GPU on this machine" "$WORK/boot-worker/ps-worker.service.log"
check "the job finished" grep -q "final test_accuracy=" "$WORK/boot-scheduler/ps-scheduler.service.log"
check "the weights arrived in S3" test -s "$AWS_STANDIN_ROOT/s3/ps-out/job/weights.safetensors"
check "and the final report" grep -q '"verdict":"finished"' "$AWS_STANDIN_ROOT/s3/ps-out/job/report.html"

echo "every instance lost: launch.py up --resume brings the job back from its S3 checkpoints"
# The same job, longer (400 steps, where the lost one ended at 300), on a new cluster.
sed -e 's/^  max_steps: .*/  max_steps: 400/' -e 's|s3://ps-out/job/weights|s3://ps-out/job/resumed-weights|' \
  -e 's|s3://ps-out/job/report|s3://ps-out/job/resumed-report|' "$WORK/job.yaml" >"$WORK/resumed.yaml"
up_resume() {  # launch.py up --resume with SPEC, the user data into WORK_DIR
  deploy/ec2/launch.py up --resume --spec "$1" --name boot2 --region eu-west-1 --endpoint-url "$ENDPOINT" \
    --vpc vpc-1 --subnet subnet-1 --release-url "$BOOT_STANDIN_RELEASE_URL" --worker-types g5.xlarge \
    --tls --work "$2"
}
sed 's|s3://ps-out/job/checkpoints|/var/lib/ps/checkpoints|' "$WORK/resumed.yaml" >"$WORK/local-dir.yaml"
up_resume "$WORK/local-dir.yaml" "$WORK/work-local" >"$WORK/local-dir.out" 2>&1
check "a checkpoint.dir on an instance's disk is refused" grep -q \
  "launch.py: --resume: checkpoint.dir must be an s3:// prefix (the instances' own disks are lost with them); .* has '/var/lib/ps/checkpoints'" \
  "$WORK/local-dir.out"
sed 's|s3://ps-out/job/checkpoints|s3://ps-out/none/checkpoints|' "$WORK/resumed.yaml" >"$WORK/empty.yaml"
up_resume "$WORK/empty.yaml" "$WORK/work-empty" >"$WORK/empty.out" 2>&1
check "so is a prefix that holds no checkpoint" grep -q \
  "launch.py: --resume: s3://ps-out/none/checkpoints/ holds no checkpoint" "$WORK/empty.out"
up_resume "$WORK/resumed.yaml" "$WORK/work2" >"$WORK/up2.out" 2>&1
check "the resumed job's s3 listing went to S3's ListObjectsV2" grep -q \
  '^s3 ListObjectsV2 {"Bucket": "ps-out", "Delimiter": "/", "Prefix": "job/checkpoints/"}$' "$AWS_STANDIN_ROOT/calls.log"
check "launch.py up --resume succeeds" grep -q "resumes from    the newest complete checkpoint in s3://ps-out/job/checkpoints" "$WORK/up2.out"
chmod -R a+rwX "$AWS_STANDIN_ROOT"
unshare --net --mount --fork "$0" --inside-network "$WORK/work2" "$AWS_STANDIN_ROOT/s3/ps-out/job/resumed-weights.safetensors" "-2"
check "the instances' spec says checkpoint.resume: true" grep -q "resuming from the checkpoint at step 300 in s3://ps-out/job/checkpoints" \
  "$WORK/boot-scheduler-2/ps-scheduler.service.log"
check "the job trained on from step 300 to 400" grep -q "final test_accuracy=0\.[0-9]* samples_per_sec=[0-9]* steps=400" \
  "$WORK/boot-scheduler-2/ps-scheduler.service.log"
check "its weights arrived in S3" test -s "$AWS_STANDIN_ROOT/s3/ps-out/job/resumed-weights.safetensors"
if ((FAILURES > 0)); then
  cat "$WORK"/*.out
  for boot in scheduler server worker scheduler-2 server-2 worker-2; do
    echo "--- $boot"; cat "$WORK/facts-$boot.txt" "$WORK/boot-$boot/cloud-init.log" 2>/dev/null | tail -n 30
    tail -n 15 "$WORK/boot-$boot/"ps-*.service.log 2>/dev/null
  done
fi
finish
