/* CUDA C++ of the mailbox kernels on the host: every CUDA thread an OS thread (emu.cpp's emu_launch), a
 * block's barrier a std::barrier its exiting threads drop out of, the cache-hinted loads and stores relaxed
 * atomics (no torn words between a writer and a reader), fences sequentially consistent. x86's memory order
 * is stronger than the GPU's, so this checks the kernels' indexing, parities, pairing of blocks, barriers and
 * failure paths, not their fences. */
#pragma once
#include <barrier>
#include <cstdint>
#include <cstring>
#include <functional>
#include <sched.h>
#include <time.h>

#include "cuda_runtime_api.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(16) uint4 {
    uint32_t x, y, z, w;
};

struct emu_block {
    std::barrier<> *bar;
    alignas(16) unsigned char shared[4][128];
    float xchg[1024]; /* __shfl_xor_sync's exchange */
};
extern thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;
extern thread_local emu_block *emu_cur;

template <class T> T &emu_shared(int id) {
    static_assert(sizeof(T) <= 128, "emu_shared: 128 bytes a variable");
    return *reinterpret_cast<T *>(emu_cur->shared[id & 3]);
}

/* enqueues the launch on stream s (emu.cpp) */
void emu_launch_fn(int grid, int block, cudaStream_t s, std::function<void()> body);
static inline void emu_launch(int grid, int block, size_t smem, cudaStream_t s, std::function<void()> body) {
    (void)smem;
    emu_launch_fn(grid, block, s, std::move(body));
}

static inline void __syncthreads(void) { emu_cur->bar->arrive_and_wait(); }
static inline void __threadfence_system(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __nanosleep(unsigned ns) {
    (void)ns;
    sched_yield();
}
static inline unsigned atomicCAS(unsigned *p, unsigned cmp, unsigned v) {
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return cmp;
}

template <class T> static inline T emu_ld(const T *p) {
    static_assert(sizeof(T) % 4 == 0 || sizeof(T) == 1, "emu_ld");
    T v;
    if (sizeof(T) == 1) {
        unsigned char b = __atomic_load_n(reinterpret_cast<const unsigned char *>(p), __ATOMIC_RELAXED);
        memcpy(&v, &b, 1);
    } else {
        uint32_t w[sizeof(T) / 4 ? sizeof(T) / 4 : 1];
        for (size_t i = 0; i < sizeof(T) / 4; i++)
            w[i] = __atomic_load_n(reinterpret_cast<const uint32_t *>(p) + i, __ATOMIC_RELAXED);
        memcpy(&v, w, sizeof(T));
    }
    return v;
}
template <class T> static inline void emu_st(T *p, T v) {
    if (sizeof(T) == 1) {
        unsigned char b;
        memcpy(&b, &v, 1);
        __atomic_store_n(reinterpret_cast<unsigned char *>(p), b, __ATOMIC_RELAXED);
    } else {
        uint32_t w[sizeof(T) / 4 ? sizeof(T) / 4 : 1];
        memcpy(w, &v, sizeof(T));
        for (size_t i = 0; i < sizeof(T) / 4; i++)
            __atomic_store_n(reinterpret_cast<uint32_t *>(p) + i, w[i], __ATOMIC_RELAXED);
    }
}
/* a misaligned vector access faults on the GPU: here too */
void emu_check_align(const void *p, size_t a, const char *what);
static inline float4 __ldcg(const float4 *p) { emu_check_align(p, 16, "__ldcg(float4)"); return emu_ld(p); }
static inline uint4 __ldcg(const uint4 *p) { emu_check_align(p, 16, "__ldcg(uint4)"); return emu_ld(p); }
static inline float __ldcg(const float *p) { emu_check_align(p, 4, "__ldcg(float)"); return emu_ld(p); }
static inline unsigned char __ldcg(const unsigned char *p) { return emu_ld(p); }
static inline void __stcg(float4 *p, float4 v) { emu_check_align(p, 16, "__stcg(float4)"); emu_st(p, v); }
static inline void __stcg(uint4 *p, uint4 v) { emu_check_align(p, 16, "__stcg(uint4)"); emu_st(p, v); }
static inline void __stcg(float *p, float v) { emu_check_align(p, 4, "__stcg(float)"); emu_st(p, v); }
static inline void __stcg(unsigned char *p, unsigned char v) { emu_st(p, v); }

/* Bit casts and the norm's math (glibc's: rsqrtf as 1 / sqrtf, not the GPU's approximation). */
static inline uint32_t __float_as_uint(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float __uint_as_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
#include <math.h>
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }

/* A warp shuffle across the emulated block: every thread of the block must call it together (the kernels
 * that use it do, with a whole number of warps a block); lane l reads lane l ^ o of its own warp. */
static inline float __shfl_xor_sync(unsigned mask, float v, int o) {
    (void)mask;
    const unsigned t = threadIdx.x;
    emu_cur->xchg[t] = v;
    emu_cur->bar->arrive_and_wait();
    const float r = emu_cur->xchg[(t & ~31u) | ((t & 31u) ^ (unsigned)o)];
    emu_cur->bar->arrive_and_wait();
    return r;
}
