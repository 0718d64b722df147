#!/usr/bin/env bash
# The unit tests under the sanitizers, each build in an output base of its own (clang with
# -Werror=thread-safety, no CUDA):
#  - every package but bench/ built with clang's thread-safety analysis and without CUDA (proving
#    that a machine without the toolkit builds the CPU-only worker), under ASan + UBSan:
#    the same build the fuzzers (tests/fuzz.sh) use;
#  - AddressSanitizer + UndefinedBehaviorSanitizer (and LeakSanitizer): every unit test
#    of common, ps, scheduler, worker and psctl;
#  - ThreadSanitizer: the concurrency-heavy ones (the shard, the replicator, the service,
#    the registry, the worker's client and trainer), after a self-check that proves the
#    run can fail (a race is reported, a Mutex-guarded counter is not).
# Prints "sanitize thread-safety build: passed|FAILED", "sanitize asan+ubsan:
# passed|FAILED" and "sanitize tsan: passed|FAILED". Exit status 0 only when all passed. Usage: tests/sanitize.sh
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
"$ROOT/deploy/install_deps.sh" || exit 1
LOG=$(mktemp /tmp/paramserver-sanitize.XXXXXX.log)
failed=0

# The end of each failed test's own log (named in bazel's "FAIL: //target (see ...)"
# lines of $1): a crash's signal and stack are there, often past the first 40 matches.
show_failed_test_logs() {
  local test_log
  grep -oE "^FAIL: //[^ ]+ \(see [^)]+\)" "$1" | sed -E 's/.*\(see (.*)\)/\1/' | sort -u |
    while read -r test_log; do
      echo "--- the end of $test_log:" >&2
      tail -n 60 "$test_log" >&2
    done
}

source "$ROOT/tests/output_bases.sh"
SANITIZE=(--output_base="$SANITIZE_OUTPUT_BASE")
SANITIZE_ARGS=(--config=sanitize --noshow_progress --symlink_prefix=/tmp/paramserver-sanitize-)
if bazel "${SANITIZE[@]}" build "${SANITIZE_ARGS[@]}" //common/... //proto/... //ps/... //worker/... \
    //scheduler/... //psctl/... //tools/... //tests/... >"$LOG.build" 2>&1; then
  echo "sanitize thread-safety build: passed"
else
  { grep -E "ERROR|error:" "$LOG.build"; grep "warning:" "$LOG.build"; } | head -n 40 >&2
  echo "sanitize thread-safety build: FAILED (log: $LOG.build)"
  failed=1
fi
if bazel "${SANITIZE[@]}" test "${SANITIZE_ARGS[@]}" --test_output=errors \
    //common/... //ps/... //scheduler/... //worker/... //psctl/... >"$LOG" 2>&1; then
  echo "sanitize asan+ubsan: passed"
else
  grep -E "FAILED|ERROR|runtime error|AddressSanitizer|LeakSanitizer|SUMMARY" "$LOG" | head -n 40 >&2
  show_failed_test_logs "$LOG"
  echo "sanitize asan+ubsan: FAILED (log: $LOG)"
  failed=1
fi

TSAN_BASE=$TSAN_OUTPUT_BASE
TSAN_ARGS=(--config=tsan --noshow_progress --symlink_prefix=/tmp/paramserver-tsan-)
export TSAN_OPTIONS="suppressions=$ROOT/tests/tsan_suppressions.txt halt_on_error=1"
tsan_ok=1
if bazel --output_base="$TSAN_BASE" build "${TSAN_ARGS[@]}" //common/testing:tsan_self_check >"$LOG.tsan" 2>&1; then
  check="$(bazel --output_base="$TSAN_BASE" info "${TSAN_ARGS[@]}" bazel-bin 2>/dev/null)/common/testing/tsan_self_check"
  if ! "$check" guarded >"$LOG.guarded" 2>&1; then
    echo "tsan self-check: a Mutex-guarded counter was reported" >&2
    tsan_ok=0
  fi
  if "$check" unguarded >"$LOG.unguarded" 2>&1 || ! grep -q "ThreadSanitizer: data race" "$LOG.unguarded"; then
    echo "tsan self-check: an unguarded race went unreported" >&2
    tsan_ok=0
  fi
else
  tail -n 20 "$LOG.tsan" >&2
  tsan_ok=0
fi
if ((tsan_ok)) && bazel --output_base="$TSAN_BASE" test "${TSAN_ARGS[@]}" --test_output=errors \
    --test_env=TSAN_OPTIONS="$TSAN_OPTIONS" \
    //ps:parameter_shard_test //ps:parameter_shard_log_test //ps:parameter_shard_refusal_test \
    //ps:consistency_gate_test //ps:shard_replicator_test //ps:parameter_server_service_test \
    //ps:parameter_server_service_push_test //ps:replica_applier_test \
    //scheduler:cluster_registry_test //scheduler:cluster_registry_recovery_test \
    //scheduler:cluster_registry_status_test //scheduler:map_wait_list_test \
    //scheduler:scheduler_service_test //worker:trainer_test //tests:streamed_push_test \
    //common/security:refusal_log_test //common/ops:metrics_test \
    //common/rpc:progress_watchdog_test //ps:shard_host_test //tests:table_export_test \
    >>"$LOG.tsan" 2>&1; then
  echo "sanitize tsan: passed"
else
  grep -E "FAILED|ERROR|WARNING: ThreadSanitizer|SUMMARY|#[0-9] " "$LOG.tsan" | head -n 40 >&2
  show_failed_test_logs "$LOG.tsan"
  echo "sanitize tsan: FAILED (log: $LOG.tsan)"
  failed=1
fi
((failed == 0))
