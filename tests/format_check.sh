#!/usr/bin/env bash
# Fails (exit 1) when a C++ or CUDA file tracked by git is not formatted as .clang-format
# says (Google style, 100 columns), naming each file and how to fix it. Debian's
# clang-format (14 on bookworm) is the reference: deploy/install_deps.sh installs it.
# Usage: tests/format_check.sh
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
# A tracked file deleted from the working tree: named here (clang-format's own error for
# it names no file, and would be lost among the formatting reports).
for file in "${files[@]}"; do
  if [[ ! -f $file ]]; then
    echo "format check: $file is tracked by git but missing from the working tree" >&2
    exit 1
  fi
done
if ((${#files[@]} == 0)); then
  echo "format check: no C++ files found under $ROOT (is this a git checkout?)" >&2
  exit 1
fi
# One clang-format process for every file (one per file spent most of its time starting):
# each violation is reported as "FILE:LINE:COLUMN: error: code should be clang-formatted".
report=$(clang-format --dry-run --Werror "${files[@]}" 2>&1)
clang_format_status=$?
mapfile -t unformatted < <(grep -oE '^[^:]+:[0-9]+:[0-9]+: error' <<<"$report" | cut -d: -f1 | sort -u)
if ((clang_format_status != 0 && ${#unformatted[@]} == 0)); then
  echo "format check: clang-format failed (exit $clang_format_status):" >&2
  head -n 20 <<<"$report" >&2
  exit 1
fi
if ((${#unformatted[@]} > 0)); then
  echo "format check: ${#unformatted[@]} of ${#files[@]} files are not formatted:" >&2
  printf '  %s\n' "${unformatted[@]}" >&2
  echo "fix them with: clang-format -i ${unformatted[*]}" >&2
  exit 1
fi
echo "format check: all ${#files[@]} files formatted"
