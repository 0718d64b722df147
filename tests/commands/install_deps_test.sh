#!/usr/bin/env bash
# deploy/install_deps.sh (which both README commands run first) against stand-in
# dpkg-query, apt-get and sudo on PATH: it installs exactly the packages that are not
# installed (unknown to dpkg, removed with their configuration kept, half-installed),
# counts held ones and ones marked for removal as installed, and with every package
# installed it calls apt-get not at all and prints nothing. What it prints is two lines
# (installing, installed), apt-get's own output kept in the log it names; a failed
# apt-get is reported with the log's name and last lines.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
problems=0

# dpkg-query, apt-get and sudo stand-ins (tests/stand_ins/apt: dpkg-query answers from
# $STATUS_FILE, apt-get records its calls in $CALLS_FILE).
STAND_INS=$ROOT/tests/stand_ins/apt
export STATUS_FILE=$dir/status CALLS_FILE=$dir/apt-get.calls

mapfile -t packages < <(sed -n '/^PACKAGES=(/,/^)/p' "$ROOT/deploy/install_deps.sh" |
  sed -e '1d' -e '$d' -e 's/#.*//' | tr -s ' ' '\n' | sed '/^$/d')

# run [ARGS...]: runs install_deps.sh ARGS with the stand-ins first on PATH; sets status,
# calls and out (what it printed, stdout and stderr).
run() {
  rm -f "$CALLS_FILE"
  out=$(PATH="$STAND_INS:$PATH" "$ROOT/deploy/install_deps.sh" "$@" 2>&1)
  status=$?
  calls=$(cat "$CALLS_FILE" 2>/dev/null)
}
expect() {
  if eval "$2"; then
    echo "ok: $1"
  else
    echo "FAILED: $1 (exit $status; apt-get called with: ${calls:-nothing})"
    problems=$((problems + 1))
  fi
}

if ((${#packages[@]} < 10)); then
  echo "FAILED: read only ${#packages[@]} packages from deploy/install_deps.sh"
  exit 1
fi
for package in "${packages[@]}"; do echo "$package install ok installed"; done >"$STATUS_FILE"
run
expect "every package installed: exit 0, no apt-get, nothing printed" \
  '((status == 0)) && [[ -z $calls && -z $out ]]'

# The first unknown to dpkg, the second removed with its configuration kept, the last
# half-installed; the third held and the fourth marked for removal (both installed
# still); the rest installed.
first=${packages[0]} second=${packages[1]} last=${packages[-1]}
{
  echo "$second deinstall ok config-files"
  echo "${packages[2]} hold ok installed"
  echo "${packages[3]} deinstall ok installed"
  for package in "${packages[@]:4:${#packages[@]}-5}"; do echo "$package install ok installed"; done
  echo "$last install ok half-installed"
} >"$STATUS_FILE"
APT_NOISE_LINES=1200 run --log "$dir/install.log"
expect "three packages missing: apt-get updates, then installs exactly those three" \
  '((status == 0)) && [[ $calls == "update -qq"$'"'\n'"'"install -y -qq --no-install-recommends $first $second $last" ]]'
expect "it prints two lines (installing, installed), naming the log, not apt-get's 2,400" \
  '[[ $(wc -l <<<"$out") == 2 && $out == "installing 3 Debian packages with apt-get"*"its output: $dir/install.log)"$'"'\n'"'"installed 3 packages in "* ]]'
expect "the log holds apt-get's output" \
  '[[ $(grep -c "^Unpacking stand-in-package-" "$dir/install.log") == 2400 ]]'

# apt-get fails: a nonzero exit, the log named, its last lines shown, apt's error among them.
rm -f "$dir/install.log"
APT_EXIT=100 run --log "$dir/install.log"
expect "apt-get failing: exit 1, the log named, its error shown" \
  '((status == 1)) && [[ $out == *"apt-get failed (exit 100); its whole output is in $dir/install.log"* &&
     $out == *"E: Unable to locate package stand-in-missing-package"* ]] && (($(wc -l <<<"$out") <= 20))'
expect "the failed run's log holds apt-get's error" \
  'grep -q "E: Unable to locate package" "$dir/install.log"'

# Without --log it makes a log of its own and names it.
run
log=$(grep -o "its output: [^)]*" <<<"$out" | sed "s/its output: //")
expect "without --log, a new log in /tmp is named and written" \
  '((status == 0)) && [[ $log == /tmp/paramserver-install.*.log && -s $log ]]'
rm -f "$log"
out=$(PATH="$STAND_INS:$PATH" "$ROOT/deploy/install_deps.sh" --verbose 2>&1)
status=$?
calls=""
expect "an unknown argument is refused (exit 2), naming it" \
  '((status == 2)) && [[ $out == *"unknown argument --verbose"* ]]'

if ((problems > 0)); then
  echo "$problems check(s) failed"
  exit 1
fi
echo "all checks passed"
