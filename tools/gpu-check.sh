#!/usr/bin/env bash
# GPU check, run on the GPU host from a fresh clone: builds everything (make -j16 all gpu-test), runs the GPU
# tests (build/test_gpu: every CUDA kernel against its CPU counterpart, and the whole stock forward on the
# CUDA backend against the CPU backend) with compute-sanitizer runs beside them in the background (memcheck
# on a small forward, racecheck on the routed-experts kernel, the KDA kernels and a device-synthetic forward;
# bounded time each), then alone the kernel benchmark (build/bench_gpu: achieved GB/s next to a measured
# device-to-device copy) and the decode benchmark (k3c bench --device cuda on k3-slice and kimi-linear-48b:
# stock STEP and executor SPEC lines), and prints a short table last. About 5-6 minutes on an H200 (320 s on
# 2026-11-30); from a fresh copy on a cold machine ~7-8 minutes before the benchmarks (with KBENCH=0
# BENCH=0 406 s and 504 s, 2026-11-30), so under a limit of 600 s a command run it with KBENCH=0 BENCH=0 and
# the decode benchmark in a command of its own.
#
# cJSON: when the host has no libcjson-dev (GPU hosts here reach no package registry), the Debian packages
# committed in tools/debs/ (Debian 12's libcjson1 and libcjson-dev 1.7.15, MIT-licensed, fetched with
# `apt-get download libcjson1 libcjson-dev`; plain C, needs only libc6 >= 2.14) are unpacked into
# $BUILD/debs-root and passed to make through CFLAGS / LDLIBS (environment, so the Makefile's own flags are
# appended to them). A fresh clone therefore builds on such a host with nothing carried beside it.
#
# Environment: BUILD (default build), JOBS (16), OUT (a folder for the logs; default /tmp/k3c-gpu-check),
# SANITIZE (1: run compute-sanitizer when present), SAN_RUNS ("tool:test:seconds ..."), BENCH (1: run the
# stock decode benchmark), KBENCH (1: run the kernel benchmark), CBENCH (1: run the all-reduce latency
# benchmark, build/bench_comm: the mailbox on 2, 4, 8 ranks of one GPU, or one rank per GPU beside NCCL),
# LBENCH (1: run the load benchmark, build/bench_load: checkpoints written to $LOGDIR's disk and loaded into GPU memory), TESTS (space-separated test_gpu name filters;
# default: all tests), TEST_PROCS (the whole suite in that many processes at once; default 4: on 2026-11-30
# the same 46 tests passed with the longest process at 155 s, against 314 s for one process).
# PART (all; suite: the test suite without the environment variants; variants: only those): the check of
# record in two commands where one would pass a command's time limit (2026-12-02, from a fresh copy: the build
# and the suite in 8 processes took about 300-340 s, then the variants one after another ~90 s each).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
JOBS=${JOBS:-16}
LOGDIR=${OUT:-/tmp/k3c-gpu-check}
SANITIZE=${SANITIZE:-1}
BENCH=${BENCH:-1}
KBENCH=${KBENCH:-1}
CBENCH=${CBENCH:-1}
LBENCH=${LBENCH:-1}
TEST_PROCS=${TEST_PROCS:-4}
PART=${PART:-all}
SAN_RUNS=${SAN_RUNS:-"memcheck:gpu_forward_tiny:120 racecheck:gpu_moe_bf16:90 racecheck:gpu_kda_recurrent:50 racecheck:gpu_synthetic_tiny:60"}
mkdir -p "$LOGDIR"

. "$(dirname "$0")/gpu-deps.sh"

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader || true
command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || echo "gpu-check: warning: no nvcc found" >&2

echo "== build"
if ! make -j"$JOBS" BUILD="$BUILD" all gpu-test >"$LOGDIR/build.log" 2>&1; then
    tail -40 "$LOGDIR/build.log"
    echo "gpu-check: build failed (log: $LOGDIR/build.log)" >&2
    exit 1
fi
grep -E 'warning:' "$LOGDIR/build.log" | head -20

# The sanitizer runs (correctness, not timing) go in the background while the test suite runs, so the
# GPU is busy with both at once; they are waited for before the benchmarks, which run alone.
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
run_sanitizers() {
    local rc=0 summary
    : >"$LOGDIR/sanitizer.log"
    for run in $SAN_RUNS; do
        set -- ${run//:/ }
        timeout "$3" "$SAN" --tool "$1" --error-exitcode 99 "$BUILD/test_gpu" "$2" >"$LOGDIR/san_$1_$2.log" 2>&1
        local r=$?
        summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$LOGDIR/san_$1_$2.log" | tail -1)
        echo "sanitizer $1 $2: exit $r ${summary:-"(no summary)"}" >>"$LOGDIR/sanitizer.log"
        [ "$r" -eq 124 ] && echo "  (timed out: log $LOGDIR/san_$1_$2.log)" >>"$LOGDIR/sanitizer.log"
        [ "$r" -ne 0 ] && [ "$r" -ne 124 ] && { rc=1; grep -m 20 -E "=========" "$LOGDIR/san_$1_$2.log" >>"$LOGDIR/sanitizer.log"; }
    done
    return $rc
}
san_pid=
if [ "$SANITIZE" = 1 ] && [ -n "$SAN" ]; then
    echo "== compute-sanitizer in the background ($SAN_RUNS)"
    run_sanitizers &
    san_pid=$!
elif [ "$SANITIZE" = 1 ]; then
    echo "gpu-check: compute-sanitizer not found, skipped" | tee "$LOGDIR/sanitizer.log"
fi

echo "== GPU tests"
: >"$LOGDIR/test_gpu.log"
test_rc=0
if [ "$PART" = variants ]; then
    echo "gpu-check: the suite skipped (PART=variants)"
elif [ -z "${TESTS:-}" ] && [ "$TEST_PROCS" -gt 1 ]; then
    # The suite in TEST_PROCS processes at once on the one GPU (tests are independent; the largest model,
    # k3-slice-4L, takes 14 GB), each given whole tests by exact name (`=NAME`), the longest first to the
    # least loaded process. Seconds measured 2026-11-30 (H200, alone; four at once share the GPU and take up to 1.7x
    # longer each); the rest take a few seconds or less.
    declare -A secs=([gpu_executor_tiny]=121 [gpu_executor_mini]=81 [gpu_aux_vs_cpu_mini]=31
        [gpu_engine_layouts_cli_generate]=85 [gpu_mailbox_ipc_processes]=35 [gpu_engine_layouts_bench]=27
        [gpu_mailbox_graph_replay]=22 # these four and the two executor figures: beside four other processes (2026-12-02)
        [gpu_aux_executor_mini]=29 [gpu_executor_k3slice_4layers]=14 [gpu_moe_mxfp4]=12
        [gpu_executor_kimi_linear_tiny]=14 # 14 s beside three other processes (2026-11-30)
        [gpu_tp_k3slice_4layers]=90 # an estimate, not measured: ~10 GB synthesized at ~5 M elements/s a core
        [gpu_tp_exec_k3slice_4layers]=80 # 80 s alone on the H200 (2026-12-02), 65 s of it the synthesis
        [gpu_ppep_k3slice_4layers]=45) # an estimate, not measured: ~5 GB synthesized
    mapfile -t names < <("$BUILD/test_gpu" --list | awk -v h="${!secs[*]}" 'BEGIN { n = split(h, a, " ");
        for (i = 1; i <= n; i++) heavy[a[i]] = 1 } { print (($0 in heavy) ? 0 : 1), $0 }' | sort -s -k1,1n | cut -d" " -f2)
    declare -a load=() shard=()
    for ((k = 0; k < TEST_PROCS; k++)); do load[k]=0; shard[k]=""; done
    for n in "${names[@]}"; do
        best=0
        for ((k = 1; k < TEST_PROCS; k++)); do [ "${load[k]}" -lt "${load[best]}" ] && best=$k; done
        shard[best]="${shard[best]} =$n"
        load[best]=$((load[best] + ${secs[$n]:-2}))
    done
    pids=()
    for ((k = 0; k < TEST_PROCS; k++)); do
        [ -n "${shard[k]}" ] || continue
        timeout 450 "$BUILD/test_gpu" ${shard[k]} >"$LOGDIR/test_gpu.$k.log" 2>&1 &
        pids[k]=$!
    done
    passed=0 failed=0
    for k in "${!pids[@]}"; do
        wait "${pids[k]}" || test_rc=1
        cat "$LOGDIR/test_gpu.$k.log" >>"$LOGDIR/test_gpu.log"
        # each process's seed on the console, so that a failure can be replayed (K3C_TEST_SEED) from it alone
        echo "gpu-check: process $k: $(grep -m1 -E '^k3c tests, seed' "$LOGDIR/test_gpu.$k.log")"
        read -r p f < <(grep -E '^[0-9]+ passed, [0-9]+ failed' "$LOGDIR/test_gpu.$k.log" | awk '{ print $1, $3 }')
        [ -n "$p" ] || { test_rc=1; echo "gpu-check: test process $k ended without a summary" >&2; }
        passed=$((passed + ${p:-0})) failed=$((failed + ${f:-0}))
    done
    grep -E 'FAIL' "$LOGDIR/test_gpu.log" | head -20
    echo "$passed passed, $failed failed (in $TEST_PROCS processes)" | tee -a "$LOGDIR/test_gpu.log"
elif [ -z "${TESTS:-}" ]; then
    # 314 s alone on the H200 (2026-11-29); the sanitizer runs beside it share the GPU and the CPUs
    timeout 450 "$BUILD/test_gpu" 2>&1 | tee "$LOGDIR/test_gpu.log"
    test_rc=${PIPESTATUS[0]}
else
    for filter in $TESTS; do
        timeout 300 "$BUILD/test_gpu" "$filter" 2>&1 | tee -a "$LOGDIR/test_gpu.log"
        [ "${PIPESTATUS[0]}" -eq 0 ] || test_rc=1
    done
fi

# The MXFP4 experts with the per-pair path at every decode size (K3C_MOE_PAIR_MX=1: up to 64 pairs; the
# default stops at 16) and rows split over 2 warps, with it off (the band kernels past the per-pair sizes)
# and rows over 8 warps (the default gives MXFP4 rows one warp each), with the band kernels off too (the
# grouped kernel at every size), with the band's 32-, 16- and 8-column tiles at every size, so each kernel
# and row split stays tested at the sizes the default gives another (cuda/moe.cu, cuda/moe_pair.cu; the
# filter also runs gpu_moe_mxfp4_band_widths, which forces each width itself)
variants=(
    "K3C_MOE_PAIR_MX=1 K3C_MOE_MXP_WPR=2|gpu_moe_mxfp4|120" "K3C_MOE_PAIR_MX=0 K3C_MOE_MXP_WPR=8|gpu_moe_mxfp4|120"
    "K3C_MOE_PAIR_MX=0 K3C_MOE_BAND_MX=0|gpu_moe_mxfp4|120" "K3C_MOE_PAIR_MX=0 K3C_MOE_BAND_COLS=32|gpu_moe_mxfp4|120"
    "K3C_MOE_PAIR_MX=0 K3C_MOE_BAND_COLS=16|gpu_moe_mxfp4|120" "K3C_MOE_BAND_COLS=8|gpu_moe_mxfp4|120"
    # bf16 experts past 64 pairs on the grouped kernel and on the per-pair path up to 256 pairs (the default
    # takes the band kernels there), and rows split over 4 warps (the default: 2 for bf16 bands, 1 for MXFP4)
    "K3C_MOE_BAND_BF16=0|gpu_moe_bf16|120" "K3C_MOE_PAIR_MAX=256|gpu_moe_bf16|120" "K3C_MOE_MXP_WPR=4|gpu_moe_bf16|120"
    "K3C_MOE_PAIR_OCC=0|gpu_moe_bf16|120" "K3C_MOE_PAIR_OCC=2|gpu_moe_bf16|120"
    # the tensor-core GEMV (2-8 tokens) planned by plan_grid (K3C_GEMV_MMA_GRID=1, cuda/gemm.cu): other
    # warps-per-row splits than the default's all-warps one; and its exactness vote once a step
    # (K3C_GEMV_MMA_VOTE=step; the default votes once a run)
    "K3C_GEMV_MMA_GRID=1|gpu_matmul_bf16 gpu_gemv_group|120" "K3C_GEMV_MMA_VOTE=step|gpu_matmul_bf16 gpu_gemv_group|120"
    # the MLA attend by head groups at every row count (K3C_MLA_HG=1; by default from 16 rows, cuda/mla.cu),
    # on the kernel test and a whole forward
    "K3C_MLA_HG=1|gpu_mla gpu_forward_tiny|180")
# The variants run TEST_PROCS at a time (each its own process and log, ~90 s for a gpu_moe_mxfp4 one on
# 2026-12-02: one after another they took longer than the suite), appended to the log in this order.
if [ -z "${TESTS:-}" ] && [ "$PART" != suite ]; then
    echo "== GPU tests under ${#variants[@]} environment settings, $TEST_PROCS at a time"
    vpids=()
    running() {
        local n=0 p
        for p in "${vpids[@]}"; do kill -0 "$p" 2>/dev/null && n=$((n + 1)); done
        echo "$n"
    }
    for i in "${!variants[@]}"; do
        IFS='|' read -r venv vtests vsec <<<"${variants[i]}"
        while [ "$(running)" -ge "$TEST_PROCS" ]; do sleep 1; done
        (env $venv timeout "$vsec" "$BUILD/test_gpu" $vtests >"$LOGDIR/variant.$i.log" 2>&1
            echo $? >"$LOGDIR/variant.$i.rc") &
        vpids+=($!)
    done
    for p in "${vpids[@]}"; do wait "$p"; done # only these: the sanitizers' job is waited for below
    for i in "${!variants[@]}"; do
        IFS='|' read -r venv vtests vsec <<<"${variants[i]}"
        { echo "== GPU tests with $venv ($vtests)"; cat "$LOGDIR/variant.$i.log"; } >>"$LOGDIR/test_gpu.log"
        r=$(cat "$LOGDIR/variant.$i.rc" 2>/dev/null || echo 1)
        echo "gpu-check: with $venv ($vtests): exit $r, $(grep -E '^[0-9]+ passed, [0-9]+ failed' "$LOGDIR/variant.$i.log" | tail -1)"
        [ "$r" = 0 ] || test_rc=1
    done
fi

san_rc=0
if [ -n "$san_pid" ]; then
    echo "== waiting for compute-sanitizer"
    wait "$san_pid" || san_rc=1
    cat "$LOGDIR/sanitizer.log"
fi

bench_rc=0
: >"$LOGDIR/bench_gpu.log"
if [ "$KBENCH" = 1 ]; then
    echo "== GPU kernel benchmark"
    "$BUILD/bench_gpu" 2>&1 | tee "$LOGDIR/bench_gpu.log"
    bench_rc=${PIPESTATUS[0]}
fi

# The all-reduce latency benchmark (tests/gpu/bench_comm.c): COMM and CROSSOVER lines.
comm_rc=0
: >"$LOGDIR/bench_comm.log"
if [ "$CBENCH" = 1 ]; then
    echo "== all-reduce latency benchmark (build/bench_comm)"
    timeout 300 "$BUILD/bench_comm" 2>&1 | tee "$LOGDIR/bench_comm.log"
    comm_rc=${PIPESTATUS[0]}
fi

# The load benchmark: mini, a 4-layer Kimi-Linear-48B (12.9 GB, bf16 experts) and a 2-layer k3-slice (9.3 GB,
# MXFP4 experts) written to disk, each loaded twice (the second from the page cache is the LOAD line) next to
# the host-to-device and page-cache read floors measured in the same run; then the staged upload's reader
# and buffer shapes (UPLOAD lines). Needs ~13 GB of free disk under $TMPDIR (or /tmp) at a time.
load_rc=0
: >"$LOGDIR/bench_load.log"
if [ "$LBENCH" = 1 ]; then
    echo "== load benchmark (build/bench_load)"
    timeout 300 "$BUILD/bench_load" 2>&1 | tee "$LOGDIR/bench_load.log"
    load_rc=${PIPESTATUS[0]}
fi

stock_rc=0
: >"$LOGDIR/bench_stock.log"
if [ "$BENCH" = 1 ]; then
    echo "== stock decode benchmark (k3c bench --device cuda)"
    # short contexts: the stock MoE kernel re-reads each expert per (token, slot) pair, so prefilling 64
    # requests x 512 tokens would take minutes; the KV share of a decode step is small at these sizes
    timeout 240 "$BUILD/k3c" bench --device cuda --preset k3-slice --batches 1,8,64 --context 64 2>&1 |
        tee -a "$LOGDIR/bench_stock.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || stock_rc=1
    timeout 200 "$BUILD/k3c" bench --device cuda --preset kimi-linear-48b --batches 1,8 --context 128 2>&1 |
        tee -a "$LOGDIR/bench_stock.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || stock_rc=1
fi

echo
echo "== summary (tests: worst rel L2 over all cases vs threshold; bench: median of 30 launches)"
printf '%-30s %-8s %9s %11s %s\n' kernel metric threshold result verdict
# METRIC name... metric threshold result: the last three fields, the name whatever is before them (a name
# with a space once shifted the columns, and the verdict compared two strings); numbers compared as numbers,
# and a result that is not one (nan, inf, garbage) fails
grep '^METRIC' "$LOGDIR/test_gpu.log" | awk '{ res = $NF; thr = $(NF - 1); met = $(NF - 2); name = $2
    for (i = 3; i <= NF - 3; i++) name = name "_" $i
    num = res ~ /^[-+]?[0-9.]+([eE][-+]?[0-9]+)?$/
    v = (num && res + 0 <= thr + 0) ? "ok" : "FAIL"
    printf "%-30s %-8s %9s %11s %s\n", name, met, thr, res, v }'
printf '%-36s %10s %8s %s\n' benchmark us GB/s fraction_of_copy
grep '^BENCH' "$LOGDIR/bench_gpu.log" | awk '{ printf "%-36s %10s %8s %s\n", $2, $4, $5, $6 }'
grep -E '^(#|CROSSOVER)' "$LOGDIR/bench_comm.log"
grep '^INFO' "$LOGDIR/test_gpu.log"
# failed tests by name with their messages (the runner prints a test's name, then its output, then "ok" or
# "FAIL"; messages go to stderr, indented, "    file:line: ...")
awk '/^gpu_[a-z0-9_]+ / { name = $1 } /^    [a-z].*:[0-9]+: / { msg[name] = msg[name] "\n" $0 }
     /FAIL \(/ { printf "FAILED %s%s\n", name, msg[name] }' "$LOGDIR/test_gpu.log"
cat "$LOGDIR/sanitizer.log" 2>/dev/null
grep -E '^(bench |prefill|STEP|SPEC|RATIO)' "$LOGDIR/bench_stock.log"
printf '%-22s %8s %8s %10s %s\n' load GB GB/s floor_GB/s fraction_of_floor
grep '^LOAD' "$LOGDIR/bench_load.log" | awk '{ printf "%-22s %8s %8s %10s %s\n", $2, $3, $4, $5, $6 }'
echo "tests: $(grep -E '^[0-9]+ passed' "$LOGDIR/test_gpu.log" | tr '\n' ' ')(exit $test_rc); bench exit $bench_rc;" \
     "sanitizers $san_rc; comm bench $comm_rc; load bench $load_rc; stock bench $stock_rc"
[ "$test_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ] && [ "$san_rc" -eq 0 ] && [ "$comm_rc" -eq 0 ] && [ "$load_rc" -eq 0 ] &&
    [ "$stock_rc" -eq 0 ]
