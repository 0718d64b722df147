#!/usr/bin/env bash
# A Bazel test of the Python package: the package as Bazel built it on PYTHONPATH,
# Debian's python3 (with python3-torch) running tests/python/runner.py on the modules
# given as arguments.
set -euo pipefail
RUNFILES="$TEST_SRCDIR/paramserver"
export PYTHONPATH="$RUNFILES/python:$RUNFILES/tests/python:$RUNFILES/tests"
exec /usr/bin/python3 "$RUNFILES/tests/python/runner.py" "$@"
