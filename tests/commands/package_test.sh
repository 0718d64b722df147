#!/usr/bin/env bash
# `deploy/package.sh`, exactly as the README has it (no arguments): it builds the
# binaries and writes out/paramserver-<version>.tar.gz holding them, the units and docs.
# (tests/deploy_test installs and runs such a tarball.)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"
before=$(ls out/paramserver-*.tar.gz 2>/dev/null)
output=$(deploy/package.sh 2>"$WORK/package.err")
status=$?
check "it exits 0" test "$status" -eq 0
tarball=$(tail -n 1 <<<"$output")
check "it prints the tarball's path, under out/" bash -c "[[ '$tarball' == '$ROOT/out/paramserver-'*.tar.gz && -s '$tarball' ]]"
listing=$(tar -tzf "$tarball" 2>/dev/null)
for file in bin/ps_scheduler bin/ps_server bin/ps_worker bin/psctl bin/ps_checkpoint_export install.sh VERSION \
  python/paramserver/__init__.py python/paramserver/optimizer.py python/paramserver/weights.py python/paramserver/_native.so \
  lib/systemd/system/ps-server.service share/doc/paramserver/FAULT_TOLERANCE.md; do
  check "it holds $file" grep -q "^paramserver-[^/]*/$file\$" <<<"$listing"
done
# Leave out/ as it was: a tarball this test made is removed.
if ! grep -qxF "$tarball" <<<"$before"; then rm -f "$tarball"; fi
if ((FAILURES > 0)); then cat "$WORK/package.err"; fi
finish
