#!/usr/bin/env bash
# tools/gpu-check.sh from a fresh copy of this tree: every file but build outputs, wheels and scratch (the
# .gitignore entries) goes to an empty folder ($FRESH, default /tmp/k3c-fresh) and the check builds and runs
# there, so nothing built or installed by hand beside the checkout takes part. Why a copy and not `git clone .`: on a GPU host the
# .git that travels with the tree can be older than its files, so a clone checks out that old
# commit, not the files sent (seen on 2026-11-29: the clone ran 4e57831 while the tree held 839211f).
# Arguments and environment pass through to gpu-check.sh (OUT, SANITIZE, TESTS, ...).
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
FRESH=${FRESH:-/tmp/k3c-fresh}
rm -rf "$FRESH" && mkdir -p "$FRESH" || exit 1
tar -C "$src" --exclude=./build --exclude='./build-*' --exclude=./.whl --exclude=./.snap --exclude=./.git --exclude=./out --exclude=./.debs -cf - . |
    tar -C "$FRESH" -xf - || exit 1
echo "gpu-fresh: $(find "$FRESH" -type f | wc -l) files copied to $FRESH"
exec bash "$FRESH/tools/gpu-check.sh" "$@"
