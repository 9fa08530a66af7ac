#!/bin/bash
# CPU emulation of cuda/attnres.cu and cuda/gemm.cu's streaming kernels (the launchers with
# gemm NULL), for checking kernel logic without a GPU. It reuses tools/moe_emu (gen.py turns each .cu / .cuh
# into plain C++; emu.h + emu_rt.cpp run every CUDA thread as a fiber: barriers, warp shuffles and votes,
# mma.sync m16n8k16 bf16 with the PTX fragment layouts, __ldg bounds) and tools/mla_emu's cuBLASLt stub.
# main.c: the cases and references (see its header). What it cannot show: timing, CUDA's expf / rsqrtf
# (glibc's are used: rsqrtf as 1 / sqrtf), nvcc's FMA contraction (-ffp-contract=off: only explicit fmaf).
# Usage: tools/kernels_emu/run.sh [quick|all]. Env: EMU_ONLY=attnres|gemm|stamps, TMPDIR (build dir).
set -e
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
moe=$root/tools/moe_emu
out=${TMPDIR:-/tmp}/kernels_emu
mkdir -p "$out/gen/cuda"
for f in attnres gemm elementwise; do python3 "$moe/gen.py" "$root/src/cuda/$f.cu" "$out/${f}_k.cpp"; done
for f in common stamp mma gemv_t1; do python3 "$moe/gen.py" "$root/src/cuda/$f.cuh" "$out/gen/cuda/$f.cuh"; done
inc="-I$root/tools/mla_emu/inc -I$moe/inc -I$out/gen -I$root/src -I$root/include"
cxx="g++ -std=c++20 -O2 ${FLAGS:--ffp-contract=off} -w -DK3C_STAMPS=1 $inc"  # the stamps emulated too
for f in attnres gemm elementwise; do $cxx -c "$out/${f}_k.cpp" -o "$out/${f}_k.o" & done
$cxx -DEMU_KERNELS='"emu.h"' -c "$moe/emu_rt.cpp" -o "$out/emu_rt.o" &
# a failed background compile must stop the script (a bare `wait` returns 0 and the link would take
# a stale object from an earlier run)
for job in $(jobs -p); do wait "$job" || { echo "$0: a compile failed" >&2; exit 1; }; done
lib="src/cpu/matmul.c src/cpu/attnres.c src/cpu/pool.c src/util/error.c src/decode/stamp_report.c"
objs=""
for f in $lib; do
    gcc -std=gnu11 -O2 -I"$root/src" -I"$root/include" -c "$root/$f" -o "$out/$(basename "$f" .c).o"
    objs="$objs $out/$(basename "$f" .c).o"
done
gcc -std=gnu11 -O2 -I"$moe/inc" -I"$root/src" -I"$root/include" -I"$root/tests/gpu" -c "$here/main.c" -o "$out/main.o"
g++ "$out"/{main,emu_rt,attnres_k,gemm_k,elementwise_k}.o $objs -o "$out/emu" -pthread -lm
"$out/emu" "${1:-quick}"
