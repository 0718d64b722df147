#!/usr/bin/env bash
# The README's main command on a machine where it must first install and build, as a
# user types it: `deploy/local/run.sh CONFIG`, with stand-ins that make the set-up as loud
# as on a new machine (dpkg-query knowing no package, apt-get printing 1,200 lines a
# call, Bazel 500 lines before it builds). The terminal gets at most 30 lines before the
# job starts (the launcher's "logs:" line), the full output stays in the run folder's
# install.log and build.log, and the job runs. A failed install or build names its log
# and shows its last lines, and starts nothing.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

real_bazel=$(command -v bazel)
mkdir -p "$WORK/bin"
cat >"$WORK/bin/bazel" <<STAND_IN
#!/usr/bin/env bash
# Bazel as loud as on a new machine; BAZEL_STAND_IN_FAILS=1: a failed build.
for ((line = 1; line <= 500; line++)); do echo "INFO: stand-in compiler output \$line" >&2; done
if [[ \${BAZEL_STAND_IN_FAILS:-} == 1 ]]; then
  echo "ERROR: /stand-in/BUILD:1:1: compiling stand-in.cc failed" >&2
  exit 1
fi
exec "$real_bazel" "\$@"
STAND_IN
chmod +x "$WORK/bin/bazel"
NEW_MACHINE_PATH="$ROOT/tests/stand_ins/apt:$WORK/bin:$PATH"
write_config "$WORK/job.yaml" epochs 1

# lines_before_the_job OUT: how many lines the launcher printed before "logs: ...".
lines_before_the_job() { awk '/^logs: /{print NR - 1; found = 1; exit} END{if (!found) print "none"}' "$1"; }

echo "a first run: every package missing, apt-get and Bazel loud"
PATH=$NEW_MACHINE_PATH APT_NOISE_LINES=1200 launch "$WORK/first" "$WORK/job.yaml"
wait_launcher 600
before=$(lines_before_the_job "$WORK/first.out")
echo "  $before lines before the job started"
check "it exits 0" test "$LAUNCHER_STATUS" -eq 0
check "its last line is the job's final line" grep -Eq "^final test_accuracy=0\.[0-9]{4} samples_per_sec=[0-9]+ steps=[0-9]+$" \
  <(last_line "$WORK/first.out")
check "at most 30 lines before the job starts" test "$before" != none -a "$before" -le 30
check "it said it was installing, naming the log" \
  grep -q "^installing [0-9]* Debian packages with apt-get .*its output: $WORK/first/install.log)$" "$WORK/first.out"
check "it said it was building, naming the log" \
  grep -q "^run.sh: building the daemons with Bazel .*its output: $WORK/first/build.log)$" "$WORK/first.out"
check "apt-get's output is in the log, not on the terminal" \
  bash -c "[[ \$(grep -c '^Unpacking stand-in-package-' '$WORK/first/install.log') == 2400 ]] && ! grep -q '^Unpacking' '$WORK/first.out'"
check "Bazel's output is in the log, not on the terminal" \
  bash -c "grep -q 'stand-in compiler output 500' '$WORK/first/build.log' && ! grep -q 'stand-in compiler output' '$WORK/first.out'"

# a_failed_set_up NAME STEP LOG MESSAGE ERROR VAR=VALUE: run.sh on the loud new machine
# with VAR=VALUE (which makes STEP fail): exit 1, MESSAGE naming RUN_DIR/LOG and the
# tool's ERROR on the terminal, at most 30 lines, nothing started.
a_failed_set_up() {
  local name=$1 step=$2 log=$3 message=$4 error=$5 setting=$6
  echo "$step fails"
  export "${setting?}"
  PATH=$NEW_MACHINE_PATH launch "$WORK/$name" "$WORK/job.yaml"
  unset "${setting%%=*}"
  wait_launcher 120
  check "it exits 1" test "$LAUNCHER_STATUS" -eq 1
  check "it names the log and shows the error" bash -c \
    "grep -qF '$message; its whole output is in $WORK/$name/$log' '$WORK/$name.out' && grep -qF '$error' '$WORK/$name.out'"
  check "at most 30 lines in all" test "$(wc -l <"$WORK/$name.out")" -le 30
  check "nothing was started" bash -c "! grep -q '^logs: ' '$WORK/$name.out' && ! ls '$WORK'/$name/*.pid 2>/dev/null"
}
a_failed_set_up no_apt apt-get install.log "apt-get failed (exit 100)" "E: Unable to locate package" APT_EXIT=100
a_failed_set_up no_build "the build" build.log "the build failed" \
  "ERROR: /stand-in/BUILD:1:1: compiling stand-in.cc failed" BAZEL_STAND_IN_FAILS=1

finish
