#!/usr/bin/env bash
# The performance questions open after the 2026-11-29 runs, in one GPU call of about 5 minutes (it builds
# through tools/gpu-check.sh first when $BUILD has no binaries; src/cuda/NOTES.md "Written after run 8" lists
# what each step should show):
#  1. routed experts: bench_gpu's moe section (MXFP4 at K3's shape, bf16 at Kimi Linear 48B's) under the
#     launch knobs K3C_MOE_BCOLS (B columns per pass: 2, 4; default up to 8) and K3C_MOE_WPR (warps per band:
#     1, 2; default chosen per shape),
#     for kimi-linear-48b's b=32 regression and the MXFP4 rate;
#  2. Nsight Compute on the moe and gemm sections (tools/gpu-profile.sh), when ncu reads counters here;
#  3. the decode and verify steps, stock and specialized: k3-slice b 1,8,64 and kimi-linear-48b b 1,8,32, q 1
#     and 4, context 256, and one op profile of each preset at b 1.
# Output: $OUT/perf_*.txt and a short summary. Environment: BUILD (default build), OUT (default
# /tmp/k3c-gpu-perf), NCU (1: run step 2, default 1).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=${OUT:-/tmp/k3c-gpu-perf}
NCU=${NCU:-1}
mkdir -p "$OUT"
if ! [ -x "$BUILD/bench_gpu" ] || ! [ -x "$BUILD/k3c" ]; then
    # a fresh machine: gpu-check builds (with the committed cJSON packages where the host has none) and runs
    # one quick test, nothing else
    echo "gpu-perf: building through tools/gpu-check.sh"
    OUT="$OUT/build" BUILD="$BUILD" TESTS=gpu_router SANITIZE=0 KBENCH=0 BENCH=0 bash tools/gpu-check.sh >/dev/null 2>&1 ||
        { echo "gpu-perf: build failed ($OUT/build/build.log)" >&2; exit 1; }
fi

echo "== routed experts: K3C_MOE_BCOLS / K3C_MOE_WPR sweeps"
for knob in "" BCOLS=2 BCOLS=4 WPR=1 WPR=2; do
    name=${knob:-default}
    env ${knob:+K3C_MOE_$knob} timeout 60 "$BUILD/bench_gpu" moe >"$OUT/perf_moe_$name.txt" 2>&1
    printf '%-9s' "$name"
    grep -E '^BENCH moe_(mxfp4_all_T(1|4|8)_k16|bf16_all_T(1|8|32)_k8) ' "$OUT/perf_moe_$name.txt" |
        awk '{ printf " %s %s", substr($2, 5), $6 }'
    echo
done

if [ "$NCU" = 1 ]; then
    echo "== Nsight Compute (tools/gpu-profile.sh)"
    OUT="$OUT/ncu" BUILD="$BUILD" timeout 150 bash tools/gpu-profile.sh 2>&1 | tail -40
fi

echo "== decode and verify steps"
timeout 90 "$BUILD/k3c" bench --device cuda --preset k3-slice --batches 1,8,64 --verify 1,4 --context 256 \
    >"$OUT/perf_k3slice.txt" 2>&1
timeout 90 "$BUILD/k3c" bench --device cuda --preset kimi-linear-48b --batches 1,8,32 --verify 1,4 --context 256 \
    >"$OUT/perf_kl48.txt" 2>&1
for preset in k3-slice kimi-linear-48b; do
    K3C_CUDA_PROFILE=1 timeout 60 "$BUILD/k3c" bench --device cuda --preset "$preset" --batches 1 --context 256 \
        >"$OUT/perf_prof_$preset.txt" 2>&1
done
grep -hE '^(STEP|SPEC|RATIO)' "$OUT/perf_k3slice.txt" "$OUT/perf_kl48.txt"
grep -hE '^PROF' "$OUT"/perf_prof_*.txt | head -40
