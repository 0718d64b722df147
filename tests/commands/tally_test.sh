#!/usr/bin/env bash
# tests/tally.sh against fake test logs: the counting cases tests/run.sh once got wrong.
set -uo pipefail
TALLY=${1:-$(dirname "${BASH_SOURCE[0]}")/../tally.sh}
source "$TALLY"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
problems=0

# expect WHAT PASSED FAILED SKIPPED: the globals after the last tally.
expect() {
  if [[ "$passed $failed $skipped" != "$2 $3 $4" ]]; then
    echo "FAILED: $1: counted $passed passed, $failed failed, $skipped skipped; expected $2, $3, $4"
    problems=$((problems + 1))
  else
    echo "ok: $1"
  fi
}
reset() { passed=0; failed=0; skipped=0; }
log() { mkdir -p "$(dirname "$dir/$1")"; printf '%s\n' "${@:2}" >"$dir/$1"; }

reset
log a.log "All tests passed (12 assertions in 3 test cases)"
tally_test_log //a:a "$dir/a.log" 1 2>/dev/null
expect "a passing Catch2 binary counts its cases" 3 0 0

reset
log b.log "test cases: 4 | 4 failed" "assertions: 9 | 9 failed"
tally_test_log //b:b "$dir/b.log" 0 2>/dev/null
expect "every case failing (Catch2 omits the passed column) counts every case" 0 4 0

reset
log c.log "SKIPPED: no usable GPU" "SKIPPED: no usable GPU" "test cases: 5 | 3 passed | 2 failed"
tally_test_log //c:c "$dir/c.log" 0 2>/dev/null
expect "skips inside a failing binary are skipped, not passed" 1 2 2

reset
log d.log "SKIPPED: no usable GPU" "All tests passed (4 assertions in 2 test cases)"
tally_test_log //d:d "$dir/d.log" 1 2>/dev/null
expect "a skip inside a passing binary is skipped" 1 0 1

reset
log e.log "test cases: 2 | 2 passed"
tally_test_log //e:e "$dir/e.log" 1 2>/dev/null
expect "cases without assertions count" 2 0 0

reset
log f.log "Segmentation fault (core dumped)"
tally_test_log //f:f "$dir/f.log" 0 2>/dev/null
tally_test_log //g:g "$dir/absent.log" 0 2>/dev/null
expect "a crash and a build error (no log) count one failure each" 0 2 0

reset
log h.log "ok"
tally_test_log //h:h "$dir/h.log" 1 2>/dev/null
expect "a passing non-Catch2 test counts one" 1 0 0

reset
log i.log "All tests passed (3 assertions in 1 test case)" "==1== LeakSanitizer: detected memory leaks"
tally_test_log //i:i "$dir/i.log" 0 2>/dev/null
expect "a binary that failed after its cases passed counts one failure" 1 1 0

reset
: >"$dir/no-targets"
tally_bazel "$dir/bazel.out" "$dir/testlogs" "$dir/no-targets" 2>/dev/null
tally_bazel "$dir/bazel.out" "$dir/testlogs" "$dir/missing-targets" 2>/dev/null
expect "a failed bazel query (no targets) is a failure, not zero tests" 0 2 0

reset
printf '//x:x_test\n//y:y_test\n' >"$dir/targets"
printf '//x:x_test                     (cached) PASSED in 0.1s\n//y:y_test                     FAILED in 0.2s\n' >"$dir/bazel.out"
log testlogs/x/x_test/test.log "All tests passed (1 assertion in 1 test case)"
log testlogs/y/y_test/test.log "test cases: 3 | 1 passed | 2 failed"
tally_bazel "$dir/bazel.out" "$dir/testlogs" "$dir/targets" 2>/dev/null
expect "Bazel's verdicts and the logs together" 2 2 0

reset
printf 'SKIPPED: no room for a tmpfs\n' >"$dir/cmd.out"
tally_command_test skipped "$dir/cmd.out" 0
tally_command_test failing "$dir/cmd.out" 1 2>/dev/null
printf 'passed\n' >"$dir/cmd2.out"
tally_command_test passing "$dir/cmd2.out" 0
expect "command tests: skipped, failed, passed" 1 1 1

if ((problems > 0)); then exit 1; fi
echo "tally_test: passed"
