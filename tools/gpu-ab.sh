#!/usr/bin/env bash
# A/B of two versions of k3c on the GPU host in one call: the tree this script runs from (A: the working tree
# sent to the device) and a git ref (B: e.g. a branch), each built in its own folder, then the same
# benchmark commands run on A and B alternately, and their BENCH / STEP / SPEC lines printed next to each
# other. B comes from `git archive REF` of the repository beside this tree: on the device host that .git is a
# copy from the start of the session (src/cuda/NOTES.md, docs/BENCHMARKS.md method note), so REF must have
# existed then (a branch pushed in an earlier session); the archive, unlike a clone, is not checked out from
# anything else.
#
# Usage: tools/gpu-ab.sh REF [command ...]   (default commands: bench_gpu moe, then k3c bench on k3-slice
# and kimi-linear-48b at batch 1 and 8). In a command, @ stands for the build folder of the side it runs on.
# Environment: OUT (logs; default /tmp/k3c-ab), JOBS (16), TESTS (test_gpu filters to run on B before the
# benchmarks, e.g. "gpu_moe gpu_mxfp4"; default none).
# Example: tools/gpu-ab.sh wip/mxfp4-repack
set -uo pipefail
cd "$(dirname "$0")/.."
REF=${1:?usage: tools/gpu-ab.sh REF [command ...]}
shift
OUT=${OUT:-/tmp/k3c-ab}
JOBS=${JOBS:-16}
mkdir -p "$OUT"
if [ $# -eq 0 ]; then
    set -- "@/bench_gpu moe" \
        "@/k3c bench --device cuda --preset k3-slice --batches 1,8 --context 256" \
        "@/k3c bench --device cuda --preset kimi-linear-48b --batches 1,8 --context 256"
fi
A=$PWD
B=$OUT/tree-b
rm -rf "$B" && mkdir -p "$B"
git archive "$REF" | tar -x -C "$B" || { echo "gpu-ab: cannot archive $REF (not in this .git?)" >&2; exit 1; }
# a fresh build on both sides, through gpu-check (it unpacks the committed cJSON packages when the host has none)
for side in A B; do
    dir=$A; [ "$side" = B ] && dir=$B
    OUT="$OUT/build-$side" BUILD=build-ab TESTS=gpu_router SANITIZE=0 KBENCH=0 BENCH=0 \
        bash "$dir/tools/gpu-check.sh" >/dev/null 2>&1 ||
        { echo "gpu-ab: build or first test failed on $side ($OUT/build-$side)" >&2; exit 1; }
done
if [ -n "${TESTS:-}" ]; then
    for t in $TESTS; do
        timeout 300 "$B/build-ab/test_gpu" "$t" >"$OUT/test-b-$t.txt" 2>&1
        echo "B test $t: exit $? $(grep -E '^[0-9]+ passed' "$OUT/test-b-$t.txt")"
        grep -E '^METRIC|FAIL|    tests/' "$OUT/test-b-$t.txt" | head -12
    done
fi
n=0
for cmd in "$@"; do
    n=$((n + 1))
    for side in A B; do
        dir=$A; [ "$side" = B ] && dir=$B
        (cd "$dir" && timeout 240 ${cmd//@/build-ab}) >"$OUT/run$n-$side.txt" 2>&1
        echo "== [$n] $side ($([ "$side" = A ] && echo "this tree" || echo "$REF")): ${cmd//@/build-ab}"
        grep -E '^(BENCH|STEP|SPEC|RATIO)' "$OUT/run$n-$side.txt"
    done
done
