#!/usr/bin/env bash
# Kubernetes manifests from the cluster spec, as the README has it:
#   deploy/k8s/render.py SPEC > job.yaml
# for three specs (the dense reference job, the CTR job, a PyTorch script's), with GPUs
# and IRSA; every object parsed and checked against what the daemons read
# (tests/k8s_manifests.py check: names, selectors, ports, probes, volumes, the Secret's
# and the ConfigMap's files, each flag the daemon's own). No API server can be installed
# here: tests/commands/container_test.sh runs the rendered pods in podman instead.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

render_and_check() {
  local spec=$1 out=$2
  shift 2
  (cd "$ROOT" && deploy/k8s/render.py "$spec" "$@") >"$out" 2>"$out.err"
  local rendered=$?
  check "render.py $spec${*:+ $*} exits 0" test "$rendered" -eq 0
  [[ $spec == /* ]] || spec=$ROOT/$spec
  /usr/bin/python3 "$ROOT/tests/k8s_manifests.py" check "$spec" "$out" "$ROOT/bazel-bin" >"$out.check" 2>&1
  local checked=$?
  check "its manifests pass $(grep -c '^ok' "$out.check") checks, none failed" test "$checked" -eq 0
  grep -v '^ok' "$out.check" | sed 's/^/    /'
}

for spec in deploy/local/fashion_mnist.yaml deploy/local/ctr.yaml examples/pytorch_cnn/job.yaml; do
  echo "deploy/k8s/render.py $spec"
  render_and_check "$spec" "$WORK/$(basename "$(dirname "$spec")")-$(basename "$spec" .yaml).yaml"
done
check "the CTR job's local data paths are named as needing S3 or a volume" \
  grep -q "note: data.train is a path on the pods' own disks" "$WORK/local-ctr.yaml.err"
check "the torch job's ConfigMap carries its script" \
  /usr/bin/python3 -c "
import yaml, sys
objs = [o for o in yaml.safe_load_all(open('$WORK/pytorch_cnn-job.yaml')) if o]
cm = [o for o in objs if o['kind'] == 'ConfigMap'][0]
sys.exit(0 if cm['data']['train.py'] == open('$ROOT/examples/pytorch_cnn/train.py').read() else 1)"

echo "GPU workers, IRSA, a namespace, an existing Secret"
render_and_check deploy/local/fashion_mnist.yaml "$WORK/gpu.yaml" --name mnist-gpu --namespace training \
  --gpus-per-worker 1 --role-arn arn:aws:iam::123456789012:role/ps-job --token-secret ps-tokens
check "each worker asks for one nvidia.com/gpu, from the CUDA image" /usr/bin/python3 -c "
import yaml, sys
objs = [o for o in yaml.safe_load_all(open('$WORK/gpu.yaml')) if o]
worker = [o for o in objs if o['metadata']['name'] == 'mnist-gpu-worker'][0]['spec']['template']['spec']['containers'][0]
ok = worker['resources']['limits']['nvidia.com/gpu'] == 1 and worker['image'].startswith('paramserver-cuda:')
account = [o for o in objs if o['kind'] == 'ServiceAccount'][0]
ok = ok and account['metadata']['annotations']['eks.amazonaws.com/role-arn'] == 'arn:aws:iam::123456789012:role/ps-job'
ok = ok and all(o['metadata']['namespace'] == 'training' for o in objs)
ok = ok and not any(o['kind'] == 'Secret' for o in objs)
sys.exit(0 if ok else 1)"

echo "a flow-style spec renders; bad input is refused, naming what is wrong"
cat >"$WORK/flow.yaml" <<'SPEC'
cluster: {scheduler: "127.0.0.1:0", servers: 3, workers: 2, shards: 6, replication: 3}
model: {type: mlp, layers: [784, 128, 10]}
SPEC
render_and_check "$WORK/flow.yaml" "$WORK/flow-out.yaml"
check "replication 3: the disruption budget lets 2 servers go" grep -q "maxUnavailable: 2" "$WORK/flow-out.yaml"
cat >"$WORK/range.yaml" <<'SPEC'
cluster: {scheduler: "127.0.0.1:0", servers: {min: 2, max: 4}, workers: {min: 1, max: 3}, shards: 8}
model: {type: mlp, layers: [784, 128, 10]}
SPEC
render_and_check "$WORK/range.yaml" "$WORK/range-out.yaml"
check "ranges start with their min: 2 servers, 1 worker" /usr/bin/python3 -c "
import yaml, sys
objs = [o for o in yaml.safe_load_all(open('$WORK/range-out.yaml')) if o]
sts = [o for o in objs if o['kind'] == 'StatefulSet'][0]
job = [o for o in objs if o['metadata']['name'].endswith('-worker') and o['kind'] == 'Job'][0]
sys.exit(0 if sts['spec']['replicas'] == 2 and job['spec']['parallelism'] == 1 else 1)"
refused() {
  local message=$1
  shift
  (cd "$ROOT" && deploy/k8s/render.py "$@") >/dev/null 2>"$WORK/refused.err"
  local status=$?
  check "refused (exit 2): $message" test "$status" -eq 2 -a -n "$(grep -F -- "$message" "$WORK/refused.err")"
}
printf 'cluster: {servers: 0, workers: 2}\n' >"$WORK/zero.yaml"
refused "cluster.servers must be a whole number of at least 1, or {min: N, max: M} with 1 <= N <= M, found 0" "$WORK/zero.yaml"
printf 'cluster: [1, 2\n' >"$WORK/broken.yaml"
refused "not YAML" "$WORK/broken.yaml"
refused "cannot read the spec" "$WORK/missing.yaml"
refused "--name 'Bad_Name'" deploy/local/fashion_mnist.yaml --name Bad_Name
printf 'cluster: {servers: 2, workers: 2}\nworker: {device: gpu}\n' >"$WORK/gpu-spec.yaml"
refused "worker.device is gpu: give the workers GPUs (--gpus-per-worker N)" "$WORK/gpu-spec.yaml"

finish
