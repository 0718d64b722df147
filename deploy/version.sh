#!/usr/bin/env bash
# Prints the release's version: `git describe --always` of this checkout, and for a
# checkout with changes `-dirty` and a digest of them (-dirty-1a2b3c4d: the hash of the
# tree of every file git does not ignore, changed and new ones too), so that a build of
# changed sources is never taken for another's (the container image's tag is this
# version). "unknown" outside a git checkout.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
version=$(git describe --always 2>/dev/null) || { echo unknown; exit 0; }
# Changed or new files (untracked ones that git does not ignore count too): named by the
# tree they would make.
# Where git cannot say (a copy of the tree without its repository), the description alone.
changes=$(git status --porcelain 2>/dev/null) || { echo "$version"; exit 0; }
if [[ -n $changes ]]; then
  # The index copy and the objects `git add` writes go to a temporary folder (the
  # repository's own objects are read through it): nothing in .git changes.
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  objects=$(cd "$(git rev-parse --git-path objects)" 2>/dev/null && pwd) || objects=""
  export GIT_INDEX_FILE=$scratch/index GIT_OBJECT_DIRECTORY=$scratch/objects
  export GIT_ALTERNATE_OBJECT_DIRECTORIES=$objects
  if [[ -n $objects ]] && mkdir "$scratch/objects" && cp "$(git rev-parse --git-dir)/index" "$GIT_INDEX_FILE" 2>/dev/null &&
    tree=$(git add -A 2>/dev/null && git write-tree 2>/dev/null); then
    version=$version-dirty-${tree:0:8}
  else
    version=$version-dirty
  fi
fi
echo "$version"
