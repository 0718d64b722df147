#!/usr/bin/env bash
# The cost of replication: trains the default job (deploy/local/fashion_mnist.yaml) with
# cluster.replication 1 and 2, alternated, ROUNDS times each, in sync and async mode,
# and prints each run's samples/s, the medians and the ratio R=2 / R=1 per mode.
# Usage: bench/replication_bench.sh [ROUNDS]   (default 3)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=${1:-3}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

for mode in sync async; do
  for r in 1 2; do
    sed -e "s/^  shards: 8/  shards: 8\n  replication: $r/" -e "s/^  mode: sync/  mode: $mode/" \
      "$ROOT/deploy/local/fashion_mnist.yaml" > "$WORK/$mode-r$r.yaml"
  done
done

median() { sort -n | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }

"$ROOT/deploy/local/run.sh" "$WORK/sync-r1.yaml" > /dev/null 2>&1  # installs and builds once
printf '%-6s %-3s %-6s %-14s %s\n' mode R round samples_per_sec test_accuracy
for mode in sync async; do
  for round in $(seq 1 "$ROUNDS"); do
    for r in 1 2; do
      line=$("$ROOT/deploy/local/run.sh" "$WORK/$mode-r$r.yaml" 2>&1 | tail -1)
      rate=$(sed -n 's/.*samples_per_sec=\([0-9.]*\).*/\1/p' <<< "$line")
      accuracy=$(sed -n 's/.*test_accuracy=\([0-9.]*\).*/\1/p' <<< "$line")
      [[ -n "$rate" ]] || { echo "run failed: $line" >&2; exit 1; }
      echo "$rate" >> "$WORK/$mode-r$r.rates"
      printf '%-6s %-3s %-6s %-14s %s\n' "$mode" "$r" "$round" "$rate" "$accuracy"
    done
  done
done
echo
for mode in sync async; do
  r1=$(median < "$WORK/$mode-r1.rates")
  r2=$(median < "$WORK/$mode-r2.rates")
  awk -v m="$mode" -v a="$r1" -v b="$r2" \
    'BEGIN {printf "%s: median samples/s R=1 %.0f, R=2 %.0f; R=2 / R=1 = %.2f (replication costs %.0f%%)\n", m, a, b, b / a, 100 * (1 - b / a)}'
done
