#!/bin/bash
# Runs tests of tests/gpu/test_gpu_kernels.c on the CPU through tools/moe_emu's runtime (gen.py translation of
# attnres, router, gemm, elementwise, moe, kda and mla .cu files; one fiber per CUDA thread; see moe_emu/run.sh
# for what it checks and cannot show), linked with the CPU-only library (built here with NVCC= into
# build-nocuda). cuBLASLt is a stub that fails, so gpu_matmul_bf16 cannot run (its streaming kernels are
# covered by run.sh). Usage: tools/kernels_emu/gpu_tests.sh [test-name-filter, default gpu_attnres]
# (e.g. gpu_router, gpu_moe_bf16, gpu_moe_mxfp4: the MoE tests take tens of minutes); TMPDIR sets the build
# directory ($TMPDIR/kernels_gpu_tests_emu); EMU_TEST_FILES the test files of tests/gpu linked (default
# test_gpu_kernels; e.g. "test_gpu_kda_fused test_gpu_kda_chunked"); EMU_CP=delay leaves each cp.async slot NaN
# until the wait_group that retires it (moe_emu/run.sh).
set -e
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
moe=$root/tools/moe_emu
out=${TMPDIR:-/tmp}/kernels_gpu_tests_emu
mkdir -p "$out/gen/cuda"
make -C "$root" -s -j4 BUILD=build-nocuda NVCC= all >/dev/null
kernels="attnres router gemm elementwise moe moe_pair kda mla sample"
for f in $kernels; do python3 "$moe/gen.py" "$root/src/cuda/$f.cu" "$out/${f}_k.cpp"; done
for f in common stamp mma gemv_t1 mxfp4; do python3 "$moe/gen.py" "$root/src/cuda/$f.cuh" "$out/gen/cuda/$f.cuh"; done
inc="-I$root/tools/mla_emu/inc -I$moe/inc -I$out/gen -I$root/src -I$root/include"
for f in $kernels; do g++ -std=c++20 -O2 -ffp-contract=off -w $inc -c "$out/${f}_k.cpp" -o "$out/${f}_k.o" & done
g++ -std=c++20 -O2 -ffp-contract=off -w $inc -DEMU_KERNELS='"emu.h"' -c "$moe/emu_rt.cpp" -o "$out/emu_rt.o" &
# a failed background compile must stop the script (a bare `wait` returns 0 and the link would take
# a stale object from an earlier run)
for job in $(jobs -p); do wait "$job" || { echo "$0: a compile failed" >&2; exit 1; }; done
cc="gcc -std=gnu11 -O2 -I$root/src -I$root/include -I$root/tests"
objs="$out/tm.o $out/emu_rt.o"
for t in ${EMU_TEST_FILES:-test_gpu_kernels}; do
    $cc -I"$moe/inc" -I"$root/tools/mla_emu/inc" -c "$root/tests/gpu/$t.c" -o "$out/$t.o"
    objs="$objs $out/$t.o"
done
$cc -c "$root/tests/test_main.c" -o "$out/tm.o"
for f in $kernels; do objs="$objs $out/${f}_k.o"; done
g++ $objs "$root/build-nocuda/libk3c.a" -lcjson -o "$out/test_gpu_kernels" -pthread -lm
"$out/test_gpu_kernels" "${1:-gpu_attnres}"
