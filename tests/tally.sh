# Counting test results for tests/run.sh: sourced; adds to the globals `passed`,
# `failed` and `skipped`, and names on stderr every test it could not count as passed.
# tests/tally_test.sh checks it against fake logs.

# tally_test_log TARGET LOG BAZEL_SAYS_PASSED: one test binary's log.
#  - A Catch2 binary counts its test cases. Its summary is one of
#      "All tests passed (A assertions in N test cases)"
#      "test cases: N | P passed"                (no assertion ran)
#      "test cases: N | P passed | F failed"
#      "test cases: N | F failed"                (every case failed: no "passed" column)
#  - A case that had nothing to run here prints "SKIPPED: <reason>" and counts as
#    skipped, not passed, whether the binary passed or failed.
#  - Any other test (a shell test) counts as 1.
#  - A failed binary with no summary (a crash, a timeout, a build error) counts as 1 failed.
tally_test_log() {
  local target=$1 log=$2 bazel_passed=$3
  local summary="" total=0 ok=0 bad=0 skips=0
  if [[ -f $log ]]; then
    skips=$(grep -c "^SKIPPED: " "$log")
    summary=$(grep -E "^All tests passed \([0-9]+ assertions? in [0-9]+ test cases?\)|^test cases: *[0-9]+ \|" "$log" | tail -n 1)
  fi
  if [[ $summary =~ ^All\ tests\ passed\ \([0-9]+\ assertions?\ in\ ([0-9]+)\ test\ cases?\) ]]; then
    total=${BASH_REMATCH[1]}
    ok=$total
  elif [[ $summary =~ ^test\ cases:\ *([0-9]+) ]]; then
    total=${BASH_REMATCH[1]}
    [[ $summary =~ \|\ *([0-9]+)\ passed ]] && ok=${BASH_REMATCH[1]}
    [[ $summary =~ \|\ *([0-9]+)\ failed ]] && bad=${BASH_REMATCH[1]}
    if ((ok + bad != total)); then
      echo "FAILED (a Catch2 summary that does not add up: $summary): $target" >&2
      failed=$((failed + 1))
      return
    fi
  elif [[ $bazel_passed == 1 ]]; then
    # Not Catch2: one test, less any skip it declared.
    total=1
    ok=1
  else
    echo "FAILED (no test results: a crash, a timeout or a build error): $target" >&2
    failed=$((failed + 1))
    return
  fi
  if [[ $bazel_passed == 1 && $bad -gt 0 ]]; then
    echo "FAILED (Bazel says passed, its log says $bad failed): $target" >&2
  fi
  if [[ $bazel_passed != 1 && $bad -eq 0 ]]; then
    # Every case passed, yet the binary failed (an exit after the summary, a leak check):
    # one failure for the binary.
    echo "FAILED (its cases passed, the binary did not): $target" >&2
    bad=1
  fi
  ((skips > ok)) && skips=$ok
  passed=$((passed + ok - skips))
  skipped=$((skipped + skips))
  failed=$((failed + bad))
  ((bad > 0)) && echo "FAILED ($bad test case(s)): $target" >&2
  return 0
}

# tally_bazel BAZEL_OUTPUT TESTLOGS TARGETS_FILE: every test target Bazel was asked to run
# (TARGETS_FILE: `bazel query 'tests(//...)'`'s output, one label a line). An empty or
# missing list is itself a failure: nothing was counted.
tally_bazel() {
  local output=$1 testlogs=$2 targets=$3 target path
  if [[ ! -s $targets ]]; then
    echo "FAILED (bazel query listed no test targets: nothing could be counted)" >&2
    failed=$((failed + 1))
    return
  fi
  while read -r target; do
    [[ -n $target ]] || continue
    path=${target#//}
    path=${path/://}
    if grep -Eq "^$target +(\(cached\) )?PASSED" "$output"; then
      tally_test_log "$target" "$testlogs/$path/test.log" 1
    else
      tally_test_log "$target" "$testlogs/$path/test.log" 0
    fi
  done <"$targets"
}

# tally_command_test NAME OUTPUT STATUS: a tests/commands/*_test.sh run: one test,
# skipped if it printed "SKIPPED: ".
tally_command_test() {
  local name=$1 output=$2 status=$3
  if ((status != 0)); then
    echo "FAILED: $name" >&2
    failed=$((failed + 1))
  elif grep -q "^SKIPPED: " "$output"; then
    skipped=$((skipped + 1))
  else
    passed=$((passed + 1))
  fi
}
