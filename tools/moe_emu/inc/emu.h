/* CPU emulation of CUDA blocks with fibers: every CUDA thread of a block is a ucontext fiber on one OS
 * thread (blocks run in parallel on EMU_THREADS OS threads), so a warp collective costs 32 cheap switches,
 * not 32 kernel context switches. Fibers switch only at synchronisation points (barriers, warp collectives,
 * mma) and, with EMU_SHUFFLE=seed, at random at every emulated memory instruction (cp.async, __ldg) with a
 * random resume order, to expose other interleavings. A thread that returns drops out of its barriers; a
 * full-mask warp collective with an exited lane, a barrier nobody can pass (deadlock), a misaligned or
 * out-of-allocation global access, a cp.async outside dynamic shared memory and a launch over the shared
 * memory limits abort with a message. Shared memory starts as 0xff bytes (NaN). */
#pragma once
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include "cuda/stamp.h" /* the block stamps' record layout (emu_stamp_put) */
#include <string>
#include <vector>
#include <ucontext.h>
#include <cuda_runtime_api.h>

[[noreturn]] void emu_fail(const char *fmt, ...);

/* CUDA's integer min overloads (mixed signedness compares as unsigned) */
static inline int min(int a, int b) { return a < b ? a : b; }
static inline unsigned min(unsigned a, int b) { return a < (unsigned)b ? a : (unsigned)b; }
static inline unsigned min(int a, unsigned b) { return (unsigned)a < b ? (unsigned)a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }

struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) uint4 { uint32_t x, y, z, w; };
static inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }
static inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return uint4{a, b, c, d}; }
static inline uint32_t __float_as_uint(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline int __popc(unsigned v) { return __builtin_popcount(v); }
/* hi:lo shifted right by shift & 31, the low 32 bits (CUDA's funnel shift; lo == hi: a rotate) */
static inline uint32_t __funnelshift_r(uint32_t lo, uint32_t hi, uint32_t shift) {
    return (uint32_t)((((uint64_t)hi << 32) | lo) >> (shift & 31));
}
static inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
    uint64_t v = (uint64_t)y << 32 | x;
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) r |= (uint32_t)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}

struct emu_copy {
    unsigned char *dst;
    const void *src;
    int cp, src_bytes;
};
struct emu_bar {
    int expected = 0, count = 0;
    unsigned gen = 0, orv[2] = {0, 0};
};
struct emu_fiber {
    ucontext_t ctx;
    dim3 tid;
    bool done = false;
    emu_bar *wbar = nullptr; /* waiting on this barrier's generation wgen to pass */
    unsigned wgen = 0;
    std::vector<emu_copy> open;               /* cp.async issued, not committed */
    std::vector<std::vector<emu_copy>> groups; /* committed groups, oldest first */
};
struct emu_block {
    std::vector<emu_fiber> f;
    ucontext_t sched;
    emu_bar block;
    std::vector<emu_bar> warp;
    std::vector<uint32_t> xch; /* per thread 16 words of warp-collective exchange */
    unsigned char *dyn = nullptr;
    size_t dyn_bytes = 0;
    std::map<std::string, std::vector<unsigned char>> stat;
    std::mt19937 rng;
    long progress = 0;
};
extern thread_local dim3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
extern thread_local emu_block *emu_blk;
extern thread_local emu_fiber *emu_fib;
extern "C" int emu_force_wpr;  /* EMU_WPR: moe.cu's launcher uses this many warps per band */
extern "C" int emu_cp_delay;   /* EMU_CP=delay: cp.async lands at its wait_group; the slot is NaN until then */
extern "C" int emu_shuffle;    /* EMU_SHUFFLE=seed: random resume order and random switches */
extern "C" int emu_mma_f32seq; /* EMU_MMA=f32seq: mma sums in f32 in k order (default: exact, one rounding) */
extern "C" int emu_mma_trunc;  /* EMU_MMA=trunc: the truncating accumulation model below */
void emu_check_global(const void *p, size_t n, size_t align, const char *what);

static inline void emu_yield(void) { swapcontext(&emu_fib->ctx, &emu_blk->sched); }
static inline void emu_maybe_yield(void) {
    if (emu_shuffle && (emu_blk->rng() & 3) == 0) emu_yield();
}
static inline void emu_release(emu_bar &b) {
    b.count = 0;
    b.gen++;
    b.orv[b.gen & 1] = 0;
    emu_blk->progress++;
}
static inline unsigned emu_bar_wait(emu_bar &b) {
    unsigned g = b.gen;
    if (++b.count == b.expected) emu_release(b);
    else {
        emu_fib->wbar = &b;
        emu_fib->wgen = g;
        emu_yield();
        emu_fib->wbar = nullptr;
    }
    return g;
}
static inline void emu_bar_drop(emu_bar &b) {
    b.expected--;
    if (b.count && b.count == b.expected) emu_release(b);
}
static inline int emu_warp(void) { return threadIdx.x / 32; }
static inline int emu_lane(void) { return threadIdx.x % 32; }
static inline uint32_t *emu_slot(int lane) { return &emu_blk->xch[(size_t)(emu_warp() * 32 + lane) * 16]; }
static inline void emu_full_warp(unsigned mask, const char *what) {
    if (mask != 0xffffffffu) emu_fail("%s: mask %08x not emulated", what, mask);
    if (emu_blk->warp[emu_warp()].expected != 32)
        emu_fail("%s: full-mask collective in warp %d with %d live lanes (block %u)", what, emu_warp(),
                 emu_blk->warp[emu_warp()].expected, blockIdx.x);
}

static inline void __syncthreads(void) { emu_bar_wait(emu_blk->block); }
static inline int __syncthreads_or(int p) {
    emu_bar &b = emu_blk->block;
    b.orv[b.gen & 1] |= p != 0;
    unsigned g = emu_bar_wait(b);
    return b.orv[g & 1];
}
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
    emu_full_warp(mask, "__syncwarp");
    emu_bar_wait(emu_blk->warp[emu_warp()]);
}
static inline unsigned __ballot_sync(unsigned mask, int p) {
    emu_full_warp(mask, "__ballot_sync");
    emu_slot(emu_lane())[0] = p != 0;
    emu_bar_wait(emu_blk->warp[emu_warp()]);
    unsigned r = 0;
    for (int l = 0; l < 32; l++) r |= emu_slot(l)[0] << l;
    emu_bar_wait(emu_blk->warp[emu_warp()]);
    return r;
}
static inline int __all_sync(unsigned mask, int p) { return __ballot_sync(mask, p) == 0xffffffffu; }
static inline int __any_sync(unsigned mask, int p) { return __ballot_sync(mask, p) != 0u; }
/* CUDA's rsqrtf (approximate, ~2 ulp there): the correctly rounded 1 / sqrt here */
static inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }

static inline float __shfl_xor_sync(unsigned mask, float v, int o) {
    emu_full_warp(mask, "__shfl_xor_sync");
    emu_slot(emu_lane())[0] = __float_as_uint(v);
    emu_bar_wait(emu_blk->warp[emu_warp()]);
    float r = __uint_as_float(emu_slot(emu_lane() ^ o)[0]);
    emu_bar_wait(emu_blk->warp[emu_warp()]);
    return r;
}

static inline float __shfl_sync(unsigned mask, float v, int src) {
    emu_full_warp(mask, "__shfl_sync");
    emu_slot(emu_lane())[0] = __float_as_uint(v);
    emu_bar_wait(emu_blk->warp[emu_warp()]);
    float r = __uint_as_float(emu_slot(src & 31)[0]);
    emu_bar_wait(emu_blk->warp[emu_warp()]);
    return r;
}

static inline unsigned __shfl_xor_sync(unsigned mask, unsigned v, int o) {
    emu_full_warp(mask, "__shfl_xor_sync");
    emu_slot(emu_lane())[0] = v;
    emu_bar_wait(emu_blk->warp[emu_warp()]);
    unsigned r = emu_slot(emu_lane() ^ o)[0];
    emu_bar_wait(emu_blk->warp[emu_warp()]);
    return r;
}

template <class T> static inline T __ldg(const T *p) {
    emu_check_global(p, sizeof(T), sizeof(T) >= 16 ? 16 : sizeof(T), "__ldg");
    emu_maybe_yield();
    return *p;
}
/* st.global.cg (cuda/gemm.cu's fanout stores) and the system fence after them: plain here (one address
 * space, the emulated threads of a launch joined before the next launch runs) */
static inline void __stcg(float *p, float v) {
    emu_check_global(p, 4, 4, "__stcg");
    emu_maybe_yield();
    *p = v;
}
static inline void __threadfence_system(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
/* The traffic counter: bytes of the kernels' weight streams, i.e. 16-byte ld.global.nc loads (the streaming
 * kernels' k3c_ld_stream16) and 16-byte cp.async copies (the grouped kernel's rings); activations (__ldg) and
 * scale bytes are not counted. No cache is modelled: a re-read counts again, as a pass over an expert that
 * L2 no longer holds costs HBM bytes again. */
extern unsigned long long emu_stream_bytes;
static inline void emu_count_stream(int bytes) { __atomic_fetch_add(&emu_stream_bytes, (unsigned long long)bytes, __ATOMIC_RELAXED); }
static inline void emu_ld_v4_u32(uint32_t &a, uint32_t &b, uint32_t &c, uint32_t &d, const void *p) {
    emu_check_global(p, 16, 16, "ld.global.nc.v4.u32");
    emu_count_stream(16);
    emu_maybe_yield();
    const uint32_t *q = (const uint32_t *)p;
    a = q[0], b = q[1], c = q[2], d = q[3];
}

/* ---- shared memory ---- */
static inline void *emu_dyn_smem(void) { return emu_blk->dyn; }
template <class T> static inline T &emu_shared(const char *name) {
    auto &v = emu_blk->stat[name];
    if (v.empty()) v.assign(sizeof(T) + 16, 0xff);
    else if (v.size() != sizeof(T) + 16) emu_fail("static shared %s: two sizes", name);
    void *p = v.data();
    size_t space = v.size();
    return *(T *)std::align(16, sizeof(T), p, space);
}
static inline size_t __cvta_generic_to_shared(const void *p) {
    const unsigned char *c = (const unsigned char *)p;
    if (c < emu_blk->dyn || c >= emu_blk->dyn + emu_blk->dyn_bytes)
        emu_fail("__cvta_generic_to_shared: %p outside the dynamic shared memory (emulated for it only)", p);
    return (size_t)(c - emu_blk->dyn);
}

/* ---- cp.async: immediate copy, or (EMU_CP=delay) the slot poisoned at issue and the copy done at the
 * wait_group that retires its group ---- */
static inline void emu_copy_do(const emu_copy &c) {
    if (c.src_bytes) memcpy(c.dst, c.src, c.src_bytes);
    memset(c.dst + c.src_bytes, 0, c.cp - c.src_bytes);
}
static inline void emu_cp_async(size_t saddr, const void *src, int cp, int src_bytes) {
    if (cp != 4 && cp != 8 && cp != 16) emu_fail("cp.async: size %d", cp);
    if (src_bytes < 0 || src_bytes > cp) emu_fail("cp.async: src-size %d of %d", src_bytes, cp);
    if (saddr % cp) emu_fail("cp.async: shared address %zu not %d-aligned", saddr, cp);
    if (saddr + cp > emu_blk->dyn_bytes) emu_fail("cp.async: shared [%zu, +%d) past %zu bytes", saddr, cp, emu_blk->dyn_bytes);
    if ((uintptr_t)src % cp) emu_fail("cp.async: global %p not %d-aligned", src, cp);
    if (src_bytes) emu_check_global(src, src_bytes, 1, "cp.async");
    if (cp == 16) emu_count_stream(src_bytes);
    emu_copy c = {emu_blk->dyn + saddr, src, cp, src_bytes};
    if (emu_cp_delay) {
        memset(c.dst, 0xff, cp);
        emu_fib->open.push_back(c);
    } else
        emu_copy_do(c);
    emu_maybe_yield();
}
static inline void emu_cp_async_commit(void) {
    emu_fib->groups.push_back(std::move(emu_fib->open));
    emu_fib->open.clear();
}
static inline void emu_cp_async_wait(int n) {
    auto &g = emu_fib->groups;
    while ((int)g.size() > n) {
        for (auto &c : g.front()) emu_copy_do(c);
        g.erase(g.begin());
    }
}

/* ---- bf16 arithmetic: round to nearest even, subnormals kept (IEEE), from an exact double ---- */
static inline uint16_t emu_bf16_rn(double v) {
    if (std::isnan(v)) return 0x7fff;
    uint16_t sign = std::signbit(v) ? 0x8000 : 0;
    double a = fabs(v);
    if (std::isinf(a)) return sign | 0x7f80;
    if (a == 0) return sign;
    int e;
    frexp(a, &e);
    int ex = e - 1 < -126 ? -126 : e - 1; /* below 2^-126 the quantum stays 2^-133 */
    double qn = ldexp(1.0, ex - 7), r = nearbyint(a / qn) * qn;
    if (r >= ldexp(1.0, 128)) return sign | 0x7f80;
    return sign | (uint16_t)(__float_as_uint((float)r) >> 16);
}
static inline double emu_bf16_val(uint16_t h) { return (double)__uint_as_float((uint32_t)h << 16); }
static inline uint32_t emu_mul_rn_bf16x2(uint32_t a, uint32_t b) {
    uint16_t lo = emu_bf16_rn(emu_bf16_val(a & 0xffff) * emu_bf16_val(b & 0xffff));
    uint16_t hi = emu_bf16_rn(emu_bf16_val(a >> 16) * emu_bf16_val(b >> 16));
    return (uint32_t)hi << 16 | lo;
}
/* cvt.rn.bf16x2.f32 d, a, b: a to the upper half, b to the lower */
static inline uint32_t emu_cvt_rn_bf16x2_f32(float a, float b) {
    return (uint32_t)emu_bf16_rn(a) << 16 | emu_bf16_rn(b);
}

/* ---- mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (PTX ISA fragment layouts): lane l = 4 g + q.
 * A (16 x 16): a0 = (row g, k 2q, 2q+1), a1 = (row g+8, k 2q, 2q+1), a2 = (row g, k 2q+8, 2q+9),
 * a3 = (row g+8, k 2q+8, 2q+9); the lower k in the lower half. B (16 x 8): b0 = (k 2q, 2q+1; column g),
 * b1 = (k 2q+8, 2q+9; column g). C, D: c0, c1 = (row g; columns 2q, 2q+1), c2, c3 = (row g+8; same). The
 * products are exact; by default the 16 products and c are summed exactly and rounded once to f32
 * (EMU_MMA=f32seq: f32 adds in k order after c). ---- */
static inline double emu_mma_a(int row, int k) {
    const uint32_t *s = emu_slot(4 * (row & 7) + ((k & 7) >> 1));
    uint32_t r = s[(row >> 3) + 2 * (k >> 3)];
    return emu_bf16_val((k & 1) ? r >> 16 : r & 0xffff);
}
static inline double emu_mma_b(int k, int col) {
    const uint32_t *s = emu_slot(4 * col + ((k & 7) >> 1));
    uint32_t r = s[4 + (k >> 3)];
    return emu_bf16_val((k & 1) ? r >> 16 : r & 0xffff);
}
/* EMU_MMA=trunc: a model of the tensor cores' f32 accumulation after Fasi, Higham, Mikaitis and Pranesh,
 * "Numerical behavior of NVIDIA tensor cores" (PeerJ CS 7:e330, 2021; V100, T4, A100): the products exact, the
 * addends of one pass (c and 8 products here: k 0-7, then the result and k 8-15) aligned to the largest and cut
 * to 24 bits below its leading bit (toward zero), summed exactly, the sum cut to f32 toward zero. Not the H200's
 * measured behaviour: a way to see what a truncating accumulator does to a kernel that chains its mma through
 * one accumulator against one that adds each mma's fresh result in f32. */
static inline float emu_trunc_f32(long double s) {
    float r = (float)s;
    if (fabsl((long double)r) > fabsl(s)) r = nextafterf(r, 0.0f);
    return r;
}
static inline float emu_mma_trunc_sum(float c, int row, int col) {
    float acc = c;
    for (int half = 0; half < 2; half++) {
        long double t[9];
        t[0] = acc;
        for (int k = 0; k < 8; k++) t[1 + k] = (long double)(emu_mma_a(row, 8 * half + k) * emu_mma_b(8 * half + k, col));
        int emax = INT_MIN;
        for (int i = 0; i < 9; i++)
            if (t[i] != 0) {
                int e;
                frexpl(t[i], &e);
                if (e > emax) emax = e;
            }
        if (emax == INT_MIN) {
            acc = 0.0f;
            continue;
        }
        long double ulp = ldexpl(1.0L, emax - 24), s = 0;
        for (int i = 0; i < 9; i++) s += truncl(t[i] / ulp) * ulp;
        acc = emu_trunc_f32(s);
    }
    return acc;
}

static inline void emu_mma_m16n8k16_bf16(float &d0, float &d1, float &d2, float &d3, uint32_t a0, uint32_t a1,
                                         uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1, float c0, float c1,
                                         float c2, float c3) {
    emu_full_warp(0xffffffffu, "mma.sync");
    uint32_t *s = emu_slot(emu_lane());
    s[0] = a0, s[1] = a1, s[2] = a2, s[3] = a3, s[4] = b0, s[5] = b1;
    emu_bar_wait(emu_blk->warp[emu_warp()]);
    int g = emu_lane() >> 2, q = emu_lane() & 3;
    float c[4] = {c0, c1, c2, c3}, d[4];
    for (int i = 0; i < 4; i++) {
        int row = g + 8 * (i >> 1), col = 2 * q + (i & 1);
        if (emu_mma_trunc) {
            d[i] = emu_mma_trunc_sum(c[i], row, col);
        } else if (emu_mma_f32seq) {
            float acc = c[i];
            for (int k = 0; k < 16; k++) acc += (float)(emu_mma_a(row, k) * emu_mma_b(k, col));
            d[i] = acc;
        } else {
            /* exact: products have <= 16 significant bits; a long double keeps 64: exact unless the
             * exponents of the 17 terms span more than ~40 bits, then one extra rounding */
            long double acc = c[i];
            for (int k = 0; k < 16; k++) acc += (long double)(emu_mma_a(row, k) * emu_mma_b(k, col));
            d[i] = (float)acc;
        }
    }
    emu_bar_wait(emu_blk->warp[emu_warp()]);
    d0 = d[0], d1 = d[1], d2 = d[2], d3 = d[3];
}

/* ---- the block stamps' registers and atomic (cuda/stamp.cuh) ---- */
extern long emu_launches;
static inline unsigned long long emu_globaltimer(void) {
    return (unsigned long long)std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch()).count();
}
static inline unsigned long long emu_gridid(void) { return (unsigned long long)emu_launches; } /* one a launch */
static inline unsigned emu_smid(void) { return (blockIdx.x + 7u * blockIdx.y) % 132u; }
static inline unsigned emu_warpid(void) { return (threadIdx.x / 32u) % 64u; }
/* blocks run on several OS threads: a real atomic */
static inline unsigned atomicAdd(unsigned *p, unsigned v) {
    emu_check_global(p, sizeof *p, sizeof *p, "atomicAdd");
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
/* cuda/stamp.cuh's K3C_STAMP_PUT, its PTX step by step: the TU's control block, HI (kid << 24 | kind << 22)
 * and MASK (threads with linear index & MASK != 0 do nothing) */
static inline void emu_stamp_put(const k3c_stamp_ctl &c, unsigned hi, unsigned mask) {
    if (!c.rec) return;
    unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    if (tid & mask) return;
    unsigned long long t = emu_globaltimer(), g = emu_gridid();
    unsigned region = ((emu_smid() & 255u) << 2) | (emu_warpid() & 3u);
    unsigned i = atomicAdd(c.count + region, 1u);
    if (i >= c.cap) return;
    unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    k3c_stamp_rec *r = c.rec + (size_t)region * c.cap + i;
    emu_check_global(r, sizeof *r, 8, "stamp record");
    r->t = t;
    r->grid = (uint32_t)g;
    r->info = hi | (block & 0x3fffffu);
}

/* ---- launch ---- */
void emu_run_grid(dim3 grid, dim3 block, size_t smem, const void *kernel, const std::function<void()> &body);
template <class K, class... A> void emu_launch(K kernel, dim3 grid, dim3 block, size_t smem, A... args) {
    std::function<void()> body = [=] { kernel(args...); };
    emu_run_grid(grid, block, smem, (const void *)kernel, body);
}
