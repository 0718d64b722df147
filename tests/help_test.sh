#!/usr/bin/env bash
# Every binary's --help as a user types it (`ps_server --help`, and -h): exit 0, the
# program's own usage first, each of its flags with its help text, none of Abseil's, and
# no warning. A mistyped flag still fails, naming it.
# Usage (Bazel passes these): tests/help_test.sh BINARY... (each path ends in its name)
set -uo pipefail
source "${TEST_SRCDIR:?run by bazel test}/${TEST_WORKSPACE:-paramserver}/tests/sh_check.sh"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for binary in "$@"; do
  name=$(basename "$binary")
  for flag in --help -h; do
    "$binary" "$flag" >"$out/stdout" 2>"$out/stderr"
    status=$?
    check "$name $flag exits 0" test "$status" -eq 0
    check "$name $flag says what it is first" grep -q "^$name: ." <(head -n 1 "$out/stdout")
    check "$name $flag shows its usage" grep -q "^usage: $name " "$out/stdout"
    check "$name $flag prints nothing on stderr" test ! -s "$out/stderr"
    check "$name $flag lists no flag of Abseil's" bash -c "! grep -Eq '^  --(flagfile|helpfull|fromenv)' '$out/stdout'"
  done
  "$binary" --no_such_flag >"$out/stdout" 2>"$out/stderr"
  status=$?
  check "$name --no_such_flag fails" test "$status" -ne 0
  check "$name --no_such_flag names it" grep -q "no_such_flag" "$out/stderr"
done
# Each binary's own flags, with their help texts.
BINARIES=("$@")
binary_named() {
  local binary
  for binary in "${BINARIES[@]}"; do [[ $(basename "$binary") == "$1" ]] && echo "$binary"; done
}
expect_flag() {
  local name=$1 flag=$2 help=$3
  "$(binary_named "$name")" --help >"$out/help" 2>&1
  check "$name --help lists --$flag" grep -q "^  --$flag (default: " "$out/help"
  check "$name --help explains --$flag" grep -qF "$help" <(grep -A1 "^  --$flag " "$out/help")
}
expect_flag ps_server config "the cluster spec (YAML)"
expect_flag ps_server listen "host:port to serve on"
expect_flag ps_server advertise "host:port other nodes reach this one at"
expect_flag ps_server startup_timeout_s "seconds to wait for the scheduler"
expect_flag ps_worker device "auto, cpu, gpu or gpu:N"
expect_flag ps_worker config "the cluster spec (YAML)"
expect_flag ps_scheduler state_file "takes the job over"
expect_flag ps_scheduler describe "validate the config"
expect_flag ps_checkpoint_export out "the safetensors file to write"
expect_flag ps_ctr_generate out "the folder to write train.tsv.gz"
"$(binary_named ps_scheduler)" --help >"$out/help" 2>&1
check "ps_scheduler --help lists no flag of the nodes' (--advertise)" bash -c "! grep -q '^  --advertise ' '$out/help'"
end_checks
