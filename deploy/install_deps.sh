#!/usr/bin/env bash
# Installs the Debian packages the build, the tests and the local cluster need.
# Idempotent: does nothing when everything is already installed.
set -euo pipefail

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
  python3-yaml   # tests only: tests/stand_ins/run_cloud_init.py reads the rendered cloud-config
  iproute2 util-linux  # tests only: the network namespaces and throwaway roots of tests/commands/cloud_init_test.sh
  bsdextrautils  # deploy/ec2/launch.sh status aligns its table with column
)

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
echo "installing: ${missing[*]}" >&2
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
