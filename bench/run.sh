#!/usr/bin/env bash
# The benchmark suite: installs what it needs, builds, runs every benchmark and prints
# one table of ratios, each measured in the same run against a peer or a physical limit
# (this machine is shared and noisy: rounds are interleaved and repeated, medians kept).
#
# Usage: bench/run.sh [--repeats N] [--epochs E] [--quick] [--json FILE]
#   --repeats N  interleaved repeats of every measurement (default 3)
#   --epochs E   epochs of the end-to-end Fashion-MNIST jobs (default 1)
#   --quick      1 repeat, a 4M-parameter transport model, end-to-end jobs of at most
#                300 steps: a smoke run of every part
#   --json FILE  also write every figure as JSON
# docs/PERFORMANCE.md explains each row and has the table from a full run; the CTR
# rows (bench/ctr_bench.py, a second table) are in docs/SPARSE.md, the stragglers'
# (bench/straggler_bench.py, a third) in docs/FAULT_TOLERANCE.md, the Python package's
# (bench/python_bench.py, a fourth) in docs/PYTHON.md.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$ROOT/deploy/install_deps.sh"
(cd "$ROOT" && bazel build -c opt --noshow_progress //bench:dense_optimizer_bench //bench:transport_bench \
  //bench:embedding_table_bench //bench:embedding_checkpoint_bench //bench:control_plane_bench \
  //bench:shard_copy_bench //bench:embedding_server_bench //bench:simulated_nodes \
  //tools:ps_ctr_generate \
  //scheduler:ps_scheduler //ps:ps_server //worker:ps_worker //worker:blas_kernels_probe \
  //python:paramserver) >&2
# Every process of the bench, ours and the peers (PyTorch on the same OpenBLAS), computes
# with the kernels ps_worker would pick for this CPU (worker/blas_kernels.h): the ratios
# compare parameter servers, not BLAS kernels. A user's OPENBLAS_CORETYPE stands.
if [[ -z "${OPENBLAS_CORETYPE:-}" ]]; then
  OPENBLAS_CORETYPE=$("$ROOT/bazel-bin/worker/blas_kernels_probe" | sed -n 's/^core=//p')
  export OPENBLAS_CORETYPE
fi
/usr/bin/python3 "$ROOT/bench/run_all.py" --root "$ROOT" "$@"
# The CTR job's figures (docs/SPARSE.md): its own table.
/usr/bin/python3 "$ROOT/bench/ctr_bench.py" --root "$ROOT" "$@"
# Stragglers and backup workers (docs/FAULT_TOLERANCE.md): its own table.
/usr/bin/python3 "$ROOT/bench/straggler_bench.py" --root "$ROOT" "$@"
# The Python package's figures (docs/PYTHON.md): its own table.
exec /usr/bin/python3 "$ROOT/bench/python_bench.py" --root "$ROOT" "$@"
