#!/usr/bin/env bash
# deploy/install_deps.sh (which both README commands run first) against stand-in
# dpkg-query and apt-get on PATH: it installs exactly the packages that are not fully
# installed (unknown to dpkg, removed with their configuration kept, or never seen), and
# with every package installed it calls apt-get not at all.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
problems=0
mkdir -p "$dir/bin"

# dpkg-query -W -f=FORMAT PACKAGE...: as dpkg's does for the packages listed in
# $dir/status ("NAME STATUS WORDS"), an error (and exit 1) for any other.
cat >"$dir/bin/dpkg-query" <<EOF
#!/usr/bin/env bash
status=0
for package in "\${@:3}"; do
  line=\$(grep "^\$package " "$dir/status")
  if [[ -z \$line ]]; then
    echo "dpkg-query: no packages found matching \$package" >&2
    status=1
  else
    printf '%s:%s\n' "\$package" "\${line#* }"
  fi
done
exit \$status
EOF
# apt-get ARGS...: records its arguments.
cat >"$dir/bin/apt-get" <<EOF
#!/usr/bin/env bash
echo "\$*" >>"$dir/apt-get.calls"
EOF
chmod +x "$dir/bin/dpkg-query" "$dir/bin/apt-get"

mapfile -t packages < <(sed -n '/^PACKAGES=(/,/^)/p' "$ROOT/deploy/install_deps.sh" |
  sed -e '1d' -e '$d' -e 's/#.*//' | tr -s ' ' '\n' | sed '/^$/d')

# run WHAT: runs install_deps.sh with the stand-ins first on PATH; sets calls.
run() {
  rm -f "$dir/apt-get.calls"
  PATH="$dir/bin:$PATH" "$ROOT/deploy/install_deps.sh" >/dev/null 2>&1
  status=$?
  calls=$(cat "$dir/apt-get.calls" 2>/dev/null)
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
for package in "${packages[@]}"; do echo "$package install ok installed"; done >"$dir/status"
run
expect "every package installed: exit 0, no apt-get" '((status == 0)) && [[ -z $calls ]]'

# The first unknown to dpkg, the second removed with its configuration kept, the last
# half-installed; the rest installed.
first=${packages[0]} second=${packages[1]} last=${packages[-1]}
{
  echo "$second deinstall ok config-files"
  for package in "${packages[@]:2:${#packages[@]}-3}"; do echo "$package install ok installed"; done
  echo "$last install ok half-installed"
} >"$dir/status"
run
expect "three packages missing: apt-get updates, then installs exactly those three" \
  '((status == 0)) && [[ $calls == "update -qq"$'"'\n'"'"install -y -qq --no-install-recommends $first $second $last" ]]'

if ((problems > 0)); then
  echo "$problems check(s) failed"
  exit 1
fi
echo "all checks passed"
