#!/bin/bash
# CPU emulation of the KDA kernels in src/cuda/kda.cu, for checking kernel logic without a GPU: gen.py turns
# kda.cu into plain C++ (launches become emu_launch, shared memory a per-block buffer), inc/ holds shims of
# the CUDA runtime and of cuda/common.cuh, and inc/emu.h runs every CUDA thread of a block as a std::thread
# (std::barrier for __syncthreads, a thread that returns drops out; warp shuffles through a per-warp slot
# array between two per-warp barriers; shared memory starts as NaN). main.cpp runs the fused KDA decode
# kernel against the 7 separate launches (bitwise: cq, ck, cv, g, beta, o, y, states, windows) and against a
# float64 reference. Host math (expf, log1pf) is glibc's, not CUDA's, so this checks structure (indexing,
# barriers, reduction order), not CUDA's bits. Usage: tools/kda_emu/run.sh [small|big|test] ("big" = H 96,
# dk = dv = 128, ~2 min; "test" = tests/gpu/test_gpu_kda_fused.c on host memory, ~3 min). FLAGS overrides
# the C++ flags (default -ffp-contract=off). Its own shims (inc/) lag kda.cu (no cp.async or PDL):
# tools/kda_emu/gpu_tests.sh runs the KDA GPU tests through tools/moe_emu's runtime instead, the way to check
# kda.cu now.
set -e
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${TMPDIR:-/tmp}/kda_emu
mkdir -p "$out"
python3 "$here/gen.py" "$root/src/cuda/kda.cu" "$out/kda_emu.cpp"
inc="-I$here/inc -I$out -I$root/src -I$root/include"
gcc -O2 -c -I"$root/src" -I"$root/include" "$root/src/util/error.c" -o "$out/error.o"
g++ -std=c++20 -O2 ${FLAGS:--ffp-contract=off} -w $inc -c "$here/emu_rt.cpp" -o "$out/emu_rt.o"
case "${1:-small}" in
test)
    gcc -std=gnu11 -O2 $inc -I"$root/tests" -c "$root/tests/gpu/test_gpu_kda_fused.c" -o "$out/tgf.o"
    gcc -std=gnu11 -O2 -I"$root/src" -I"$root/include" -I"$root/tests" -c "$root/tests/test_main.c" -o "$out/test_main.o"
    g++ "$out/tgf.o" "$out/test_main.o" "$out/emu_rt.o" "$out/error.o" -o "$out/test_gpu_kda_fused" -pthread -lm
    "$out/test_gpu_kda_fused" ;;
*)
    g++ -std=c++20 -O2 ${FLAGS:--ffp-contract=off} -w $inc "$here/main.cpp" "$out/emu_rt.o" "$out/error.o" \
        -o "$out/emu" -pthread
    "$out/emu" $([ "$1" = big ] && echo 1) ;;
esac
