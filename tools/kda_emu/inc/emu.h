/* CPU emulation of CUDA blocks: each CUDA thread of a block is a std::thread; __syncthreads is a
 * std::barrier over the block (a thread that returns drops out, as an exited CUDA thread does); warp
 * shuffles write a per-warp slot array between two per-warp barriers. Blocks run one after another. */
#pragma once
#include <algorithm>
#include <barrier>
#include <memory>
#include <thread>
#include <vector>
#include <cuda_runtime_api.h>
/* CUDA's integer min overloads (mixed signedness compares as unsigned) */
static inline int min(int a, int b) { return a < b ? a : b; }
static inline unsigned min(unsigned a, int b) { return a < (unsigned)b ? a : (unsigned)b; }
static inline unsigned min(int a, unsigned b) { return (unsigned)a < b ? (unsigned)a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
struct emu_block {
    std::barrier<> *bar;
    std::vector<std::unique_ptr<std::barrier<>>> wbar;
    std::vector<float> wslot;
    std::vector<float> smem;
};
extern thread_local dim3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
extern thread_local emu_block *emu_cur;
static inline void __syncthreads() { emu_cur->bar->arrive_and_wait(); }
static inline float __shfl_xor_sync(unsigned, float v, int o) {
    int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    emu_cur->wslot[w * 32 + lane] = v;
    emu_cur->wbar[w]->arrive_and_wait();
    float r = emu_cur->wslot[w * 32 + (lane ^ o)];
    emu_cur->wbar[w]->arrive_and_wait();
    return r;
}
extern long emu_blocks_run;
template <class K, class... A> void emu_launch(K kernel, dim3 grid, dim3 block, size_t smem, A... args) {
    blockDim = block;
    gridDim = grid;
    unsigned nt = block.x * block.y * block.z;
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                emu_block b;
                std::barrier<> bar(nt);
                b.bar = &bar;
                unsigned nw = (nt + 31) / 32;
                for (unsigned w = 0; w < nw; w++)
                    b.wbar.emplace_back(new std::barrier<>(std::min(32u, nt - 32 * w)));
                b.wslot.assign(nw * 32, 0.0f);
                /* shared memory starts as garbage on a GPU: NaN here, so a read before a write shows */
                b.smem.assign(smem / 4 + 1, __builtin_nanf(""));
                std::vector<std::thread> th;
                th.reserve(nt);
                for (unsigned t = 0; t < nt; t++)
                    th.emplace_back([&, t] {
                        threadIdx = dim3(t, 0, 0);
                        blockIdx = dim3(bx, by, bz);
                        emu_cur = &b;
                        kernel(args...);
                        b.bar->arrive_and_drop();
                        b.wbar[t / 32]->arrive_and_drop();
                    });
                for (auto &x : th) x.join();
                emu_blocks_run++;
            }
}
