#!/bin/bash
# CPU emulation of the expanded MLA path (src/cuda/mla_expanded.cu with gemm.cu's streaming GEMV kernels)
# and of the absorbed MLA kernels with the fp8 cache (src/cuda/mla.cu), for checking kernel logic without a
# GPU. It reuses tools/moe_emu: gen.py turns each .cu / .cuh into plain C++ and ../moe_emu/inc/emu.h +
# emu_rt.cpp run every CUDA thread as a fiber (barriers, warp shuffles / votes, mma.sync m16n8k16 bf16 with
# the PTX fragment layouts, ld.global.nc.v4 / __ldg alignment and bounds, canaries around allocations and
# dynamic shared memory, H200 shared memory limits incl. the opt-in attribute; see moe_emu/run.sh). Here:
# inc/cuda_fp8.h emulates cvt.rn.satfinite.e4m3x2.f32 and cvt.rn.f16x2.e4m3x2 + cvt.f32.f16 (checked
# against util/fp8.h on every f32 by `run.sh fp8`), inc/cublasLt.h stubs cuBLASLt out (the launcher gets
# gemm NULL: the streaming kernels run, T = 1 on CUDA cores and T = 2..8 on the emulated mma). main.c drives
# k3c_cuda_mla_expanded on tests/gpu/test_gpu_mla_expanded.c's kernel-test shapes (+ an fp8 run of each)
# and cache_write / absorb_q / attend / absorb_o with elem_bytes 1, 2, 4, against the CPU library.
# What it cannot show: cuBLASLt (the bf16 path of the real test uses it; here the f32 streaming product
# runs in both modes), real timing/occupancy (registers not modelled), CUDA's expf (glibc's is used) and
# nvcc's FMA contraction (-ffp-contract=off: only the explicit fmaf are fused), memory-model reorderings
# beyond the fiber interleavings tried (EMU_SHUFFLE=seed), out-of-bounds *reads* through plain pointers
# (only __ldg / ld.global.nc / cp.async are range-checked; plain reads of unwritten scratch or cache show
# only as NaN through the poisoning), misaligned float4 accesses to shared memory (not checked).
# Usage: tools/mla_emu/run.sh [quick|all|fp8] (quick: all shapes but K3-dim 300-row cases; all: + those and
# 96 heads; fp8: the conversion self-check, ~1 min). Env: EMU_ONLY=substring, EMU_SHUFFLE=seed, EMU_SEED,
# EMU_THREADS, CU_DIR (a mutated copy of src/cuda), TMPDIR (build dir: $TMPDIR/mla_emu).
set -e
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
moe=$root/tools/moe_emu
out=${TMPDIR:-/tmp}/mla_emu
mkdir -p "$out/gen/cuda"
cu=${CU_DIR:-$root/src/cuda} # CU_DIR: a (mutated) copy of src/cuda to try instead
for f in mla_expanded gemm mla elementwise; do python3 "$moe/gen.py" "$cu/$f.cu" "$out/${f}_k.cpp"; done
for f in common stamp mma gemv_t1; do python3 "$moe/gen.py" "$cu/$f.cuh" "$out/gen/cuda/$f.cuh"; done
inc="-I$here/inc -I$moe/inc -I$out/gen -I$root/src -I$root/include"
cxx="g++ -std=c++20 -O2 ${FLAGS:--ffp-contract=off} -w $inc"
for f in mla_expanded gemm mla elementwise; do $cxx -c "$out/${f}_k.cpp" -o "$out/${f}_k.o" & done
$cxx -DEMU_KERNELS='"emu.h"' -c "$moe/emu_rt.cpp" -o "$out/emu_rt.o" &
$cxx -c "$here/fp8_check.cpp" -o "$out/fp8_check.o" &
# a failed background compile must stop the script (a bare `wait` returns 0 and the link would take
# a stale object from an earlier run)
for job in $(jobs -p); do wait "$job" || { echo "$0: a compile failed" >&2; exit 1; }; done
for f in src/cpu/mla.c src/util/error.c; do
    gcc -std=gnu11 -O2 -march=native -I"$root/src" -I"$root/include" -c "$root/$f" -o "$out/$(basename "$f" .c).o"
done
gcc -std=gnu11 -O2 -I"$moe/inc" -I"$root/src" -I"$root/include" -I"$root/tests/gpu" -c "$here/main.c" -o "$out/main.o"
g++ "$out"/{main,emu_rt,fp8_check,mla_expanded_k,gemm_k,mla_k,elementwise_k,mla,error}.o -o "$out/emu" -pthread -lm
"$out/emu" "${1:-quick}"
# the MLA attend by head groups is opt-in (K3C_MLA_HG=1, cuda/mla.cu): its absorbed cases once more with it on
[ "${1:-quick}" = fp8 ] || EMU_ONLY=absorbed K3C_MLA_HG=1 "$out/emu" "${1:-quick}"
