#!/usr/bin/env bash
# Installs this unpacked release into PREFIX (default /opt/paramserver): the binaries,
# the docs, and the systemd units rewritten to run PREFIX's binaries. With --systemd it
# also creates the unprivileged user `ps`, puts the units in /etc/systemd/system, copies
# the default config to /etc/ps/cluster.yaml if there is none, and reloads systemd.
# Usage: install.sh [--prefix PREFIX] [--systemd]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PREFIX=/opt/paramserver
SYSTEMD=0
while (($#)); do
  case "$1" in
    --prefix) PREFIX=$2; shift 2 ;;
    --systemd) SYSTEMD=1; shift ;;
    *) echo "install.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$PREFIX"
PREFIX=$(cd "$PREFIX" && pwd)
for dir in bin python etc share; do cp -R "$HERE/$dir" "$PREFIX/"; done
cp "$HERE/VERSION" "$PREFIX/"
mkdir -p "$PREFIX/lib/systemd/system"
for unit in "$HERE"/lib/systemd/system/*.service; do
  sed "s|@PREFIX@|$PREFIX|g" "$unit" > "$PREFIX/lib/systemd/system/$(basename "$unit")"
done
if ((SYSTEMD)); then
  id ps >/dev/null 2>&1 || useradd --system --home-dir /var/lib/ps --shell /usr/sbin/nologin ps
  install -d -m 0755 /etc/ps
  [[ -e /etc/ps/cluster.yaml ]] || install -m 0644 "$PREFIX/etc/ps/cluster.yaml" /etc/ps/cluster.yaml
  install -m 0644 "$PREFIX"/lib/systemd/system/*.service /etc/systemd/system/
  systemctl daemon-reload
fi
echo "installed $(head -1 "$PREFIX/VERSION") into $PREFIX"
