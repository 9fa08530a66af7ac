#!/usr/bin/env bash
# Serving on the GPU host: `k3c serve --device cuda` under tools/serve_bench.py (a concurrency sweep: TTFT, TPOT,
# ITL, E2EL and throughput with vLLM's definitions, docs/SERVING.md), each run checking from /metrics that the
# decode and verify steps ran on the specialized executor (--check-executor: k3c:executor_steps_total against
# the decode + verify routes of k3c:engine_steps_total):
#   1. the trained default model (models/k3-fortune), greedy;
#   2. the same with prompt-lookup speculation (--spec 3: verify steps);
#   3. the same with a shared 1024-token system prompt (prefix-cache hits: TTFT with a hit; compare with 1);
#   4. kimi-linear-48b, its weights generated in device memory (--preset), greedy, and with --spec 3.
# Run after tools/gpu-check.sh, which builds $BUILD/k3c with the server (libmicrohttpd from tools/debs where
# the host has none). Each run is one command of a few minutes at most (SECONDS_EACH bounds them); the tables
# go to stdout and $OUT.
#
# Environment: BUILD (default build), OUT (default /tmp/k3c-gpu-serve), RUNS (default "1 2 3 4").
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
LOGDIR=${OUT:-/tmp/k3c-gpu-serve}
RUNS=${RUNS:-"1 2 3 4"}
SECONDS_EACH=${SECONDS_EACH:-540}
mkdir -p "$LOGDIR"
if ! [ -x "$BUILD/k3c" ]; then
    echo "gpu-serve: $BUILD/k3c not built (run tools/gpu-check.sh first)" >&2
    exit 1
fi
fail=0
bench() { # name, then serve_bench.py arguments
    local name=$1
    shift
    echo "== $name: python3 tools/serve_bench.py --k3c $BUILD/k3c $*"
    timeout "$SECONDS_EACH" python3 tools/serve_bench.py --k3c "$BUILD/k3c" --check-executor "$@" \
        2>&1 | tee "$LOGDIR/$name.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || { echo "gpu-serve: $name failed"; fail=1; }
}
for r in $RUNS; do
    case $r in
    1) bench fortune --server-args "--device cuda --max-seqs 64" --concurrency 1,4,16,64 --num-prompts 128 \
           --input-len 128 --output-len 128 ;;
    2) bench fortune-spec3 --server-args "--device cuda --max-seqs 64 --spec 3" --concurrency 1,4,16,64 \
           --num-prompts 128 --input-len 128 --output-len 128 ;;
    3) bench fortune-prefix1024 --server-args "--device cuda --max-seqs 64" --concurrency 1,16 --num-prompts 64 \
           --prefix-len 1024 --input-len 64 --output-len 64 ;;
    4) bench kimi-linear-48b --server-args "--device cuda --preset kimi-linear-48b --max-seqs 64 --max-context 2048 \
--max-batched-tokens 2048 --snapshot-memory 2G" --concurrency 1,8,32,64 --num-prompts 128 --input-len 512 \
           --output-len 128
       bench kimi-linear-48b-spec3 --server-args "--device cuda --preset kimi-linear-48b --max-seqs 64 \
--max-context 2048 --max-batched-tokens 2048 --spec 3" --concurrency 1,8,32 --num-prompts 64 --input-len 512 \
           --output-len 128 ;;
    esac
done
exit $fail
