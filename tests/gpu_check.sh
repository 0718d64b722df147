#!/usr/bin/env bash
# The GPU check, in two halves.
#
#   tests/gpu_check.sh                         (here, no GPU needed) builds everything,
#       and bundles the binaries, every shared library they load except the GPU
#       machine's own CUDA libraries (libcuda, libcublas, libcublasLt), the dynamic
#       loader, a slice of Fashion-MNIST and the scripts into out/gpu_bundle.tar.xz.
#   tests/gpu_check.sh --run-bundle FILE|DIR   (on a machine with a GPU, the CUDA
#       toolkit and PyTorch, no Bazel or Debian libraries) runs the GPU tests, a short
#       training on the GPU and the same on the CPU, and the step benchmark against
#       PyTorch, in a few minutes. Exits non-zero if any part fails.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DATASET=/usr/share/datasets/fashion-mnist
TRAIN_SUBSET=12000

bundle() {
  cd "$ROOT"
  deploy/install_deps.sh
  local targets=(//scheduler:ps_scheduler //ps:ps_server //worker:ps_worker //bench:worker_step_bench
    //worker/cuda:gpu_devices_test //worker/cuda:cuda_status_test //worker/cuda:cuda_backend_test)
  bazel build -c opt --noshow_progress "${targets[@]}" >&2
  if ! ldd bazel-bin/worker/ps_worker | grep -q libcublas; then
    echo "gpu_check.sh: this build has no CUDA backend (no toolkit in /usr/local/cuda?)" >&2
    exit 1
  fi
  local stage
  stage=$(mktemp -d)
  local out="$stage/gpu_bundle"
  mkdir -p "$out/bin" "$out/lib" "$out/data"
  for target in "${targets[@]}"; do
    local path=${target#//}
    path=${path/://}
    cp -L "bazel-bin/$path" "$out/bin/"
    # Every library the binary loads, except the driver and cuBLAS (the GPU machine's own).
    ldd "bazel-bin/$path" | awk '/=> \//{print $3}' | grep -Ev '/(libcuda|libcublas|libcublasLt)\.so' |
      while read -r lib; do cp -Ln "$lib" "$out/lib/" 2>/dev/null || true; done
  done
  cp -L /lib64/ld-linux-x86-64.so.2 "$out/lib/"
  # A slice of the training set keeps the bundle small; the whole test set.
  /usr/bin/python3 - "$DATASET" "$out/data" "$TRAIN_SUBSET" <<'PY'
import gzip, struct, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for name, item in (("train-images-idx3-ubyte.gz", 784), ("train-labels-idx1-ubyte.gz", 1)):
    data = gzip.open(f"{src}/{name}").read()
    dims = data[3]
    header = bytearray(data[:4 + 4 * dims])
    header[4:8] = struct.pack(">I", n)
    with gzip.open(f"{dst}/{name}", "wb") as f:
        f.write(bytes(header) + data[4 + 4 * dims:4 + 4 * dims + n * item])
PY
  cp "$DATASET"/t10k-*.gz "$out/data/"
  cp bench/pytorch_step_bench.py tests/gpu_check.sh "$out/"
  mkdir -p "$ROOT/out"
  tar -C "$stage" -cJf "$ROOT/out/gpu_bundle.tar.xz" gpu_bundle
  rm -rf "$stage"
  echo "bundle: out/gpu_bundle.tar.xz ($(du -h "$ROOT/out/gpu_bundle.tar.xz" | cut -f1)); on the GPU machine:"
  echo "  tests/gpu_check.sh --run-bundle out/gpu_bundle.tar.xz"
}

# Runs a bundled binary with the bundled loader and libraries, then the machine's CUDA.
# (exec: started with &, $! is the daemon itself, so it can be stopped by its pid.)
run_bundled() {
  local binary=$1
  shift
  exec "$B/lib/ld-linux-x86-64.so.2" --library-path "$LIBRARY_PATH_FOR_BUNDLE" "$B/bin/$binary" "$@"
}

# Trains the sliced job on one server and one worker with --device $1; prints the accuracy.
train_once() {
  local device=$1 dir
  dir=$(mktemp -d)
  cat >"$dir/job.yaml" <<YAML
cluster: {scheduler: "127.0.0.1:0", servers: 1, workers: 1, shards: 4, heartbeat_interval_ms: 500, failure_timeout_ms: 3000}
model: {layers: [784, 128, 10], init_seed: 1}
training: {mode: sync, batch_size: 32, epochs: 3, shuffle: true, seed: 1}
data:
  train_images: $B/data/train-images-idx3-ubyte.gz
  train_labels: $B/data/train-labels-idx1-ubyte.gz
  test_images: $B/data/t10k-images-idx3-ubyte.gz
  test_labels: $B/data/t10k-labels-idx1-ubyte.gz
YAML
  (run_bundled ps_scheduler --config "$dir/job.yaml" --listen 127.0.0.1:0 --port_file "$dir/port") \
    >"$dir/scheduler.log" 2>&1 &
  local scheduler_pid=$!
  for _ in $(seq 100); do [[ -s $dir/port ]] && break; sleep 0.1; done
  local address="127.0.0.1:$(cat "$dir/port")"
  (run_bundled ps_server --config "$dir/job.yaml" --scheduler "$address") >"$dir/server.log" 2>&1 &
  local server_pid=$!
  if ! timeout 240 "$B/lib/ld-linux-x86-64.so.2" --library-path "$LIBRARY_PATH_FOR_BUNDLE" "$B/bin/ps_worker" \
      --config "$dir/job.yaml" --scheduler "$address" --device "$device" >"$dir/worker.log" 2>&1; then
    echo "worker ($device) failed:" >&2
    tail -n 20 "$dir/worker.log" >&2
    kill "$scheduler_pid" "$server_pid" 2>/dev/null || true
    return 1
  fi
  wait "$scheduler_pid" "$server_pid" || true
  grep -E "computing on|finished .* steps" "$dir/worker.log" | sed "s/^/  [$device] /" >&2
  grep -o "final test_accuracy=[0-9.]*" "$dir/scheduler.log" | cut -d= -f2
}

run_checks() {
  local given=$1
  if [[ -f $given ]]; then
    local unpack
    unpack=$(mktemp -d)
    tar -C "$unpack" -xJf "$given"
    B="$unpack/gpu_bundle"
  else
    B=$(cd "$given" && pwd)
  fi
  LIBRARY_PATH_FOR_BUNDLE="$B/lib:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:/usr/lib/x86_64-linux-gnu:/usr/lib64:/usr/local/nvidia/lib64"
  local failed=0

  echo "== GPU tests"
  # Whatever happens, no daemon of ours outlives the script.
  trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
  for test in gpu_devices_test cuda_status_test cuda_backend_test; do
    local output
    if output=$(run_bundled "$test" 2>&1) && ! grep -q "^SKIPPED" <<<"$output"; then
      echo "$test: $(grep -E "All tests passed|test cases" <<<"$output" | tail -n 1)"
    else
      echo "$test: FAILED"
      echo "$output" | tail -n 40
      failed=1
    fi
  done

  echo "== training (sync, 1 server x 1 worker, $TRAIN_SUBSET training examples, 3 epochs)"
  local gpu_accuracy cpu_accuracy
  gpu_accuracy=$(train_once gpu) || failed=1
  cpu_accuracy=$(train_once cpu) || failed=1
  echo "test_accuracy gpu=${gpu_accuracy:-none} cpu=${cpu_accuracy:-none}"
  if [[ -n ${gpu_accuracy:-} && -n ${cpu_accuracy:-} ]]; then
    if awk -v g="$gpu_accuracy" -v c="$cpu_accuracy" 'BEGIN { d = g - c; exit !(d < 0.01 && d > -0.01) }'; then
      echo "GPU and CPU workers agree within 1 point"
    else
      echo "FAILED: GPU and CPU accuracies differ by 1 point or more"
      failed=1
    fi
  fi

  echo "== step benchmark (compute only: parameters and batch in, gradient out; no pull or push)"
  local ours theirs
  ours=$( (run_bundled worker_step_bench) ) || failed=1
  theirs=$(timeout 120 python3 "$B/pytorch_step_bench.py" 2>&1) || { echo "$theirs"; failed=1; }
  echo "$ours"
  echo "$theirs"
  printf "%-6s %14s %14s %14s %10s\n" batch gpu_samples/s cpu_samples/s pytorch/s gpu/pytorch
  for batch in 32 256 1024; do
    local gpu cpu torch
    gpu=$(grep -o "backend=gpu batch=$batch samples_per_sec=[0-9]*" <<<"$ours" | cut -d= -f4 || true)
    cpu=$(grep -o "backend=cpu batch=$batch samples_per_sec=[0-9]*" <<<"$ours" | cut -d= -f4 || true)
    torch=$(grep -o "backend=pytorch batch=$batch samples_per_sec=[0-9]*" <<<"$theirs" | cut -d= -f4 || true)
    printf "%-6s %14s %14s %14s %10s\n" "$batch" "${gpu:-?}" "${cpu:-?}" "${torch:-?}" \
      "$(awk -v g="${gpu:-0}" -v t="${torch:-0}" 'BEGIN { if (t > 0) printf "%.2f", g / t; else print "?" }')"
  done
  if ((failed)); then
    echo "gpu_check: FAILED"
    exit 1
  fi
  echo "gpu_check: passed"
}

if [[ ${1:-} == --run-bundle ]]; then
  run_checks "${2:?usage: tests/gpu_check.sh --run-bundle FILE|DIR}"
else
  bundle
fi
