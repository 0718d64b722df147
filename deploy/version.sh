#!/usr/bin/env bash
# Prints the release's version: `git describe --always --dirty` of this checkout, and for
# a checkout with changes a digest of them (-dirty-1a2b3c4d: the tracked files' diff and
# the untracked files that git does not ignore), so that a build of changed sources is
# never taken for another's (the container image's tag is this version). "unknown"
# outside a git checkout.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
version=$(git describe --always --dirty 2>/dev/null) || { echo unknown; exit 0; }
if [[ $version == *-dirty ]]; then
  digest=$({
    git diff HEAD --binary
    git ls-files --others --exclude-standard -z | xargs -0 -r sha256sum
  } | sha256sum | cut -c1-8)
  version=$version-$digest
fi
echo "$version"
