#!/usr/bin/env bash
# deploy/install_deps.sh (which both README commands run first) against stand-in
# dpkg-query, apt-get and sudo on PATH: it installs exactly the packages that are not
# installed (unknown to dpkg, removed with their configuration kept, half-installed),
# counts held ones and ones marked for removal as installed, and with every package
# installed it calls apt-get not at all.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
problems=0
mkdir -p "$dir/bin"

# dpkg-query -W -f=FORMAT PACKAGE...: as dpkg's does for the packages listed in
# $dir/status ("NAME WANT ok STATE"): FORMAT with ${Package} (the name without an
# architecture), ${binary:Package} (with one, as dpkg shows a Multi-Arch: same package)
# and ${Status} filled in; an error (and exit 1) for any other package.
cat >"$dir/bin/dpkg-query" <<'STAND_IN'
#!/usr/bin/env bash
format=${2#-f=}
status=0
for package in "${@:3}"; do
  name=${package%%:*}
  line=$(grep "^$name " "$STATUS_FILE")
  if [[ -z $line ]]; then
    echo "dpkg-query: no packages found matching $package" >&2
    status=1
    continue
  fi
  out=${format//'${binary:Package}'/$name:amd64}
  out=${out//'${Package}'/$name}
  out=${out//'${Status}'/${line#* }}
  printf '%b' "$out"
done
exit $status
STAND_IN
# apt-get ARGS...: records its arguments. sudo COMMAND...: runs it (a user who is not
# root gets `sudo apt-get`, which must reach the stand-in too).
printf '#!/usr/bin/env bash\necho "$*" >>"$CALLS_FILE"\n' >"$dir/bin/apt-get"
printf '#!/usr/bin/env bash\nexec "$@"\n' >"$dir/bin/sudo"
chmod +x "$dir/bin/dpkg-query" "$dir/bin/apt-get" "$dir/bin/sudo"
export STATUS_FILE=$dir/status CALLS_FILE=$dir/apt-get.calls

mapfile -t packages < <(sed -n '/^PACKAGES=(/,/^)/p' "$ROOT/deploy/install_deps.sh" |
  sed -e '1d' -e '$d' -e 's/#.*//' | tr -s ' ' '\n' | sed '/^$/d')

# run: runs install_deps.sh with the stand-ins first on PATH; sets status and calls.
run() {
  rm -f "$CALLS_FILE"
  PATH="$dir/bin:$PATH" "$ROOT/deploy/install_deps.sh" >/dev/null 2>&1
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
expect "every package installed: exit 0, no apt-get" '((status == 0)) && [[ -z $calls ]]'

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
run
expect "three packages missing: apt-get updates, then installs exactly those three" \
  '((status == 0)) && [[ $calls == "update -qq"$'"'\n'"'"install -y -qq --no-install-recommends $first $second $last" ]]'

if ((problems > 0)); then
  echo "$problems check(s) failed"
  exit 1
fi
echo "all checks passed"
