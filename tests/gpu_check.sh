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
#       PyTorch at batch 32, 256 and 1024, every step with a timeout and 8 minutes at
#       most in all, and ends with a one-screen summary. Exits non-zero if any part
#       fails or any GPU figure is missing.
#   tests/gpu_check.sh --dry-run FILE|DIR      (here, no GPU) unpacks the bundle and
#       runs its CPU parts with the bundled loader, as the GPU machine will: the suite
#       does (tests/commands/gpu_bundle_test.sh), so the one GPU run is not wasted.
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
  local linked
  linked=$(ldd bazel-bin/worker/ps_worker)  # (not piped into grep -q: pipefail and SIGPIPE)
  if ! grep -q libcublas <<<"$linked"; then
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
  # xz -3 on every core: a few MB larger than the default level, several times faster.
  XZ_OPT="-3 -T0" tar -C "$stage" -cJf "$ROOT/out/gpu_bundle.tar.xz" gpu_bundle
  rm -rf "$stage"
  echo "bundle: out/gpu_bundle.tar.xz ($(du -h "$ROOT/out/gpu_bundle.tar.xz" | cut -f1)); on the GPU machine:"
  echo "  tests/gpu_check.sh --run-bundle out/gpu_bundle.tar.xz"
}

# The folders a bundled binary's libraries come from: the bundle's own, then
# LD_LIBRARY_PATH (ld.so --library-path replaces it, so it is passed on here), the usual
# CUDA folders, and wherever ldconfig knows a cuBLAS.
bundle_library_path() {
  local folders=("$B/lib")
  if [[ -n ${LD_LIBRARY_PATH:-} ]]; then folders+=("$LD_LIBRARY_PATH"); fi
  folders+=(/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64
    /usr/lib/x86_64-linux-gnu /usr/lib64)
  local found
  found=$(ldconfig -p 2>/dev/null | awk '/libcublas\.so|libcuda\.so/ {print $NF}' | xargs -r -n1 dirname | sort -u |
    tr '\n' ':')
  local joined
  joined=$(IFS=:; echo "${folders[*]}")
  echo "${joined}${found:+:${found%:}}"
}

# Runs a bundled binary with the bundled loader and libraries, then the machine's CUDA,
# for at most SECONDS. (exec: started with &, $! is the process itself.)
run_bundled() {
  local seconds=$1 binary=$2
  shift 2
  exec timeout --kill-after=5 "$seconds" "$B/lib/ld-linux-x86-64.so.2" --library-path "$LIBRARY_PATH_FOR_BUNDLE" \
    "$B/bin/$binary" "$@"
}

# Trains the sliced job on one server and one worker with --device $1, for at most 90 s;
# prints the accuracy.
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
  (run_bundled 100 ps_scheduler --config "$dir/job.yaml" --listen 127.0.0.1:0 --port_file "$dir/port") \
    >"$dir/scheduler.log" 2>&1 &
  local scheduler_pid=$!
  for _ in $(seq 100); do [[ -s $dir/port ]] && break; sleep 0.1; done
  if [[ ! -s $dir/port ]]; then
    echo "the bundled scheduler did not start:" >&2
    tail -n 20 "$dir/scheduler.log" >&2
    kill "$scheduler_pid" 2>/dev/null || true
    return 1
  fi
  local address="127.0.0.1:$(cat "$dir/port")"
  (run_bundled 100 ps_server --config "$dir/job.yaml" --scheduler "$address") >"$dir/server.log" 2>&1 &
  local server_pid=$!
  if ! (run_bundled 90 ps_worker --config "$dir/job.yaml" --scheduler "$address" --device "$device") \
      >"$dir/worker.log" 2>&1; then
    echo "worker ($device) failed:" >&2
    tail -n 20 "$dir/worker.log" >&2
    kill "$scheduler_pid" "$server_pid" 2>/dev/null || true
    return 1
  fi
  wait "$scheduler_pid" "$server_pid" || true
  grep -E "computing on|finished .* steps" "$dir/worker.log" | sed "s/^/  [$device] /" >&2
  grep -o "final test_accuracy=[0-9.]*" "$dir/scheduler.log" | cut -d= -f2
}

# run_checks BUNDLE [--dry-run]: the checks, each with a timeout, 8 minutes at most in all.
# A dry run (a machine without a GPU) runs the CPU parts with the bundled loader and
# expects the GPU parts to say there is no GPU; a real run fails loudly on any missing
# GPU figure.
run_checks() {
  local given=$1 dry_run=${2:-}
  if [[ -f $given ]]; then
    local unpack
    unpack=$(mktemp -d)
    tar -C "$unpack" -xJf "$given"
    B="$unpack/gpu_bundle"
  else
    B=$(cd "$given" && pwd)
  fi
  LIBRARY_PATH_FOR_BUNDLE=$(bundle_library_path)
  local failed=0 summary=()
  note() { summary+=("$*"); }
  fail() { summary+=("FAILED: $*"); failed=1; }
  # Whatever happens, no process of ours outlives the script.
  trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
  echo "library path: $LIBRARY_PATH_FOR_BUNDLE"

  echo "== GPU tests (45 s each)"
  for test in gpu_devices_test cuda_status_test cuda_backend_test; do
    local output result
    output=$( (run_bundled 45 "$test") 2>&1) && result=0 || result=$?
    local counts
    counts=$(grep -E "All tests passed|test cases" <<<"$output" | tail -n 1)
    echo "$output" | tail -n 5
    if ((result != 0)); then
      fail "$test (exit $result): $(tail -n 3 <<<"$output" | tr '\n' ' ')"
    elif grep -q "^SKIPPED" <<<"$output"; then
      if [[ -n $dry_run ]]; then note "$test: loads and runs; skips its GPU cases here (no GPU)"; else
        fail "$test skipped its GPU cases: $(grep -m1 '^SKIPPED' <<<"$output")"; fi
    else
      note "$test: $counts"
    fi
  done

  echo "== training (sync, 1 server x 1 worker, $TRAIN_SUBSET training examples, 3 epochs; 90 s each)"
  local gpu_accuracy="" cpu_accuracy=""
  cpu_accuracy=$(train_once cpu) || fail "training on the CPU"
  if [[ -z $dry_run ]]; then gpu_accuracy=$(train_once gpu) || fail "training on the GPU"; fi
  note "test accuracy: cpu=${cpu_accuracy:-none} gpu=${gpu_accuracy:-${dry_run:+not run here}}"
  [[ -n $cpu_accuracy ]] || fail "no CPU accuracy"
  if [[ -z $dry_run ]]; then
    if [[ -z $gpu_accuracy ]]; then
      fail "no GPU accuracy"
    elif awk -v g="$gpu_accuracy" -v c="$cpu_accuracy" 'BEGIN { d = g - c; exit !(d < 0.01 && d > -0.01) }'; then
      note "GPU and CPU workers agree within 1 point of accuracy"
    else
      fail "GPU ($gpu_accuracy) and CPU ($cpu_accuracy) accuracies differ by 1 point or more"
    fi
  fi

  echo "== step benchmark (compute only: parameters and batch in, gradient out; 60 s each)"
  local ours theirs
  ours=$( (run_bundled 60 worker_step_bench) 2>&1) || fail "worker_step_bench: $(tail -n 2 <<<"$ours" | tr '\n' ' ')"
  echo "$ours"
  if [[ -z $dry_run ]]; then
    theirs=$(timeout --kill-after=5 60 python3 "$B/pytorch_step_bench.py" 2>&1) || fail "pytorch_step_bench.py failed"
    echo "$theirs"
  fi
  local table
  table=$(printf "%-6s %14s %14s %14s %10s" batch gpu_samples/s cpu_samples/s pytorch/s gpu/pytorch)
  for batch in 32 256 1024; do
    local gpu cpu torch
    gpu=$(grep -o "backend=gpu batch=$batch samples_per_sec=[0-9]*" <<<"$ours" | cut -d= -f4 || true)
    cpu=$(grep -o "backend=cpu batch=$batch samples_per_sec=[0-9]*" <<<"$ours" | cut -d= -f4 || true)
    torch=$(grep -o "backend=pytorch batch=$batch samples_per_sec=[0-9]*" <<<"${theirs:-}" | cut -d= -f4 || true)
    table+=$'\n'$(printf "%-6s %14s %14s %14s %10s" "$batch" "${gpu:--}" "${cpu:--}" "${torch:--}" \
      "$(awk -v g="${gpu:-0}" -v t="${torch:-0}" 'BEGIN { if (t > 0) printf "%.2f", g / t; else print "-" }')")
    [[ -n $cpu ]] || fail "no CPU step figure at batch $batch"
    if [[ -z $dry_run ]]; then
      [[ -n $gpu ]] || fail "no GPU step figure at batch $batch"
      [[ -n $torch ]] || fail "no PyTorch (CUDA) step figure at batch $batch"
    fi
  done

  echo
  echo "== summary${dry_run:+ (dry run: no GPU here; the CPU parts, with the bundled loader)}"
  printf '%s\n' "${summary[@]}"
  echo "$table"
  if ((failed)); then
    echo "gpu_check: FAILED"
    exit 1
  fi
  echo "gpu_check: passed${dry_run:+ (dry run)}"
}

case "${1:-}" in
  --run-bundle)
    # The whole run in at most 8 minutes, whatever hangs.
    exec timeout --kill-after=10 480 bash "${BASH_SOURCE[0]}" --run-bundle-now "${2:?usage: tests/gpu_check.sh --run-bundle FILE|DIR}" ;;
  --run-bundle-now) run_checks "$2" ;;
  --dry-run) run_checks "${2:?usage: tests/gpu_check.sh --dry-run FILE|DIR}" --dry-run ;;
  "") bundle ;;
  *) echo "usage: tests/gpu_check.sh [--run-bundle FILE|DIR | --dry-run FILE|DIR]" >&2; exit 2 ;;
esac
