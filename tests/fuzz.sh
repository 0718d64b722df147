#!/usr/bin/env bash
# Runs every libFuzzer target of tests/fuzz/ for SECONDS each (default 60), starting from
# its checked-in seeds (tests/fuzz/corpus/<target>/, copied: the checked-in corpus is
# not changed), built with clang, ASan and UBSan in an output base of its own. Prints one
# line per target, "fuzz <target>: clean (N runs)" or "fuzz <target>: FAILED", the
# crashing input's path and the sanitizer's report; ends with "fuzz: N clean, N failed".
# Exit status 0 only when every target ran clean.
# Usage: tests/fuzz.sh [SECONDS]
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
SECONDS_EACH=${1:-60}
[[ $SECONDS_EACH =~ ^[0-9]+$ ]] || { echo "usage: tests/fuzz.sh [SECONDS]" >&2; exit 2; }
"$ROOT/deploy/install_deps.sh" || exit 1
source "$ROOT/tests/output_bases.sh"

FUZZERS=$(sed -n 's/^    "\([a-z_]*_fuzzer\)": .*/\1/p' tests/fuzz/BUILD)
targets=()
for fuzzer in $FUZZERS; do targets+=("//tests/fuzz:$fuzzer"); done
if ! bazel --output_base="$SANITIZE_OUTPUT_BASE" build --config=sanitize --noshow_progress \
    --symlink_prefix=/tmp/paramserver-sanitize- "${targets[@]}" >/tmp/paramserver-fuzz-build.log 2>&1; then
  tail -n 40 /tmp/paramserver-fuzz-build.log >&2
  echo "fuzz: the targets did not build" >&2
  echo "fuzz: 0 clean, $(wc -w <<<"$FUZZERS") failed"
  exit 1
fi
BIN=$(bazel --output_base="$SANITIZE_OUTPUT_BASE" info --config=sanitize bazel-bin 2>/dev/null)
WORK=$(mktemp -d /tmp/paramserver-fuzz.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
clean=0
failed=0
for fuzzer in $FUZZERS; do
  mkdir -p "$WORK/$fuzzer/corpus" "$WORK/$fuzzer/artifacts"
  cp tests/fuzz/corpus/"$fuzzer"/* "$WORK/$fuzzer/corpus/"
  if "$BIN/tests/fuzz/$fuzzer" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$WORK/$fuzzer/artifacts/" "$WORK/$fuzzer/corpus" >"$WORK/$fuzzer/log" 2>&1; then
    runs=$(grep -Eo "stat::number_of_executed_units: *[0-9]+" "$WORK/$fuzzer/log" | grep -Eo "[0-9]+$")
    echo "fuzz $fuzzer: clean (${runs:-?} runs in $SECONDS_EACH s)"
    clean=$((clean + 1))
  else
    kept="/tmp/paramserver-fuzz-$fuzzer-$(date +%s)"
    cp -r "$WORK/$fuzzer/artifacts" "$kept"
    echo "fuzz $fuzzer: FAILED; the input that failed is in $kept" >&2
    grep -E "ERROR|runtime error|SUMMARY|#[0-9]+ 0x" "$WORK/$fuzzer/log" | head -n 30 >&2
    failed=$((failed + 1))
  fi
done
echo "fuzz: $clean clean, $failed failed"
((failed == 0))
