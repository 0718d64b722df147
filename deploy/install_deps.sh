#!/usr/bin/env bash
# Installs the Debian packages the build, the tests and the local cluster need.
# Idempotent: does nothing (and prints nothing) when everything is already installed.
# Otherwise it prints one line, "installing N Debian packages ...", keeps apt-get's
# own output in a log file (LOG, or a new /tmp/paramserver-install.XXXXXX.log), and
# on a failure names that file and shows its last lines.
# Usage: deploy/install_deps.sh [--log LOG] [--with container|runc]
set -euo pipefail
LOG=""
WITH_CONTAINER=0
WITH_RUNC=0
while (($#)); do
  case "$1" in
    --log) LOG=${2:?--log needs a file}; shift 2 ;;
    --with)
      case "${2:-}" in
        container) WITH_CONTAINER=1 ;;
        runc) WITH_RUNC=1 ;;
        *) echo "install_deps.sh: --with container or --with runc, not '${2:-}'" >&2; exit 2 ;;
      esac
      shift 2 ;;
    *) echo "install_deps.sh: unknown argument $1 (usage: install_deps.sh [--log LOG] [--with container|runc])" >&2; exit 2 ;;
  esac
done

PACKAGES=(
  bazel-bootstrap bazel-platforms bazel-rules-java
  g++ clang clang-format pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev catch2 libyaml-cpp-dev libopenblas-dev zlib1g-dev
  nlohmann-json3-dev libcpp-httplib-dev prometheus-cpp-dev libssl-dev libgoogle-perftools-dev dataset-fashion-mnist
  pybind11-dev python3-dev python3-numpy  # the Python package (python/): its extension module
  python3-torch  # the Python package's users' models, and the PyTorch references of the tests
  openssl        # tests only: tests/tls_test makes its own CA and certificates
  chromium       # tests only: tests/status_page_test loads the status page headless
  curl           # tests only: tests/commands/ read the status page and metrics as a user would
  xz-utils       # tests only: tests/gpu_check.sh packs the GPU bundle with xz
  python3-yaml   # deploy/k8s/render.py reads the spec; tests/stand_ins/run_cloud_init.py the cloud-config
  iproute2 util-linux  # tests only: the network namespaces and throwaway roots of tests/commands/cloud_init_test.sh
  python3-boto3  # deploy/ec2/launch.py calls AWS with it; the stand-in endpoint reads and answers with its models (tests/stand_ins/aws_wire.py)
)
# --with container: deploy/container/'s tools (the image's Debian root and OCI image; a
# job in a podman pod, whose infra container needs catatonit).
CONTAINER_PACKAGES=(mmdebstrap umoci podman catatonit)

if ((WITH_CONTAINER)); then PACKAGES+=("${CONTAINER_PACKAGES[@]}"); fi
# runc only where podman's own runtime cannot start a container (deploy/container/run.sh
# asks): it conflicts with Docker's containerd.io, which a host may have.
if ((WITH_RUNC)); then PACKAGES+=(runc); fi

# One dpkg-query for them all (one each took 1.5 s, paid by every launch and test run).
# It exits 1 when it knows some package not at all: that one is missing too. Its
# ${Package} has no architecture, so a name is compared without one.
installed=" $({ dpkg-query -W -f='${Package}:${Status}\n' "${PACKAGES[@]}" 2>/dev/null || true; } |
  sed -n 's/:[a-z]* ok installed$//p' | tr '\n' ' ') "
missing=()
for package in "${PACKAGES[@]}"; do
  if [[ $installed != *" ${package%%:*} "* ]]; then missing+=("$package"); fi
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
if [[ -z $LOG ]]; then LOG=$(mktemp /tmp/paramserver-install.XXXXXX.log); fi
echo "installing ${#missing[@]} Debian packages with apt-get (a few minutes on a new machine; its output: $LOG)" >&2
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
started=$SECONDS
status=0
{
  echo "installing: ${missing[*]}"
  $SUDO apt-get update -qq &&
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
} >>"$LOG" 2>&1 </dev/null || status=$?
if ((status != 0)); then
  {
    echo "install_deps.sh: apt-get failed (exit $status); its whole output is in $LOG, which ends:"
    tail -n 15 "$LOG" | sed 's/^/  /'
  } >&2
  exit 1
fi
echo "installed ${#missing[@]} packages in $((SECONDS - started)) s" >&2
