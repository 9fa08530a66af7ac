#!/usr/bin/env bash
# The questions open on 2026-11-30, in one GPU call of about 8 minutes (it builds through
# tools/gpu-check.sh first when $BUILD has no binaries; docs/kernels.md has what
# each step should show):
#  0. whether PDL (K3C_PDL=1) is what failed a GPU test twice on 2026-11-30: gpu_greedy_mini (fresh seeds)
#     $GREEDY_RUNS times with PDL on, then as many times off;
#  1. the kernel benchmark (bench_gpu: gemm, moe, kda, mla) with PDL on and its gemm section again without:
#     what programmatic dependent launch gives the bf16 weight streams, launched alone (T1) and back to back
#     (b2b);
#  2. routed experts under the launch knobs K3C_MOE_BCOLS (B columns per pass: 8, the plan before
#     2026-11-30; 4; 2) and K3C_MOE_WPR (warps per band: 1, 2), for kimi-linear-48b's b=32 step and the
#     MXFP4 rate;
#  3. Nsight Compute on the MXFP4 experts kernel with its stall reasons (tools/gpu-profile.sh), when ncu
#     reads counters here;
#  4. the decode and verify steps, stock and specialized: k3-slice b 1,8,64 and kimi-linear-48b b 1,8,32, q 1
#     and 4, context 256, PDL on; b 1 again without; one op profile of each preset at b 1.
# Output: $OUT/perf_*.txt and a short summary. Environment: BUILD (default build), OUT (default
# /tmp/k3c-gpu-perf), NCU (1: run step 3, default 1), GREEDY_RUNS (default 3; 0 skips step 0), PARTS (the
# steps to run, default "greedy bench sweep ncu steps"). All of it is about 11 minutes, over the device
# tool's 10-minute call: run it as two calls, PARTS="greedy bench sweep" then PARTS="ncu steps".
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=${OUT:-/tmp/k3c-gpu-perf}
NCU=${NCU:-1}
GREEDY_RUNS=${GREEDY_RUNS:-3}
PARTS=${PARTS:-"greedy bench sweep ncu steps"}
part() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
mkdir -p "$OUT"
if ! [ -x "$BUILD/bench_gpu" ] || ! [ -x "$BUILD/k3c" ]; then
    # a fresh machine: gpu-check builds (with the committed cJSON packages where the host has none) and runs
    # one quick test, nothing else
    echo "gpu-perf: building through tools/gpu-check.sh"
    OUT="$OUT/build" BUILD="$BUILD" TESTS=gpu_router SANITIZE=0 KBENCH=0 BENCH=0 bash tools/gpu-check.sh >/dev/null 2>&1 ||
        { echo "gpu-perf: build failed ($OUT/build/build.log)" >&2; exit 1; }
fi

if part greedy && [ "$GREEDY_RUNS" -gt 0 ]; then
    echo "== gpu_greedy_mini, $GREEDY_RUNS runs with K3C_PDL=1 and $GREEDY_RUNS without (about 27 s each)"
    for pdl in 1 0; do
        for i in $(seq "$GREEDY_RUNS"); do
            K3C_PDL=$pdl timeout 90 "$BUILD/test_gpu" gpu_greedy_mini >"$OUT/perf_greedy_pdl${pdl}_$i.txt" 2>&1
            rc=$?
            echo "K3C_PDL=$pdl run $i: exit $rc" \
                "$(grep -hE '^(failed with seed|[0-9]+ passed)' "$OUT/perf_greedy_pdl${pdl}_$i.txt" | tr '\n' ' ')"
            grep -h "rc failed" "$OUT/perf_greedy_pdl${pdl}_$i.txt"
        done
    done
fi

if part bench; then
    echo "== kernel benchmark, PDL on and, for gemm, off"
    K3C_PDL=1 timeout 120 "$BUILD/bench_gpu" >"$OUT/perf_bench_gpu.txt" 2>&1
    K3C_PDL=0 timeout 60 "$BUILD/bench_gpu" gemm >"$OUT/perf_gemm_nopdl.txt" 2>&1
    printf '%-34s %8s %8s\n' gemv "PDL=0" "PDL=1"
    for shape in 12288x7168 7168x12288 4096x4096 2048x4096 896x7168 576x7168; do
        for kind in T1 T1_b2b T8_b2b; do
            n="gemm_bf16_${shape}_$kind"
            a=$(awk -v n="$n" '$2 == n { print $6 }' "$OUT/perf_gemm_nopdl.txt")
            b=$(awk -v n="$n" '$2 == n { print $6 }' "$OUT/perf_bench_gpu.txt")
            printf '%-34s %8s %8s\n' "$n" "${a:--}" "${b:--}"
        done
    done
fi

if part sweep; then
    echo "== routed experts: K3C_MOE_BCOLS / K3C_MOE_WPR sweeps"
    for knob in "" BCOLS=8 BCOLS=4 BCOLS=2 WPR=1 WPR=2; do
        name=${knob:-default}
        name=${name/=/_} # no '=' in the file names: some copies back from a GPU host drop such names
        env ${knob:+K3C_MOE_$knob} timeout 60 "$BUILD/bench_gpu" moe >"$OUT/perf_moe_$name.txt" 2>&1
        printf '%-9s' "$name"
        grep -E '^BENCH moe_(mxfp4_all_T(1|4|8)_k16|bf16_all_T(1|8|32)_k8) ' "$OUT/perf_moe_$name.txt" |
            awk '{ printf " %s %s", substr($2, 5), $6 }'
        echo
    done
fi

if part ncu && [ "$NCU" = 1 ]; then
    echo "== Nsight Compute (tools/gpu-profile.sh), MXFP4 experts with stall reasons"
    OUT="$OUT/ncu" BUILD="$BUILD" SECTIONS=moe LAUNCHES=6 STALLS=1 timeout 120 bash tools/gpu-profile.sh 2>&1 | tail -30
fi

if part steps; then
    echo "== decode and verify steps"
    K3C_PDL=1 timeout 90 "$BUILD/k3c" bench --device cuda --preset k3-slice --batches 1,8,64 --verify 1,4 \
        --context 256 >"$OUT/perf_k3slice.txt" 2>&1
    K3C_PDL=1 timeout 90 "$BUILD/k3c" bench --device cuda --preset kimi-linear-48b --batches 1,8,32 --verify 1,4 \
        --context 256 >"$OUT/perf_kl48.txt" 2>&1
    for preset in k3-slice kimi-linear-48b; do
        K3C_PDL=0 timeout 60 "$BUILD/k3c" bench --device cuda --preset "$preset" --batches 1 --context 256 \
            >"$OUT/perf_nopdl_$preset.txt" 2>&1
        K3C_CUDA_PROFILE=1 timeout 60 "$BUILD/k3c" bench --device cuda --preset "$preset" --batches 1 --context 256 \
            >"$OUT/perf_prof_$preset.txt" 2>&1
    done
    grep -hE '^(STEP|SPEC|RATIO)' "$OUT/perf_k3slice.txt" "$OUT/perf_kl48.txt"
    echo "-- K3C_PDL=0"
    grep -hE '^(STEP|SPEC)' "$OUT"/perf_nopdl_*.txt
    grep -hE '^PROF' "$OUT"/perf_prof_*.txt | head -44
fi
