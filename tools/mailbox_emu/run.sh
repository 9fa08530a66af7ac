#!/bin/bash
# CPU emulation of the mailbox kernels (src/comm/mailbox_dev.cu) and of the mailbox communicator
# (src/comm/mailbox_cuda.c) under the GPU test (tests/gpu/test_gpu_mailbox.c), for checking the protocol's
# device form without a GPU: gen.py turns the .cu into plain C++, inc/ holds a CUDA runtime and device shim
# (emu.cpp: streams as worker threads, every CUDA thread an OS thread, graphs as captured operation lists,
# device memory as memfd mappings that another process maps through an "IPC handle", so the test's one
# process per rank runs too),
# blocks of K3C_MBX_THREADS=32 threads, 16 / ranks blocks per rank (EMU_SMS, EMU_BPS). x86's memory order is
# stronger than the GPU's: this checks indexing, parities, the pairing of blocks, barriers, epochs, graph
# replay and the failure paths, not the fences. K3C_MBT_EMU tells the test file it runs here (no backend
# kernels: the fused calls' norm reference is its host form, the fanout GEMV's test is left out).
# Usage: tools/mailbox_emu/run.sh [test filter ...], or run.sh bench [bench_comm arguments]
# (tests/gpu/bench_comm.c's harness; its times mean nothing here);
# env K3C_MBT_SCALE (default 0.03: the test's call counts scaled down), TMPDIR (build dir).
set -e
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${TMPDIR:-/tmp}/mailbox_emu
mkdir -p "$out"
python3 "$here/gen.py" "$root/src/comm/mailbox_dev.cu" "$out/mailbox_dev_emu.cpp"
inc="-I$here/inc -I$root/src -I$root/include"
def="-DK3C_HAVE_CUDA=1 -DK3C_MBX_THREADS=32 -DK3C_MBT_EMU=1"
g++ -std=c++20 -O1 -g -w $def $inc -c "$out/mailbox_dev_emu.cpp" -o "$out/mailbox_dev.o" &
g++ -std=c++20 -O1 -g -w $def $inc -c "$here/emu.cpp" -o "$out/emu.o" &
# comm/nccl.c without CUDA: its stubs (no NCCL in the emulation)
gcc -std=gnu11 -O1 -g -I"$root/src" -I"$root/include" -c "$root/src/comm/nccl.c" -o "$out/nccl.o"
for f in src/comm/mailbox_cuda.c src/util/error.c tests/test_main.c tests/gpu/test_gpu_mailbox.c \
    tests/gpu/bench_comm.c; do
    gcc -std=gnu11 -O1 -g -Wall -Wno-unused-parameter $def $inc -I"$root/tests" -c "$root/$f" \
        -o "$out/$(basename "$f" .c).o"
done
for job in $(jobs -p); do wait "$job" || { echo "$0: a compile failed" >&2; exit 1; }; done
lib="$out/mailbox_dev.o $out/emu.o $out/mailbox_cuda.o $out/nccl.o $out/error.o"
g++ $lib "$out"/{test_main,test_gpu_mailbox}.o -o "$out/test_mailbox_emu" -pthread -lm
g++ $lib "$out/bench_comm.o" -o "$out/bench_comm_emu" -pthread -lm
if [ "${1:-}" = bench ]; then
    shift
    "$out/bench_comm_emu" "$@"
else
    K3C_MBT_SCALE=${K3C_MBT_SCALE:-0.03} "$out/test_mailbox_emu" "${@:-gpu_mailbox}"
fi
