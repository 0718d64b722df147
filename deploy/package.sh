#!/usr/bin/env bash
# Builds the release tarball: out/paramserver-<version>.tar.gz, holding
#   bin/        ps_scheduler ps_server ps_worker psctl ps_checkpoint_export
#   python/paramserver/  the Python package (ps_worker puts it on a script's PYTHONPATH)
#   etc/ps/     cluster.yaml (the reference job, to edit)
#   lib/systemd/system/  ps-scheduler.service ps-server.service ps-worker.service
#                        ps-journal-export.service
#   share/paramserver/   cloud-init.yaml.tmpl ps-bootstrap.sh launch.py (with its modules:
#                        launch_cli.py launch_documents.py launch_up.py aws_clients.py cluster_spec.py)
#   share/doc/paramserver/  README.md DEPLOY_EC2.md OPERATIONS.md FAULT_TOLERANCE.md
#   install.sh  VERSION
# It is relocatable: `install.sh --prefix P` puts it anywhere (units point at P). The
# binaries use Debian 12's shared libraries (what deploy/install_deps.sh installs).
# Usage: deploy/package.sh [--bin-dir DIR] [--out DIR]
#   --bin-dir: take the binaries from DIR (as Bazel lays them out) instead of building.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN_DIR=""
OUT="$ROOT/out"
while (($#)); do
  case "$1" in
    --bin-dir) BIN_DIR=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "package.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
BINARIES=(scheduler/ps_scheduler ps/ps_server worker/ps_worker psctl/psctl ps/ps_checkpoint_export)
if [[ -z $BIN_DIR ]]; then
  "$ROOT/deploy/install_deps.sh"
  # Bazel labels: scheduler/ps_scheduler is //scheduler:ps_scheduler.
  labels=()
  for binary in "${BINARIES[@]}"; do labels+=("//${binary%/*}:${binary##*/}"); done
  (cd "$ROOT" && bazel build -c opt --noshow_progress "${labels[@]}" //python:paramserver >&2)
  BIN_DIR=$(cd "$ROOT" && bazel info -c opt bazel-bin 2>/dev/null)
fi
version=$("$ROOT/deploy/version.sh")
name="paramserver-$version"
staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
tree="$staging/$name"
mkdir -p "$tree/bin" "$tree/python/paramserver" "$tree/etc/ps" "$tree/lib/systemd/system" "$tree/share/paramserver" "$tree/share/doc/paramserver"
for binary in "${BINARIES[@]}"; do
  [[ -x "$BIN_DIR/$binary" ]] || { echo "package.sh: $BIN_DIR/$binary is missing" >&2; exit 1; }
  install -m 0755 "$BIN_DIR/$binary" "$tree/bin/"
done
for file in __init__.py optimizer.py weights.py _native.so; do
  [[ -f "$BIN_DIR/python/paramserver/$file" ]] || { echo "package.sh: $BIN_DIR/python/paramserver/$file is missing" >&2; exit 1; }
  install -m 0644 "$BIN_DIR/python/paramserver/$file" "$tree/python/paramserver/"
done
install -m 0644 "$ROOT/deploy/local/fashion_mnist.yaml" "$tree/etc/ps/cluster.yaml"
install -m 0644 "$ROOT"/deploy/ec2/*.service "$tree/lib/systemd/system/"
install -m 0644 "$ROOT/deploy/ec2/cloud-init.yaml.tmpl" "$tree/share/paramserver/"
install -m 0755 "$ROOT/deploy/ec2/ps-bootstrap.sh" "$ROOT/deploy/ec2/launch.py" "$tree/share/paramserver/"
# launch.py imports these from its own folder.
install -m 0644 "$ROOT/deploy/ec2/launch_cli.py" "$ROOT/deploy/ec2/launch_documents.py" "$ROOT/deploy/ec2/launch_up.py" \
  "$ROOT/deploy/ec2/aws_clients.py" "$ROOT/deploy/cluster_spec.py" "$tree/share/paramserver/"
install -m 0644 "$ROOT/README.md" "$ROOT"/docs/*.md "$tree/share/doc/paramserver/"
install -m 0755 "$ROOT/deploy/ec2/install.sh" "$tree/install.sh"
printf '%s\nbuilt %s on %s\n' "$version" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(. /etc/os-release && echo "$PRETTY_NAME")" \
  > "$tree/VERSION"
mkdir -p "$OUT"
tar -C "$staging" -czf "$OUT/$name.tar.gz" "$name"
echo "$OUT/$name.tar.gz"
