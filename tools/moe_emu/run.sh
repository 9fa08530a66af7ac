#!/bin/bash
# CPU emulation of the routed-experts kernels in src/cuda/moe.cu (moe_mma_kernel<MX, UP, S>, the combine),
# for checking kernel logic without a GPU. gen.py turns moe.cu, common.cuh and mma.cuh into plain C++:
# launches become emu_launch, shared memory per-block buffers (static __shared__ too), and every inline PTX
# statement a call of its emulation in inc/emu.h (an unknown instruction stops gen.py): mma.sync m16n8k16
# .row.col bf16 -> f32 with the PTX ISA fragment layouts (exact products, summed exactly and rounded once, or
# EMU_MMA=f32seq: f32 adds in k order), cvt.rn.bf16x2.f32 and mul.rn.bf16x2 (round to nearest even, bf16
# subnormals kept), ld.global.nc.v4, cp.async.ca/cg 4/16 bytes with src-size zero fill, commit/wait_group
# (EMU_CP=delay: the slot is NaN from the issue until the wait_group that retires its group, so a read of a
# slot before its wait shows), __ballot_sync, __all_sync, __any_sync, __syncthreads(_or), __syncwarp, __ldg, occupancy
# and cudaFuncSetAttribute with an H200's limits (132 SMs, 227 KB per block, 48 KB without the opt-in).
# Each CUDA thread is a ucontext fiber; fibers switch at barriers and warp collectives (EMU_SHUFFLE=seed:
# also at random at every cp.async / __ldg, in random order). Checked: global accesses inside an allocation
# and aligned, canary fences around allocations and dynamic shared memory, full-mask collectives with all 32
# lanes alive, deadlock, copies never waited for, shared memory limits. main.c drives k3c_cuda_moe_experts
# on tests/gpu/test_gpu_kernels.c's moe_case shapes and more, with wpr forced to 1, 2, 4, 8 (EMU_WPR, via a
# hook gen.py puts in the launcher), against the CPU library (the GPU test's metric) and a float64 reference.
# What it cannot show: real timing and occupancy (registers are not modelled), what nvcc does to the
# arithmetic (FMA contraction, the tensor core's real accumulation order and rounding), memory-model
# subtleties beyond the fiber interleavings tried (no reordering of plain shared/global accesses, no
# lock-step-vs-independent-thread-scheduling differences inside a warp between collectives), and CUDA's
# own expf/tanhf (glibc's are used).
# Usage: tools/moe_emu/run.sh [quick|big|all] (quick: small shapes, every wpr, ~1 min; big: K3's 3584 x 3072
# and Kimi Linear's 2304 x 1024, wpr auto and 8; all: everything). Env: EMU_CP=delay, EMU_SHUFFLE=seed,
# EMU_MMA=f32seq or trunc (inc/emu.h: a truncating accumulation model), EMU_WPR=n, EMU_ONLY=substring of a
# case name, EMU_THREADS (OS threads for blocks), EMU_DUMP=file (every case's h, part and out appended raw:
# `cmp` two runs for a bitwise A/B; tools/moe_emu/ab.sh REF does the whole A/B against a git ref), MOE_CU /
# MOE_PAIR_CU (kernel sources of another tree; its moe_pair.h placed in $TMPDIR/moe_emu/gen/cuda/ when the
# declarations differ). Each line's "streamed" is the bytes of
# 16-byte weight loads and copies over those of the experts the pairs selected: passes over each selected
# expert (no cache is modelled; f32 activations take three per tile: their three bf16 terms).
set -e
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${TMPDIR:-/tmp}/moe_emu
mkdir -p "$out/gen/cuda"
python3 "$here/gen.py" "${MOE_CU:-$root/src/cuda/moe.cu}" "$out/moe_k.cpp"
python3 "$here/gen.py" "${MOE_PAIR_CU:-$root/src/cuda/moe_pair.cu}" "$out/moe_pair_k.cpp"
cat "$out/moe_k.cpp" "$out/moe_pair_k.cpp" >"$out/moe_emu.cpp" # one translation unit: emu_rt.cpp includes it
python3 "$here/gen.py" "$root/src/cuda/mxfp4.cuh" "$out/gen/cuda/mxfp4.cuh"
python3 "$here/gen.py" "$root/src/cuda/common.cuh" "$out/gen/cuda/common.cuh"
python3 "$here/gen.py" "$root/src/cuda/stamp.cuh" "$out/gen/cuda/stamp.cuh"
python3 "$here/gen.py" "$root/src/cuda/mma.cuh" "$out/gen/cuda/mma.cuh"
python3 "$here/gen.py" "$root/src/cuda/gemv_t1.cuh" "$out/gen/cuda/gemv_t1.cuh"
python3 "$here/gen.py" "$root/src/cuda/elementwise.cu" "$out/elementwise_k.cpp" # the per-pair path's activation
inc="-I$here/inc -I$out/gen -I$out -I$root/src -I$root/include"
lib="$root/src/cpu/matmul.c $root/src/cpu/elementwise.c $root/src/cpu/pool.c $root/src/format/mxfp4.c $root/src/util/error.c"
for f in $lib; do gcc -std=gnu11 -O2 -I"$root/src" -I"$root/include" -c "$f" -o "$out/$(basename "$f" .c).o"; done
g++ -std=c++20 -O2 ${FLAGS:--ffp-contract=off} -w -DK3C_STAMPS=1 $inc -c "$here/emu_rt.cpp" -o "$out/emu_rt.o"
g++ -std=c++20 -O2 ${FLAGS:--ffp-contract=off} -w -DK3C_STAMPS=1 $inc -I"$root/tools/mla_emu/inc" -c "$out/elementwise_k.cpp" -o "$out/elementwise_k.o"
gcc -std=gnu11 -O2 $inc -I"$root/tests/gpu" -c "$here/main.c" -o "$out/main.o"
g++ "$out/main.o" "$out/emu_rt.o" "$out/elementwise_k.o" "$out"/{matmul,elementwise,pool,mxfp4,error}.o -o "$out/emu" -pthread -lm
"$out/emu" "${1:-quick}"
