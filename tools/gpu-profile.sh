#!/usr/bin/env bash
# Nsight Compute profile of the decode kernels that decide the step time (run on the GPU host after
# tools/gpu-check.sh has built $BUILD): the routed-experts kernels (bench_gpu's moe section: gate/up and down
# at T = 1, 4, 8) and the bf16 GEMVs (gemm section), a few launches each. Why: the MXFP4 experts kernel runs at
# ~0.4 of the copy bandwidth while its instruction count allows ~0.75 (docs/kernels.md); the stall reasons,
# issue activity, achieved occupancy and DRAM throughput say whether it waits on memory, on shared-memory
# loads, on the mma chain or on the integer pipe.
#
# ncu reads hardware counters only on hosts that expose them (not under gVisor); --clock-control none leaves
# the clocks as they are. Output: $OUT/ncu_<section>.txt (the details page per kernel) and a short
# table of the metrics below per kernel name.
#
# Environment: BUILD (default build), OUT (default /tmp/k3c-gpu-profile), SECTIONS (default "moe gemm"),
# LAUNCHES (kernels profiled per section, default 24), STALLS (1: a second, short ncu run per section for the
# stall reasons, smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio: warps waiting on each
# reason per issued instruction; the details pages here lack them, as pc sampling is unavailable), KERNEL (an
# ncu kernel-name regex, e.g. "moe_pair_mx_kernel|moe_mma_kernel": only those kernels are counted and
# profiled, after 2 of them are skipped).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=${OUT:-/tmp/k3c-gpu-profile}
SECTIONS=${SECTIONS:-"moe gemm"}
LAUNCHES=${LAUNCHES:-24}
STALLS=${STALLS:-0}
KERNEL=${KERNEL:-}
# which launches: the first LAUNCHES after 8 of any kernel, or after 2 of those KERNEL names
select=(--launch-skip 8)
[ -n "$KERNEL" ] && select=(--kernel-name "regex:$KERNEL" --launch-skip 2)
mkdir -p "$OUT"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -z "$NCU" ]; then
    echo "gpu-profile: ncu not found" >&2
    exit 1
fi
[ -x "$BUILD/bench_gpu" ] || { echo "gpu-profile: $BUILD/bench_gpu missing (run tools/gpu-check.sh first)" >&2; exit 1; }
metrics=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,smsp__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem
# each timed row of bench_gpu launches its kernels 4 times (2 warm-ups, 1 untimed, 1 sample), so the
# LAUNCHES profiled cover several rows
export K3C_BENCH_REPS=${K3C_BENCH_REPS:-1}
for section in $SECTIONS; do
    # the copy benchmark and warm-up launches come first: skip 8 kernels, then profile LAUNCHES of them
    timeout 300 "$NCU" --clock-control none "${select[@]}" --launch-count "$LAUNCHES" \
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
        --metrics "$metrics" "$BUILD/bench_gpu" "$section" >"$OUT/ncu_$section.txt" 2>&1
    echo "== $section: ncu exit $? ($OUT/ncu_$section.txt)"
    # one line per kernel: name, duration, DRAM %, issue active %, warps active %, top stall reasons
    awk '/^  [a-z_0-9]+.*\(/ { name = $1 }
         /gpu__time_duration.sum/ { t = $NF }
         /dram__throughput.avg.pct_of_peak_sustained_elapsed/ { d = $NF }
         /smsp__issue_active.avg.pct_of_peak_sustained_active/ { i = $NF }
         /sm__warps_active.avg.pct_of_peak_sustained_active/ { w = $NF; printf "%-34s time %-10s dram%% %-7s issue%% %-7s warps%% %s\n", substr(name, 1, 34), t, d, i, w }' \
        "$OUT/ncu_$section.txt" | sort | uniq -c | head -20
    grep -E "Stall|stall" "$OUT/ncu_$section.txt" | sort | uniq -c | sort -rn | head -12
    if [ "$STALLS" = 1 ]; then
        stalls=""
        for r in long_scoreboard short_scoreboard wait math_pipe_throttle mio_throttle lg_throttle not_selected \
                 selected barrier no_instruction dispatch_stall branch_resolving drain membar sleeping tex_throttle; do
            stalls="$stalls${stalls:+,}smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
        done
        timeout 120 "$NCU" --clock-control none "${select[@]}" --launch-count "$LAUNCHES" --metrics "$stalls" \
            "$BUILD/bench_gpu" "$section" >"$OUT/ncu_stalls_$section.txt" 2>&1
        echo "== $section stalls: ncu exit $? ($OUT/ncu_stalls_$section.txt)"
        grep -E "^  [a-z_0-9]+.*\(|issue_stalled" "$OUT/ncu_stalls_$section.txt" | sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | head -40
    fi
done
