#!/usr/bin/env bash
# A/B of two versions of k3c on the GPU host in one call: the tree this script runs from (A: the working tree
# sent to the device) and a git ref (B: e.g. a branch), each built in its own folder, then the same
# benchmark commands run on A and B alternately, and their BENCH / STEP / SPEC lines printed next to each
# other. B comes from `git archive REF` of the repository beside this tree: on a GPU host that .git can be an
# older copy than the tree (docs/kernels.md, "How the numbers were taken"), so REF must exist in that
# copy; the archive, unlike a clone, is not checked out from
# anything else.
#
# REF may also be a tarball (a path ending in .tar) made here by `git archive -o out/NAME.tar BRANCH` and sent
# with the tree: the way to run a branch that the GPU host's .git does not have.
#
# Usage: tools/gpu-ab.sh REF[,REF...] [command ...]   (several refs: each gets a tree of its own, B1, B2, ...,
# built and run beside A in the same call; default commands: bench_gpu moe, then k3c bench on k3-slice
# and kimi-linear-48b at batch 1 and 8). In a command, @ stands for the build folder of the side it runs on;
# a command is split on spaces (no shell quoting): settings go in front as `env NAME=value`. A command may be
# a test run too (`env K3C_MOE_PAIR_MX=1 @/test_gpu gpu_moe_mxfp4`): its "N passed" and FAIL lines print.
# Environment: OUT (logs; default /tmp/k3c-ab), JOBS (16), TESTS (test_gpu filters to run on every B tree
# before the benchmarks, e.g. "gpu_moe gpu_mxfp4"; default none), SKIP_BUILD (1: use the build-ab folders
# as they are; for re-running commands in a second call on a warm machine).
# Example: tools/gpu-ab.sh my-branch
set -uo pipefail
cd "$(dirname "$0")/.."
REFS=${1:?usage: tools/gpu-ab.sh REF[,REF...] [command ...]}
shift
OUT=${OUT:-/tmp/k3c-ab}
JOBS=${JOBS:-16}
mkdir -p "$OUT"
if [ $# -eq 0 ]; then
    set -- "@/bench_gpu moe" \
        "@/k3c bench --device cuda --preset k3-slice --batches 1,8 --context 256" \
        "@/k3c bench --device cuda --preset kimi-linear-48b --batches 1,8 --context 256"
fi
IFS=, read -r -a refs <<<"$REFS"
sides=(A)
dirs=("$PWD")
labels=("this tree")
i=0
for ref in "${refs[@]}"; do
    i=$((i + 1))
    side=B$i
    [ ${#refs[@]} -eq 1 ] && side=B
    dir=$OUT/tree-$side
    if [ "${SKIP_BUILD:-0}" != 1 ]; then
        rm -rf "$dir" && mkdir -p "$dir"
        if [[ "$ref" == *.tar ]]; then
            tar -x -C "$dir" -f "$ref" || { echo "gpu-ab: cannot unpack $ref" >&2; exit 1; }
        else
            git archive "$ref" | tar -x -C "$dir" || { echo "gpu-ab: cannot archive $ref (not in this .git?)" >&2; exit 1; }
        fi
    fi
    sides+=("$side")
    dirs+=("$dir")
    labels+=("$ref")
done
# a build on every side, through gpu-check (it unpacks the committed cJSON packages when the host has none).
# A builds first; each B side starts from a copy of A's build folder with the files that differ from A's
# touched, so make rebuilds only what the branch changed (a full build is ~1 minute a side; a branch
# rebuilt in ~15 s on the H200 host, 2026-11-30). INCREMENTAL=0: every side from scratch.
if [ "${SKIP_BUILD:-0}" != 1 ]; then
    for k in "${!sides[@]}"; do
        if [ "$k" -gt 0 ] && [ "${INCREMENTAL:-1}" = 1 ] && [ -d "${dirs[0]}/build-ab" ]; then
            rm -rf "${dirs[$k]}/build-ab" && cp -a "${dirs[0]}/build-ab" "${dirs[$k]}/build-ab"
            # every source older than A's objects first (an archive's files carry its commit's time, which
            # may be newer than A's build), then the ones that differ from A's newer than all of them
            (cd "${dirs[$k]}" && find src tests include Makefile -type f 2>/dev/null | while read -r f; do
                if cmp -s "$f" "${dirs[0]}/$f"; then touch -d '2000-01-01' "$f"; else touch "$f"; fi
            done)
        fi
        OUT="$OUT/build-${sides[$k]}" BUILD=build-ab TESTS=gpu_router SANITIZE=0 KBENCH=0 BENCH=0 \
            bash "${dirs[$k]}/tools/gpu-check.sh" >/dev/null 2>&1 ||
            { echo "gpu-ab: build or first test failed on ${sides[$k]} ($OUT/build-${sides[$k]})" >&2; exit 1; }
    done
fi
if [ -n "${TESTS:-}" ]; then
    for k in "${!sides[@]}"; do
        [ "$k" -eq 0 ] && continue
        for t in $TESTS; do
            timeout 300 "${dirs[$k]}/build-ab/test_gpu" "$t" >"$OUT/test-${sides[$k]}-$t.txt" 2>&1
            echo "${sides[$k]} test $t: exit $? $(grep -E '^[0-9]+ passed' "$OUT/test-${sides[$k]}-$t.txt")"
            grep -E '^METRIC|FAIL|    tests/' "$OUT/test-${sides[$k]}-$t.txt" | head -12
        done
    done
fi
n=0
for cmd in "$@"; do
    n=$((n + 1))
    for k in "${!sides[@]}"; do
        (cd "${dirs[$k]}" && timeout 240 ${cmd//@/build-ab}) >"$OUT/run$n-${sides[$k]}.txt" 2>&1
        echo "== [$n] ${sides[$k]} (${labels[$k]}): ${cmd//@/build-ab}"
        grep -E '^(BENCH|STEP|SPEC|RATIO|PROF|[0-9]+ passed)|FAIL' "$OUT/run$n-${sides[$k]}.txt"
    done
done
