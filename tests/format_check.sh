#!/usr/bin/env bash
# Fails (exit 1) when a C++ or CUDA file tracked by git is not formatted as .clang-format
# says (Google style, 100 columns), naming each file and how to fix it. Debian's
# clang-format (14 on bookworm) is the reference: deploy/install_deps.sh installs it.
# Usage: tests/format_check.sh
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
if ((${#files[@]} == 0)); then
  echo "format check: no C++ files found under $ROOT (is this a git checkout?)" >&2
  exit 1
fi
unformatted=()
for file in "${files[@]}"; do
  if ! clang-format --dry-run --Werror "$file" >/dev/null 2>&1; then
    unformatted+=("$file")
  fi
done
if ((${#unformatted[@]} > 0)); then
  echo "format check: ${#unformatted[@]} of ${#files[@]} files are not formatted:" >&2
  printf '  %s\n' "${unformatted[@]}" >&2
  echo "fix them with: clang-format -i ${unformatted[*]}" >&2
  exit 1
fi
echo "format check: all ${#files[@]} files formatted"
