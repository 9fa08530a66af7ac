#!/bin/bash
# Runs the KDA GPU test files tests/gpu/test_gpu_kda_chunked.c (the chunked / request-batched kernels of
# src/cuda/kda.cu against a float64 recurrence, the CPU recurrence and each other) and test_gpu_kda_fused.c
# (the fused decode kernel against the separate launches, bitwise) on the CPU, through tools/moe_emu's
# runtime (gen.py translation, one fiber per CUDA thread, barriers, emulated shuffles and PTX; see
# moe_emu/run.sh for what it checks and what it cannot show). About 5 minutes on 2 cores. Usage:
# tools/kda_emu/gpu_tests.sh [test-name-filter, default gpu_kda]; TMPDIR sets the build directory
# ($TMPDIR/kda_gpu_tests_emu).
set -e
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
moe=$root/tools/moe_emu
out=${TMPDIR:-/tmp}/kda_gpu_tests_emu
mkdir -p "$out/gen/cuda"
python3 "$moe/gen.py" "$root/src/cuda/kda.cu" "$out/kda_k.cpp"
for f in common stamp mma gemv_t1; do python3 "$moe/gen.py" "$root/src/cuda/$f.cuh" "$out/gen/cuda/$f.cuh"; done
inc="-I$moe/inc -I$out/gen -I$root/src -I$root/include"
g++ -std=c++20 -O2 -ffp-contract=off -w $inc -c "$out/kda_k.cpp" -o "$out/kda_k.o"
g++ -std=c++20 -O2 -ffp-contract=off -w $inc -DEMU_KERNELS='"emu.h"' -c "$moe/emu_rt.cpp" -o "$out/emu_rt.o"
cc="gcc -std=gnu11 -O2 -I$root/src -I$root/include -I$root/tests"
$cc -I"$moe/inc" -c "$root/tests/gpu/test_gpu_kda_chunked.c" -o "$out/tgc.o"
$cc -I"$moe/inc" -c "$root/tests/gpu/test_gpu_kda_fused.c" -o "$out/tgf.o"
$cc -c "$root/tests/test_main.c" -o "$out/tm.o"
$cc -march=native -c "$root/src/cpu/kda.c" -o "$out/cpu_kda.o"
$cc -c "$root/src/util/error.c" -o "$out/error.o"
g++ "$out"/{tgc,tgf,tm,emu_rt,kda_k,cpu_kda,error}.o -o "$out/test_gpu_kda" -pthread -lm
"$out/test_gpu_kda" "${1:-gpu_kda}"
