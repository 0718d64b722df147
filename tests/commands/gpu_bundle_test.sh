#!/usr/bin/env bash
# The GPU check's bundle, dry-run here: built, unpacked in a clean folder, its CPU parts
# run with the bundled loader and libraries (tests/gpu_check.sh --dry-run). Skipped where
# the CUDA toolkit is absent (no bundle can be built).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
if [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
  echo "SKIPPED: no CUDA toolkit in /usr/local/cuda: no GPU bundle to build"
  exit 0
fi
cd "$ROOT"
rm -f out/gpu_bundle.tar.xz  # this run's bundle, not an older one
check "the bundle builds" bash -c "tests/gpu_check.sh >'$WORK/bundle.txt' 2>&1"
mkdir -p "$WORK/clean"
cp out/gpu_bundle.tar.xz "$WORK/clean/"
# From a clean folder, with LD_LIBRARY_PATH naming a folder (where a GPU machine might
# keep its cuBLAS): the bundled loader must search it, after the bundle's own libraries.
mkdir -p "$WORK/cuda-elsewhere"
check "its CPU parts run with the bundled loader" bash -c \
  "cd '$WORK/clean' && LD_LIBRARY_PATH='$WORK/cuda-elsewhere' '$ROOT/tests/gpu_check.sh' --dry-run gpu_bundle.tar.xz >'$WORK/dry.txt' 2>&1"
check "the loader searches LD_LIBRARY_PATH" grep -q "^library path: [^:]*/gpu_bundle/lib:$WORK/cuda-elsewhere:" "$WORK/dry.txt"
check "it says so" grep -q "^gpu_check: passed (dry run)" "$WORK/dry.txt"
check "the summary has the CPU accuracy" grep -Eq "^test accuracy: cpu=0\.[0-9]+" "$WORK/dry.txt"
check "and a CPU step figure at batch 32, 256 and 1024" \
  test "$(grep -Ec '^(32|256|1024) +- +[0-9]+ ' "$WORK/dry.txt")" -eq 3
if ((FAILURES > 0)); then tail -n 40 "$WORK/bundle.txt" "$WORK/dry.txt"; fi
finish
