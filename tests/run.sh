#!/usr/bin/env bash
# Runs the test suite: installs what it needs, builds, runs the tests, and ends with the
# line "N passed, N failed" (", N skipped" when tests were skipped), counting Catch2 test
# cases (tests/tally.sh says exactly how). Exit status 0 only when nothing failed.
#   tests/run.sh        what a contributor needs: the build, every Bazel test, the format
#                       check and the README's commands as a user types them
#   tests/run.sh --all  all that, then the unit tests once more as on a CPU without AVX2,
#                       the clang thread-safety build with ASan+UBSan, the sanitizers'
#                       unit tests, every fuzz target for 10 s and a quick benchmark run:
#                       what CI runs (.ci/run)
# Usage: tests/run.sh [--all] [extra bazel test arguments]
set -uo pipefail
ALL=0
if [[ ${1:-} == --all ]]; then
  ALL=1
  shift
fi

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
"$ROOT/deploy/install_deps.sh" || { echo "0 passed, 1 failed"; exit 1; }

LOG=$(mktemp /tmp/ps-tests.XXXXXX.log)
# How long each part took, printed before the summary (CI's time is a budget).
TIMES=()
stage_started=$SECONDS
took() {
  TIMES+=("$(printf '%5d s  %s' $((SECONDS - stage_started)) "$1")")
  stage_started=$SECONDS
}
# One bazel test builds everything (//... holds the daemons, tools and benchmarks too) and
# runs each test as soon as it is built, beside the rest of the build; the cluster tests
# (tagged exclusive) run one at a time once everything else is done.
echo "build and test: bazel test -c opt //..." >&2
bazel test -c opt --noshow_progress --test_output=errors //... "$@" 2>&1 | tee "$LOG"
bazel_status=${PIPESTATUS[0]}
took "the build and the Bazel tests (bazel test //...)"

passed=0
failed=0
skipped=0
source "$ROOT/tests/tally.sh"
TESTLOGS=$(bazel info -c opt bazel-testlogs 2>/dev/null)
bazel query 'tests(//...)' >"$LOG.targets" 2>"$LOG.query" || cat "$LOG.query" >&2
tally_bazel "$LOG" "$TESTLOGS" "$LOG.targets"
# one_test WHAT LOG COMMAND...: COMMAND counts as one test, passed when it exits 0; on
# failure the end of its output (in LOG) is shown, then "FAILED: WHAT".
one_test() {
  local what=$1 log=$2
  shift 2
  if "$@" >"$log" 2>&1; then
    passed=$((passed + 1))
  else
    tail -n 60 "$log" >&2
    echo "FAILED: $what" >&2
    failed=$((failed + 1))
  fi
}
# Every C++ file formatted as .clang-format says (one test).
echo "format check: tests/format_check.sh" >&2
one_test "the format check" "$LOG.format" "$ROOT/tests/format_check.sh"
took "the format check"
# The README's commands, run as a user types them (tests/commands/*_test.sh): each counts
# as one test. They build what they run, from the cache the bazel test above filled.
for command_test in "$ROOT"/tests/commands/*_test.sh; do
  name=${command_test#"$ROOT/"}
  echo "command test: $name" >&2
  "$command_test" >"$LOG.command" 2>&1
  command_status=$?
  # On failure: its checks and messages (not the daemons' timestamped log lines), then
  # the launchers' output that lib.sh's finish prints, whole.
  if ((command_status != 0)); then
    grep -Ev "^[0-9]{4}-[0-9]{2}-[0-9]{2} " "$LOG.command" | tail -n 80 >&2
    echo "--- the launchers' output:" >&2
    sed -n "/check(s) failed; the launchers' output:/,\$p" "$LOG.command" | head -n 200 >&2
    echo "--- the end of its output:" >&2
    tail -n 20 "$LOG.command" >&2
  fi
  tally_command_test "$name" "$LOG.command" "$command_status"
  took "$name"
done
if ((ALL)); then
  # Once more as on a CPU without AVX2, wherever CI runs: our per-CPU code paths forced to
  # the x86-64 baseline (PS_CPU_BASELINE=1) and OpenBLAS to its pre-AVX kernels
  # (OPENBLAS_CORETYPE=Prescott). The unit tests and the PyTorch agreement test, counted as
  # one test (the same binaries, so no rebuild).
  echo "baseline CPU run: PS_CPU_BASELINE=1 OPENBLAS_CORETYPE=Prescott" >&2
  baseline_targets=$(bazel query 'attr(size, small, tests(//...)) + //tests:pytorch_agreement_test' 2>/dev/null)
  if [[ -z $baseline_targets ]]; then
    echo "FAILED: the baseline CPU run (bazel query found no targets)" >&2
    failed=$((failed + 1))
  else
    # shellcheck disable=SC2086 # one word per target
    one_test "the baseline CPU run" "$LOG.baseline" bazel test -c opt --noshow_progress \
      --test_output=errors --test_env=PS_CPU_BASELINE=1 --test_env=OPENBLAS_CORETYPE=Prescott \
      $baseline_targets
  fi
  took "the baseline CPU run"
  # Every package but bench/ built by clang with -Werror=thread-safety and without CUDA (a machine
  # without the toolkit builds the CPU-only worker), the unit tests under ASan+UBSan and
  # the concurrency-heavy ones under TSan (each counts as one test), and every fuzz target
  # for a short while (each counts as one test); the longer run is tests/fuzz.sh 60.
  echo "sanitizers: tests/sanitize.sh" >&2
  "$ROOT/tests/sanitize.sh" >"$LOG.sanitize" 2>&1
  cat "$LOG.sanitize" >&2
  passed=$((passed + $(grep -c "^sanitize .*: passed$" "$LOG.sanitize")))
  failed=$((failed + $(grep -c "^sanitize .*: FAILED" "$LOG.sanitize")))
  if ! grep -q "^sanitize tsan: " "$LOG.sanitize"; then failed=$((failed + 1)); fi
  took "the sanitizers (tests/sanitize.sh)"
  echo "fuzzing: tests/fuzz.sh 10" >&2
  "$ROOT/tests/fuzz.sh" 10 >"$LOG.fuzz" 2>&1
  cat "$LOG.fuzz" >&2
  fuzz_summary=$(grep -Eo "^fuzz: [0-9]+ clean, [0-9]+ failed" "$LOG.fuzz" | tail -n 1)
  if [[ -n $fuzz_summary ]]; then
    passed=$((passed + $(sed -E 's/fuzz: ([0-9]+) clean.*/\1/' <<<"$fuzz_summary")))
    failed=$((failed + $(sed -E 's/.*clean, ([0-9]+) failed/\1/' <<<"$fuzz_summary")))
  else
    failed=$((failed + 1))
  fi
  took "fuzzing (tests/fuzz.sh 10)"
  # The benchmark suite must keep working from a fresh clone: a quick run of every part
  # (one repeat, small sizes; the figures are not judged here, only that each was made).
  echo "benchmark smoke run: bench/run.sh --quick" >&2
  one_test "bench/run.sh --quick" "$LOG.bench" "$ROOT/bench/run.sh" --quick
  took "the benchmark smoke run"
fi
echo "time taken, by part:" >&2
printf '%s\n' "${TIMES[@]}" >&2
echo "$(printf '%5d' "$SECONDS") s  in all" >&2
if ((bazel_status != 0 && failed == 0)); then
  echo "bazel test exited with $bazel_status" >&2
  failed=1
fi
summary="$passed passed, $failed failed"
if ((skipped > 0)); then summary+=", $skipped skipped"; fi
echo "$summary"
((failed == 0))
