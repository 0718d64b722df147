#!/usr/bin/env bash
# Builds the container image from Debian's archive alone: a minimal Debian 12 root made by
# mmdebstrap (Debian's own tool, from the apt sources this machine uses; as root), holding
#   /opt/paramserver        the release (deploy/package.sh's tarball, installed by its
#                           install.sh): the binaries, the Python package, the docs;
#   /usr/local/bin/paramserver  the one entry point (deploy/container/entrypoint.sh):
#                           paramserver scheduler|server|worker|psctl|checkpoint-export,
#                           and `paramserver train`, SageMaker's training-container
#                           contract (deploy/container/sagemaker_*.py, with PyYAML);
#   exactly the Debian packages the binaries and the Python package link (ldd of each,
#   each library mapped to the package that owns it), Python 3 with PyTorch (the Python
#   package's users' scripts import it), the AWS CLI (the daemons read and write s3://
#   paths through it), CA certificates and the reference job's data
#   (dataset-fashion-mnist); no apt, no documentation but the copyright files;
#   with --cuda, NVIDIA's runtime libraries that ps_worker links (cudart, cuBLAS), taken
#   from this machine's CUDA toolkit (/usr/local/cuda), where EC2 instances install the
#   same libraries from NVIDIA's Debian 12 repository (deploy/ec2/ps-bootstrap.sh).
# Its first process is catatonit (Debian's container init): it passes every signal on to
# the command and reaps orphans, so that a command that is a Python script (a torch job's
# worker, `paramserver train`) gets SIGTERM rather than the kernel's PID 1 immunity.
# It runs as the unprivileged user ps (uid 10001), in /var/lib/paramserver, with gRPC's
# native resolver (getaddrinfo: /etc/hosts, then DNS; gRPC's c-ares resolver would not
# read the names a pod's /etc/hosts gives). umoci makes
# the OCI image; the archive is that image's layout, which `podman load -i` and
# `docker load -i` (Docker 25 or newer) accept.
#
# Usage: deploy/container/build.sh [--cuda] [--out DIR]
#   writes DIR/paramserver[-cuda]-VERSION.oci.tar (DIR default: out/), tagged
#   paramserver[-cuda]:VERSION (VERSION: git describe), and prints its path last.
#   Without --cuda the binaries are built without CUDA (--repo_env=PS_CUDA=0): a worker
#   computes on the CPU and the image holds no NVIDIA library.
# One line a step on the terminal; the tools' own output goes to DIR/container-build.log,
# named with its last lines should a step fail.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CUDA=0
OUT=$ROOT/out
while (($#)); do
  case "$1" in
    --cuda) CUDA=1; shift ;;
    --out) OUT=${2:?--out needs a folder}; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo pipefail$/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/container-build.log
: >"$LOG"
say() { echo "build.sh: $*" >&2; }
# step DESCRIPTION COMMAND...: runs COMMAND (a function: in a subshell with errexit, so
# that its first failing command fails the step) with its output in the log.
step() {
  local what=$1 status=0
  shift
  say "$what"
  # Not under `||` or `if`: bash would ignore the subshell's errexit there.
  set +e
  (
    set -e
    "$@"
  ) >>"$LOG" 2>&1 </dev/null
  status=$?
  set -e
  if ((status != 0)); then
    say "failed: $what; the whole output is in $LOG, which ends:"
    tail -n 20 "$LOG" | sed 's/^/  /' >&2
    exit 1
  fi
}

if [[ $(id -u) != 0 ]]; then
  say "run me as root: mmdebstrap makes the image's root with root's rights (--mode=root)"
  exit 2
fi
"$ROOT/deploy/install_deps.sh" --log "$OUT/install.log" --with container

name=paramserver
bazel_flags=(-c opt --noshow_progress)
if ((CUDA)); then
  name=paramserver-cuda
else
  bazel_flags+=(--repo_env=PS_CUDA=0)
fi
BINARIES=(scheduler/ps_scheduler ps/ps_server worker/ps_worker psctl/psctl ps/ps_checkpoint_export)
labels=(//python:paramserver)
for binary in "${BINARIES[@]}"; do labels+=("//${binary%/*}:${binary##*/}"); done

staging=$(mktemp -d /tmp/paramserver-image.XXXXXX)
trap 'rm -rf "$staging"' EXIT
build_and_package() {
  (cd "$ROOT" && bazel build "${bazel_flags[@]}" "${labels[@]}")
  local bin
  bin=$(cd "$ROOT" && bazel info -c opt bazel-bin)
  # package.sh copies the binaries at once: a later build cannot change them under it.
  "$ROOT/deploy/package.sh" --bin-dir "$bin" --out "$staging/release"
  mkdir -p "$staging/tree"
  tar -xzf "$staging"/release/paramserver-*.tar.gz -C "$staging/tree" --strip-components=1
}
step "building the release ($( ((CUDA)) && echo "with CUDA" || echo "CPU only, --repo_env=PS_CUDA=0"))" build_and_package
version=$(head -n 1 "$staging/tree/VERSION")
[[ -n $version ]] || { say "the release has no version (see $LOG)"; exit 1; }

# The Debian package that owns FILE (a library ldd found). Debian 12's dpkg database may
# list a library under /lib or /usr/lib (the merged /usr), so both are asked.
package_of() {
  local real candidate
  real=$(realpath "$1")
  for candidate in "$real" "${real/#\/usr\/lib\//\/lib\/}" "$1"; do
    if dpkg -S "$candidate" 2>/dev/null | head -n 1 | sed 's/: .*//; s/:[a-z0-9]*$//'; then
      return 0
    fi
  done
  return 1
}
# What the binaries and the Python package's extension link: Debian packages (into
# $staging/packages), and (with --cuda) NVIDIA's libraries, which no Debian package owns
# (into $staging/nvidia), a line each.
find_libraries() {
  local file library package
  : >"$staging/packages.all"
  : >"$staging/nvidia.all"
  for file in "$staging"/tree/bin/* "$staging"/tree/python/paramserver/_native.so; do
    if ldd "$file" | grep -q "not found"; then
      echo "$file links a library this machine lacks:"
      ldd "$file" | grep "not found"
      return 1
    fi
    while read -r library; do
      if [[ $(realpath "$library") == /usr/local/cuda* ]]; then
        echo "$library" >>"$staging/nvidia.all"
      elif package=$(package_of "$library") && [[ -n $package ]]; then
        echo "$package" | tr -d ' ' | tr ',' '\n' >>"$staging/packages.all"
      else
        echo "no Debian package owns $library (linked by $file)"
        return 1
      fi
    done < <(ldd "$file" | awk '/=> \//{print $3}')
  done
  sort -u "$staging/packages.all" >"$staging/packages"
  sort -u "$staging/nvidia.all" >"$staging/nvidia"
  echo "linked packages: $(tr '\n' ' ' <"$staging/packages")"
  echo "NVIDIA libraries: $(tr '\n' ' ' <"$staging/nvidia")"
  if ((CUDA)) && [[ ! -s $staging/nvidia ]]; then
    echo "--cuda, but ps_worker links no NVIDIA library: was it built without CUDA?"
    return 1
  fi
}
step "finding the libraries the binaries link (ldd)" find_libraries
mapfile -t packages <"$staging/packages"
mapfile -t nvidia_libraries <"$staging/nvidia"

# The root's own files: the release, the entry point, the user, NVIDIA's libraries.
mkdir -p "$staging/overlay/opt/paramserver" "$staging/overlay/usr/local/bin" "$staging/overlay/var/lib/paramserver"
"$staging/tree/install.sh" --prefix "$staging/overlay/opt/paramserver" >>"$LOG" 2>&1
install -m 0755 "$ROOT/deploy/container/entrypoint.sh" "$staging/overlay/usr/local/bin/paramserver"
mkdir -p "$staging/overlay/usr/local/lib/paramserver"
install -m 0644 "$ROOT/deploy/container/sagemaker_train.py" "$ROOT/deploy/container/sagemaker_contract.py" \
  "$staging/overlay/usr/local/lib/paramserver/"
if ((CUDA)); then
  cuda_lib=$staging/overlay/usr/local/cuda-13.0/targets/x86_64-linux/lib
  mkdir -p "$cuda_lib" "$staging/overlay/etc/ld.so.conf.d"
  for library in "${nvidia_libraries[@]}"; do
    cp -L "$library" "$cuda_lib/$(basename "$library")"
    # And what that library itself needs from the toolkit (cuBLAS needs cuBLASLt).
    while read -r dependency; do
      [[ $(realpath "$dependency") == /usr/local/cuda* ]] && cp -L "$dependency" "$cuda_lib/$(basename "$dependency")"
    done < <(ldd "$library" | awk '/=> \//{print $3}')
  done
  echo /usr/local/cuda-13.0/targets/x86_64-linux/lib >"$staging/overlay/etc/ld.so.conf.d/paramserver-cuda.conf"
  ln -s cuda-13.0 "$staging/overlay/usr/local/cuda"
  ln -s targets/x86_64-linux/lib "$staging/overlay/usr/local/cuda-13.0/lib64"
fi
tar -C "$staging/overlay" --owner=0 --group=0 -cf "$staging/overlay.tar" .

include=$(
  IFS=,
  echo "${packages[*]},python3,python3-numpy,python3-torch,python3-yaml,awscli,catatonit,ca-certificates,dataset-fashion-mnist"
)
# The root, from this machine's apt sources (Debian 12: its sources.list and deb822
# .sources files, each handed to mmdebstrap, which pastes them into the root's apt
# configuration for the build), without apt and documentation.
mirrors=()
[[ -s /etc/apt/sources.list ]] && grep -q '^deb ' /etc/apt/sources.list && mirrors+=(/etc/apt/sources.list)
for file in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
  [[ -s $file ]] && mirrors+=("$file")
done
((${#mirrors[@]} > 0)) || { say "this machine has no apt sources (/etc/apt/sources.list, sources.list.d)"; exit 1; }
make_root() {
  mmdebstrap --variant=essential --mode=root --format=tar \
    --include="$include" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook="tar-in '$staging/overlay.tar' /" \
    --customize-hook='echo "ps:x:10001:10001:paramserver:/var/lib/paramserver:/usr/sbin/nologin" >>"$1/etc/passwd"' \
    --customize-hook='echo "ps:x:10001:" >>"$1/etc/group"' \
    --customize-hook='chown 10001:10001 "$1/var/lib/paramserver" && chmod 0750 "$1/var/lib/paramserver"' \
    --customize-hook='chroot "$1" ldconfig' \
    --customize-hook='rm -rf "$1"/var/cache/* "$1"/var/lib/apt/lists/* "$1"/var/log/*' \
    bookworm "$staging/root.tar" "${mirrors[@]}"
}
step "making the Debian 12 root with mmdebstrap (${#packages[@]} linked packages, Python 3, PyTorch, the AWS CLI)" make_root

# The OCI image: one layer (the root), the configuration, the tag.
layout=$staging/layout
make_image() {
  umoci init --layout "$layout"
  umoci new --image "$layout:$version"
  umoci raw add-layer --image "$layout:$version" "$staging/root.tar"
  umoci config --image "$layout:$version" \
    --config.user 10001:10001 --config.workingdir /var/lib/paramserver \
    --config.entrypoint /usr/bin/catatonit --config.entrypoint -- \
    --config.entrypoint /usr/local/bin/paramserver --config.cmd help \
    --config.env PATH=/usr/local/bin:/usr/bin:/bin \
    --config.env PYTHONPATH=/opt/paramserver/python \
    --config.env GRPC_DNS_RESOLVER=native \
    --config.label "org.opencontainers.image.title=$name" \
    --config.label "org.opencontainers.image.version=$version" \
    --config.label "org.opencontainers.image.description=paramserver $version: ps_scheduler, ps_server, ps_worker, psctl (entry point: paramserver COMMAND)" \
    --history.created_by "deploy/container/build.sh$( ((CUDA)) && echo " --cuda")"
  umoci gc --layout "$layout"
  # The name a loader gives the image: umoci's tag is only "VERSION"; podman reads the
  # index's ref.name, Docker containerd's image name.
  python3 - "$layout/index.json" "$name:$version" <<'PY'
import json, sys
path, reference = sys.argv[1], sys.argv[2]
with open(path) as f:
    index = json.load(f)
for manifest in index["manifests"]:
    annotations = manifest.setdefault("annotations", {})
    annotations["org.opencontainers.image.ref.name"] = reference
    annotations["io.containerd.image.name"] = "docker.io/library/" + reference
with open(path, "w") as f:
    json.dump(index, f)
PY
}
step "making the OCI image with umoci" make_image
archive=$OUT/$name-$version.oci.tar
pack() {
  tar -C "$layout" -cf "$archive.part" .
  mv "$archive.part" "$archive"
}
step "writing $archive" pack
say "$name:$version: $(du -m "$archive" | cut -f1) MB compressed, $(($(stat -c %s "$staging/root.tar") / 1048576)) MB unpacked"
echo "$archive"
