# The checks of a Bazel sh_test, sourced (from its runfiles: data = ["//tests:sh_check.sh"]).
#   check DESCRIPTION COMMAND...  runs COMMAND; prints "ok: ..." or "FAILED: ..." and
#                                 counts the failures
#   end_checks                    prints "N check(s) failed"; its status is 0 only when none
# (tests/commands/lib.sh has the same for the command tests, with their own output.)
failures=0
check() {
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; failures=$((failures + 1)); fi
}
end_checks() {
  echo "$failures check(s) failed"
  ((failures == 0))
}
