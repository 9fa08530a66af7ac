#!/usr/bin/env bash
# GPU check, run on the GPU host from a fresh clone: builds everything (make -j16 all gpu-test), runs the GPU
# kernel tests (build/test_gpu: every CUDA kernel against its CPU counterpart) and the kernel benchmark
# (build/bench_gpu: achieved GB/s next to a measured device-to-device copy), and prints a short table last.
#
# cJSON: when the host has no libcjson-dev (and nothing can be fetched), the Debian packages carried in
# .debs/ (`apt-get download libcjson1 libcjson-dev` on a machine with a registry; plain C, needs only libc6 >=
# 2.14) are unpacked into .debs/root and passed to make through CFLAGS / LDLIBS (environment, so the
# Makefile's own flags are appended to them).
#
# Environment: BUILD (default build), JOBS (16), OUT (a folder for the logs; default /tmp/k3c-gpu-check).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
JOBS=${JOBS:-16}
LOGDIR=${OUT:-/tmp/k3c-gpu-check}
mkdir -p "$LOGDIR"

if ! printf '#include <cjson/cJSON.h>\n' | ${CC:-cc} -E -x c - >/dev/null 2>&1; then
    if ! ls .debs/libcjson*.deb >/dev/null 2>&1; then
        echo "gpu-check: cJSON headers not installed and no .debs/libcjson*.deb to unpack" >&2
        exit 1
    fi
    prefix=$PWD/.debs/root
    for f in .debs/libcjson*.deb; do dpkg -x "$f" "$prefix" || exit 1; done
    libdir=$(dirname "$(find "$prefix" -name 'libcjson.so*' | head -1)")
    export CFLAGS="${CFLAGS:--O2 -g} -I$prefix/usr/include"
    export LDLIBS="${LDLIBS:-} -L$libdir -Wl,-rpath,$libdir"
    echo "gpu-check: cJSON from .debs ($libdir)"
fi

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader || true
command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || echo "gpu-check: warning: no nvcc found" >&2

echo "== build"
if ! make -j"$JOBS" BUILD="$BUILD" all gpu-test >"$LOGDIR/build.log" 2>&1; then
    tail -40 "$LOGDIR/build.log"
    echo "gpu-check: build failed (log: $LOGDIR/build.log)" >&2
    exit 1
fi
grep -E 'warning' "$LOGDIR/build.log" | head -20

echo "== GPU tests"
"$BUILD/test_gpu" 2>&1 | tee "$LOGDIR/test_gpu.log"
test_rc=${PIPESTATUS[0]}

echo "== GPU kernel benchmark"
"$BUILD/bench_gpu" 2>&1 | tee "$LOGDIR/bench_gpu.log"
bench_rc=${PIPESTATUS[0]}

echo
echo "== summary (tests: worst rel L2 over all cases vs threshold; bench: median of 30 launches)"
printf '%-30s %-8s %9s %11s %s\n' kernel metric threshold result verdict
grep '^METRIC' "$LOGDIR/test_gpu.log" | awk '{ v = ($5 <= $4) ? "ok" : "FAIL"; if ($5 == "nan" || $5 == "inf") v = "FAIL";
    printf "%-30s %-8s %9s %11s %s\n", $2, $3, $4, $5, v }'
printf '%-36s %10s %8s %s\n' benchmark us GB/s fraction_of_copy
grep '^BENCH' "$LOGDIR/bench_gpu.log" | awk '{ printf "%-36s %10s %8s %s\n", $2, $4, $5, $6 }'
echo "tests: $(grep -E '^[0-9]+ passed' "$LOGDIR/test_gpu.log") (exit $test_rc); bench exit $bench_rc"
[ "$test_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
