#!/usr/bin/env bash
# Block-stamp measurement of the specialized decode step (K3C_CUDA_PROFILE=3; cuda/stamp.h, docs/decode-limits.md),
# run on the GPU host from a fresh copy in one call of under 8 minutes: builds build-stamps/k3c (make -j16
# STAMPS=1: the stamps are compiled only into such a build, cuda/stamp.cuh), then
# `k3c bench --device cuda --context 64` with the block stamps on for kimi-linear-48b at batch 1, 2, 8 and
# k3-slice at batch 1, 8, 64 (device-synthetic weights, no checkpoint). In each run every shape's plain
# replays come first (STEP stock, SPEC, SPECID lines: stamps compiled in, off) and then one greedy step
# replayed with the stamps on, whose report follows: STAMPOP (per op), STAMPNAME (per op name), STAMPCLASS
# (per kernel class), STAMPSTEP (the step: GPU time, spans, gaps, floor, the stamps' own cost), STAMPL (per
# launch), COVER (experts per MoE layer, pairs per expert). The stock STEP rows are slower in this mode (the
# stock path times each op with events, as with K3C_CUDA_PROFILE=1): compare SPEC / SPECID only.
#
# Then (VERIFY=1) each preset's batch 1 at q = 1, 4 with the stamps on (the verify goal), and (PLAIN=1) each
# preset's batches once more with K3C_CUDA_PROFILE unset: SPEC rows with no profile object (the stamps compiled
# in and off: 1.4-4.3 % slower than a default build, whose `k3c bench` gives the production numbers). The build should take about a minute on 16 cores (the slowest .cu, moe_pair.cu, compiles in
# 6 s alone on this project's 2-core machine); a bench run an estimated ~30 s (engine, prefill, captures).
#
# Output: $OUT/stamp_<preset>.txt, stamp_q4_<preset>.txt, plain_<preset>.txt (each run whole),
# $OUT/summary.txt (what is printed at the end: the SPEC rows, the step lines, the class table condensed, the
# coverage summaries, tools/stamp_predict.py's predictions), $OUT/build.log.
# Environment: OUT (default ./out/measure), BUILD (default build), JOBS (16), VERIFY (1), PLAIN (1),
# KL_BATCHES (1,2,8), K3_BATCHES (1,8,64), CONTEXT (64).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-./out/measure}
BUILD=${BUILD:-build-stamps}
JOBS=${JOBS:-16}
PLAIN=${PLAIN:-1}
VERIFY=${VERIFY:-1}
CONTEXT=${CONTEXT:-64}
KL_BATCHES=${KL_BATCHES:-1,2,8}
K3_BATCHES=${K3_BATCHES:-1,8,64}
mkdir -p "$OUT"
t0=$(date +%s)

. "$(dirname "$0")/gpu-deps.sh"

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null || true
git log --oneline -1 2>/dev/null || true
echo "== build (make -j$JOBS STAMPS=1 $BUILD/k3c)"
if ! make -j"$JOBS" STAMPS=1 BUILD="$BUILD" "$BUILD/k3c" >"$OUT/build.log" 2>&1; then
    tail -30 "$OUT/build.log"
    echo "gpu-measure: build failed ($OUT/build.log)" >&2
    exit 1
fi
echo "built in $(($(date +%s) - t0)) s"

rc=0
run() { # name, K3C_CUDA_PROFILE value (empty: unset), bench arguments
    local name=$1 prof=$2 log=$OUT/$1.txt
    shift 2
    if [ -n "$prof" ]; then
        K3C_CUDA_PROFILE=$prof timeout 200 "$BUILD/k3c" bench --device cuda --context "$CONTEXT" "$@" >"$log" 2>&1
    else
        env -u K3C_CUDA_PROFILE timeout 150 "$BUILD/k3c" bench --device cuda --context "$CONTEXT" "$@" >"$log" 2>&1
    fi
    local r=$?
    [ $r -eq 0 ] || { rc=1; echo "gpu-measure: $name exit $r" >&2; tail -5 "$log"; }
    echo "$name done at $(($(date +%s) - t0)) s"
}
run stamp_kimi-linear-48b 3 --preset kimi-linear-48b --batches "$KL_BATCHES"
run stamp_k3-slice 3 --preset k3-slice --batches "$K3_BATCHES"
if [ "$VERIFY" = 1 ]; then
    run stamp_q4_kimi-linear-48b 3 --preset kimi-linear-48b --batches 1 --verify 1,4
    run stamp_q4_k3-slice 3 --preset k3-slice --batches 1 --verify 1,4
fi
if [ "$PLAIN" = 1 ]; then
    run plain_kimi-linear-48b "" --preset kimi-linear-48b --batches "$KL_BATCHES"
    run plain_k3-slice "" --preset k3-slice --batches "$K3_BATCHES"
fi

# the summary: rows and step lines whole, the class table as class, b, pitch us, MB, GB/s over the pitch,
# fraction of copy, mean ramp and drain (us)
{
    for f in "$OUT"/stamp_*.txt "$OUT"/plain_*.txt; do
        [ -f "$f" ] || continue
        echo "== $(basename "$f" .txt)"
        grep -E '^(bench |SPEC |SPECID |RATIO|PROF .*block stamps|STAMP b=|STAMPSTEP|COVER b=[0-9]+ q=[0-9]+: )' "$f"
        awk '$1 == "STAMPCLASS" && $4 != "class" { printf "CLASS %-8s %s %s pitch_us %9.1f MB %9.1f GB/s %7.1f copy %5.3f ramp %6.2f drain %6.2f ops %d\n", $4, $2, $3, $10, $13, $15, $16, $11, $12, $6 }' "$f"
    done
} >"$OUT/summary.txt"
# the model of docs/decode-limits.md section 3 on the measured ops: as measured, and with the experts at the
# MXFP4 kernel's target rate
if command -v python3 >/dev/null 2>&1; then
    python3 tools/stamp_predict.py "$OUT"/stamp_*.txt >>"$OUT/summary.txt" 2>&1
    python3 tools/stamp_predict.py --eta-experts 0.60 "$OUT"/stamp_*k3-slice.txt >>"$OUT/summary.txt" 2>&1
fi
cat "$OUT/summary.txt"
echo "gpu-measure: $(($(date +%s) - t0)) s, output in $OUT (exit $rc)"
exit $rc
