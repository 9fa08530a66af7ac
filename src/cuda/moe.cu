/* Routed experts: MXFP4 or bf16 matvecs over the selected (token, slot) pairs. */
#include "cuda/moe.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include <cuda_fp16.h>

#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/elementwise.h"
#include "cuda/gemv_t1.cuh"
#include "cuda/kernel_limits.h"
#include "cuda/moe_pair.h"
#include "cuda/mxfp4.cuh"

#include "cuda/mma.cuh"

#define MOE_WARPS 8
#define MOE_MAX_COLS 8 /* B columns of an mma: pairs of one expert per pass */

__device__ __forceinline__ float rnd(float x, int round) { return round ? k3c_dev_bf16(k3c_dev_to_bf16(x)) : x; }

/* Where bit j of a repacked word comes from in the standard word (element e's code on bits 4e .. 4e + 3,
 * bit 3 the sign): derived from mx_word's extraction (cuda/mxfp4.cuh), element i / i + 4 of pair i on the low / high half. */
__constant__ unsigned char mx_repack_src[32] = {13, 14, 23, 15, 12, 27, 0,  1,  2,  4,  5,  6,  8,  9,  10, 3,
                                                29, 30, 7,  31, 28, 11, 16, 17, 18, 20, 21, 22, 24, 25, 26, 19};

__global__ void mx_repack_kernel(uint32_t *w, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t v = w[i], r = 0;
#pragma unroll
        for (int j = 0; j < 32; j++) r |= ((v >> mx_repack_src[j]) & 1u) << j;
        w[i] = r;
    }
}

extern "C" int k3c_cuda_mxfp4_repack(uint8_t *packed, size_t bytes, cudaStream_t stream) {
    if (bytes == 0) return K3C_OK;
    if (bytes % 4 || (uintptr_t)packed % 4)
        return k3c_errorf("k3c_cuda_mxfp4_repack: %zu bytes at %p: not whole aligned 32-bit words", bytes,
                          (void *)packed);
    size_t n = bytes / 4, blocks = (n + 255) / 256;
    mx_repack_kernel<<<(unsigned)(blocks < 8192 ? blocks : 8192), 256, 0, stream>>>((uint32_t *)packed, n);
    K3C_CUDA_LAUNCHED("mxfp4_repack");
    return K3C_OK;
}

/* cp.async: global -> shared copies that complete in the background, so the bytes a warp has in flight do
 * not cost registers. src_bytes 0 zero-fills the 16 bytes. */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, int src_bytes) {
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
}
/* cp_async4, cp_async_commit, cp_async_wait: cuda/common.cuh */

/* One k step of a warp's 16-row band in shared memory: per matrix 16 rows x 64 bytes (4 pieces of 16 bytes:
 * MXFP4 groups 4s .. 4s+3 of 32 elements, or bf16 chunks 4s .. 4s+3 of 8), then per matrix 16 rows x 4
 * scale bytes (MXFP4). Lane (g, q) reads piece q of rows g and g + 8: 32 lanes read 512 contiguous bytes,
 * no bank conflicts. */
#define MOE_ROW_BYTES 64
template <int NM>
struct moe_stage {
    static constexpr int w_bytes = NM * 16 * MOE_ROW_BYTES;
    static constexpr int bytes = w_bytes + NM * 16 * 4;
};

/* Bytes of the staged activations (the B plane): one bf16 term of `cols` columns for every k step. */
static size_t moe_plane_bytes(bool mx, int steps, int cols) { return (size_t)steps * (mx ? 4 : 1) * cols * 64; }

/* Grouped experts on tensor cores (mma.cuh layout). Block (chunk x, pair p): only the first pair that chose
 * an expert (the leader) works; it gathers every pair with the same expert, in pair order, and runs them as
 * the B columns of the mma, up to bcols per pass, so each selected expert's weights stream from memory once
 * per step for all the tokens that chose it (later passes re-read from L2). A warp owns a band of 16 output
 * rows (of gate and up together when UP); the wpr warps of a row group split the k steps into contiguous
 * ranges whose partial sums are added in warp order (deterministic). The block's band groups (groups bands
 * each) are x, x + gridDim.x, ... (nbg in all): the grid is sized to one wave of resident blocks, and a warp
 * runs its steps of all its band groups as one stream through its own ring of S stages in shared memory
 * (cp.async, S - 1 steps in flight while it computes one), so the next band group's bytes are already on
 * their way while a band group's sums are reduced and stored, and the block's setup (leader check, pair
 * list, activation staging) is paid once per expert rather than once per band group.
 *
 * The activations of a pass are staged once per block in shared memory as the B fragments the lanes read
 * (the B plane: for step s, sub-step, column, lane q, 16 bytes; a lane loads its fragments with one 16-byte
 * read, the lanes of a step read contiguous bytes), so the k loop spends no work on them: f32 activations
 * are split into three bf16 terms (mma.cuh) and, when a pass has any activation that is not a bf16 value,
 * the weights are streamed once per term (the f32 reference mode; the model's bf16 activations need one).
 * k step: bf16: 8 elements per lane (chunk 4 s + q of the row), two mma; MXFP4: one 32-element scale group
 * per lane (group 4 s + q), eight mma. x rows: token p / k of each pair (gate/up) or the pair's own row
 * (down). Invalid experts: the pair's rows are written as 0. Shared memory: the plist window, the B plane,
 * then the warps' rings; split-k partial sums in a static array. */
/* A step's mma results (a fresh accumulator) added to the running sums in IEEE f32. Chaining the mma through
 * the running sum (d = A B + acc) leaves its additions to the tensor core, whose f32 accumulation is not IEEE
 * round-to-nearest (Fasi et al. 2021: addends aligned and cut toward zero): over 144 steps (Kimi Linear's
 * 2304) this kernel read 1.2e-5-1.4e-5 rel L2 on the H200 where the band kernels, which add each step's fresh
 * result in f32, read 4.6e-7-5.6e-7 (H200); tools/moe_emu with EMU_MMA=trunc shows the same split
 * (grouped 5.1e-7 -> 2.8e-6 against float64, band 4.1e-7 either way). Measured with this add
 * (H200, 2026-11-30, band kernels off): 1.2e-5 -> 5.6e-7 (bf16), 4.6e-6 -> 4.5e-7 (MXFP4); bench_gpu moe
 * unchanged for bf16, MXFP4 T8 484 -> 498 us (0.436 -> 0.426 of copy; past 1024 pairs only, i.e. prefill). */
__device__ __forceinline__ void mma_step_add(float (&acc)[4], const float (&d)[4]) {
#pragma unroll
    for (int i = 0; i < 4; i++) acc[i] += d[i];
}

template <bool MX, bool UP, int S>
__global__ void __launch_bounds__(MOE_WARPS * 32, (UP || MX) ? 2 : 3)
moe_mma_kernel(const k3c_cuda_expert *__restrict__ experts, int num_experts, int K, int R, const float *__restrict__ x,
               int x_by_token, const int *__restrict__ idx, int npairs, int k, k3c_cuda_act act, int round,
               float *__restrict__ out, int wpr, int nbg, int plist_cap, int bcols) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_MOE_MMA);
    constexpr int NM = UP ? 2 : 1;
    constexpr int SUBS = MX ? 4 : 1; /* B fragments per k step and lane: one per 8-element sub-step (MXFP4) */
    constexpr int CH = MX ? 4 : 2; /* independent accumulator chains (one dependent chain was latency-bound) */
    constexpr int SB = moe_stage<NM>::bytes, WB = moe_stage<NM>::w_bytes;
    extern __shared__ __align__(16) unsigned char moe_smem[];
    int *plist = (int *)moe_smem;
    __shared__ float part[MOE_WARPS][NM][4][32];
    __shared__ int s_n, s_scan;
    int p = blockIdx.y, e = idx[p];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    int groups = MOE_WARPS / wpr, group = warp / wpr, kw = warp % wpr;
    int nmine = ((int)blockIdx.x < nbg) ? (nbg - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    if (e < 0 || e >= num_experts) {
        for (int b = 0; b < nmine; b++)
            for (int i = threadIdx.x; i < groups * 16; i += blockDim.x) {
                int row = (blockIdx.x + b * gridDim.x) * groups * 16 + i;
                if (row < R) out[(size_t)p * R + row] = 0.0f;
            }
        return;
    }
    int earlier = 0;
    for (int i = threadIdx.x; i < p; i += blockDim.x) earlier |= __ldg(idx + i) == e;
    if (__syncthreads_or(earlier) || nmine == 0) return;
    int nchunk = MX ? K >> 5 : K >> 3; /* 16-byte pieces of a row */
    int steps = (nchunk + 3) >> 2;
    uint4 *plane = (uint4 *)(moe_smem + (size_t)plist_cap * sizeof(int));
    unsigned char *ring = (unsigned char *)plane + (size_t)steps * SUBS * bcols * 64 + (size_t)warp * S * SB;
    const k3c_cuda_expert ex = experts[e];
    const uint8_t *wbase[NM], *sbase[NM];
    if (MX) {
        wbase[0] = UP ? ex.gate_packed : ex.down_packed;
        sbase[0] = UP ? ex.gate_scale : ex.down_scale;
        if (UP) {
            wbase[NM - 1] = ex.up_packed;
            sbase[NM - 1] = ex.up_scale;
        }
    } else {
        wbase[0] = (const uint8_t *)(UP ? ex.gate_w : ex.down_w);
        if (UP) wbase[NM - 1] = (const uint8_t *)ex.up_w;
        sbase[0] = sbase[NM - 1] = NULL;
    }
    size_t row_bytes = MX ? (size_t)K / 2 : (size_t)K * 2;
    /* the 4 scale bytes of a step go by one 4-byte cp.async when every row's scales are 4-aligned */
    bool scale_async = true;
    if (MX)
#pragma unroll
        for (int m = 0; m < NM; m++) scale_async = scale_async && (nchunk & 3) == 0 && ((uintptr_t)sbase[m] & 3) == 0;
    int s_lo = (int)((long long)kw * steps / wpr), s_hi = (int)((long long)(kw + 1) * steps / wpr);
    int ns = s_hi - s_lo; /* this warp's stream: ns steps of each of its nmine band groups */
    auto band_row0 = [&](int b) { return (((int)blockIdx.x + b * (int)gridDim.x) * groups + group) * 16; };

    /* The copy cursor: the next step of this warp's stream to copy (band group ib, step is) into ring slot
     * islot. Lane copies: 16 bytes of matrix m = j / 2, row g + 8 (j & 1), piece q; rows past R read nothing
     * (zero fill), as do pieces past the row. The row addresses change only with the band group, so they are
     * computed then (no division or 64-bit multiply per step). */
    int ib = 0, is = 0, islot = 0;
    const uint8_t *isrc[NM * 2];
    bool irow[NM * 2];
    const uint8_t *issrc = NULL;
    auto issue_band = [&](int b) {
        int row0 = band_row0(b);
#pragma unroll
        for (int j = 0; j < NM * 2; j++) {
            int m = j >> 1, row = g + 8 * (j & 1);
            irow[j] = row0 + row < R;
            isrc[j] = wbase[m] + (size_t)min(row0 + row, R - 1) * row_bytes + (size_t)q * 16;
        }
        if (MX && lane < NM * 16)
            issrc = sbase[lane >> 4] + (size_t)min(row0 + (lane & 15), R - 1) * nchunk;
    };
    auto issue_start = [&](int b) {
        ib = b;
        is = s_lo;
        islot = 0;
        issue_band(b);
    };
    auto issue_next = [&]() {
        unsigned char *st = ring + (size_t)islot * SB;
        bool in_row = is * 4 + q < nchunk;
#pragma unroll
        for (int j = 0; j < NM * 2; j++) {
            int m = j >> 1, row = g + 8 * (j & 1);
            bool ok = in_row && irow[j];
            cp_async16(st + m * 16 * MOE_ROW_BYTES + row * MOE_ROW_BYTES + q * 16,
                       ok ? isrc[j] + (size_t)is * 64 : isrc[j], ok ? 16 : 0);
        }
        if (MX && lane < NM * 16) {
            unsigned char *sdst = st + WB + ((lane >> 4) * 16 + (lane & 15)) * 4;
            if (scale_async) cp_async4(sdst, issrc + (size_t)is * 4);
            else
                for (int c = 0; c < 4; c++) sdst[c] = is * 4 + c < nchunk ? __ldg(issrc + (size_t)is * 4 + c) : 0;
        }
        if (++islot == S) islot = 0;
        if (++is == s_hi) {
            is = s_lo;
            if (++ib < nmine) issue_band(ib);
        }
    };

    /* The B plane of columns t0 .. t0 + ncols - 1, term `term` of the three-term split; returns whether any
     * activation staged has bits below bf16's (then the pass needs all three terms). Entry it =
     * ((s * SUBS + sub) * ncols + col) * 4 + q holds lane (col, q)'s fragment of step s, sub-step sub: MXFP4
     * the pairs (j, j + 4) of elements 8 sub .. 8 sub + 7 of group 4 s + q (the A pairing of mx_word), bf16
     * the pairs (2j, 2j + 1) of chunk 4 s + q. */
    auto stage = [&](int t0, int ncols, int term) {
        bool inexact = false;
        int total = steps * SUBS * ncols * 4;
        for (int it = threadIdx.x; it < total; it += blockDim.x) {
            int qq = it & 3, rest = it >> 2;
            int col = rest % ncols;
            rest /= ncols;
            int sub = rest % SUBS, s = rest / SUBS, c = s * 4 + qq;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (c < nchunk) {
                int pn = plist[t0 + col];
                const float *xr = x + (size_t)(x_by_token ? pn / k : pn) * K + (MX ? c * 32 + 8 * sub : c * 8);
                float4 a = __ldg((const float4 *)xr), b = __ldg((const float4 *)xr + 1);
                float lo[4], hi[4];
                if (MX) {
                    lo[0] = a.x, lo[1] = a.y, lo[2] = a.z, lo[3] = a.w;
                    hi[0] = b.x, hi[1] = b.y, hi[2] = b.z, hi[3] = b.w;
                } else {
                    lo[0] = a.x, hi[0] = a.y, lo[1] = a.z, hi[1] = a.w;
                    lo[2] = b.x, hi[2] = b.y, lo[3] = b.z, hi[3] = b.w;
                }
                uint32_t o[4];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    uint32_t t[3];
                    inexact |= k3c_split3(lo[j], hi[j], t);
                    o[j] = term == 0 ? t[0] : term == 1 ? t[1] : t[2];
                }
                v = make_uint4(o[0], o[1], o[2], o[3]);
            }
            plane[it] = v;
        }
        return inexact;
    };

    /* The pairs that chose e, in pair order, gathered into plist a window of at most plist_cap at a time
     * (plist_cap >= 32: a whole ballot always fits), so shared memory does not grow with the step's pairs. */
    for (int scan = p; scan < npairs;) {
        __syncthreads(); /* every warp is done with the previous window's plist */
        if (warp == 0) {
            int n = 0, i0 = scan;
            for (; i0 < npairs && n + 32 <= plist_cap; i0 += 32) {
                int i = i0 + lane;
                bool m = i < npairs && __ldg(idx + i) == e;
                unsigned bal = __ballot_sync(0xffffffffu, m);
                if (m) plist[n + __popc(bal & ((1u << lane) - 1u))] = i;
                n += __popc(bal);
            }
            if (lane == 0) s_n = n, s_scan = i0;
        }
        __syncthreads();
        int n = s_n;
        scan = s_scan;
        for (int t0 = 0; t0 < n; t0 += bcols) {
            int ncols = min(bcols, n - t0);
            /* The terms of a pass accumulate into one sum per band group: with one term the stream writes
             * each band group's outputs as it ends; with three, a band group's first two terms must be kept,
             * so a three-term pass runs its band groups one at a time (f32 reference mode only). */
            int nterms = 1;
            __syncthreads(); /* every warp is done reading the plane */
            if (__syncthreads_or(stage(t0, ncols, 0))) nterms = 3;
            int per_run = nterms == 1 ? nmine : 1;
            for (int b0 = 0; b0 < nmine; b0 += per_run) {
                float acc[NM][CH][4];
#pragma unroll
                for (int m = 0; m < NM; m++)
#pragma unroll
                    for (int c = 0; c < CH; c++)
#pragma unroll
                        for (int i = 0; i < 4; i++) acc[m][c][i] = 0.0f;
                for (int term = 0; term < nterms; term++) {
                    if (nterms > 1 && (b0 > 0 || term > 0)) {
                        __syncthreads();
                        __syncthreads_or(stage(t0, ncols, term));
                    }
                    int total = per_run * ns; /* this run's part of the stream */
                    issue_start(b0);
#pragma unroll
                    for (int j = 0; j < S - 1; j++) {
                        if (j < total) issue_next();
                        cp_async_commit();
                    }
                    /* the compute cursor: band group cb, step s, ring slot cslot */
                    int cb = b0, s = s_lo, cslot = 0;
                    for (int j = 0; j < total; j++) {
                        if (j + S - 1 < total) issue_next();
                        cp_async_commit();
                        cp_async_wait<S - 1>();
                        __syncwarp();
                        const unsigned char *st = ring + (size_t)cslot * SB;
                        /* operands are read from shared memory right where they are used (keeps the kernel
                         * within its register budget: 2 blocks of 8 warps per SM) */
                        const unsigned char *wa_p = st + g * MOE_ROW_BYTES + q * 16;
                        const unsigned char *wb_p = wa_p + 8 * MOE_ROW_BYTES;
                        const uint4 *bq_p = plane + (s * SUBS * ncols + g) * 4 + q;
                        const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
                        if (MX) {
                            const unsigned char *sc = st + WB + g * 4 + q; /* scale byte of row g, matrix m */
                            uint32_t mula[NM], mulb[NM];
                            bool big = false;
#pragma unroll
                            for (int m = 0; m < NM; m++) {
                                uint32_t ea = sc[m * 64], eb = sc[m * 64 + 32];
                                mula[m] = mx_mul(ea);
                                mulb[m] = mx_mul(eb);
                                big = big || ea > 128u || eb > 128u;
                            }
                            big = __ballot_sync(0xffffffffu, big) != 0;
#pragma unroll
                            for (int sub = 0; sub < SUBS; sub++) {
                                uint4 bq = g < ncols ? bq_p[sub * ncols * 4] : zero;
#pragma unroll
                                for (int m = 0; m < NM; m++) {
                                    uint32_t wa = *(const uint32_t *)(wa_p + m * 16 * MOE_ROW_BYTES + 4 * sub);
                                    uint32_t wb = *(const uint32_t *)(wb_p + m * 16 * MOE_ROW_BYTES + 4 * sub);
                                    uint32_t a[4], c[4];
                                    mx_word(wa, mula[m], a);
                                    mx_word(wb, mulb[m], c);
                                    if (big) {
#pragma unroll
                                        for (int i = 0; i < 4; i++) {
                                            a[i] = bf16x2_mul(a[i], mx_mul2(sc[m * 64])); /* rare: re-read */
                                            c[i] = bf16x2_mul(c[i], mx_mul2(sc[m * 64 + 32]));
                                        }
                                    }
                                    /* each step's products into a fresh accumulator, added to the chain
                                     * in f32 (see mma_step_add) */
                                    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                                    k3c_mma_bf16(d, a[0], c[0], a[1], c[1], bq.x, bq.y);
                                    k3c_mma_bf16(d, a[2], c[2], a[3], c[3], bq.z, bq.w);
                                    mma_step_add(acc[m][sub], d);
                                }
                            }
                        } else {
                            uint4 bq = g < ncols ? bq_p[0] : zero;
#pragma unroll
                            for (int m = 0; m < NM; m++) {
                                uint4 va = *(const uint4 *)(wa_p + m * 16 * MOE_ROW_BYTES);
                                uint4 vb = *(const uint4 *)(wb_p + m * 16 * MOE_ROW_BYTES);
                                float d0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, d1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                                k3c_mma_bf16(d0, va.x, vb.x, va.y, vb.y, bq.x, bq.y);
                                k3c_mma_bf16(d1, va.z, vb.z, va.w, vb.w, bq.z, bq.w);
                                mma_step_add(acc[m][0], d0);
                                mma_step_add(acc[m][1], d1);
                            }
                        }
                        __syncwarp(); /* every lane is done with this slot before a later step's copy lands in it */
                        if (s == s_hi - 1 && term == nterms - 1) {
                            /* band group b ends: its sums (chains in order, then the warps of the row group in
                             * warp order) go out while the stream's next copies are in flight */
                            float sum[NM][4];
#pragma unroll
                            for (int m = 0; m < NM; m++)
#pragma unroll
                                for (int i = 0; i < 4; i++) {
                                    float v = acc[m][0][i];
#pragma unroll
                                    for (int c = 1; c < CH; c++) v += acc[m][c][i];
                                    sum[m][i] = v;
                                }
                            if (wpr > 1) {
#pragma unroll
                                for (int m = 0; m < NM; m++)
#pragma unroll
                                    for (int i = 0; i < 4; i++) part[warp][m][i][lane] = sum[m][i];
                                __syncthreads();
                                if (kw == 0) {
#pragma unroll
                                    for (int m = 0; m < NM; m++)
#pragma unroll
                                        for (int i = 0; i < 4; i++) {
                                            float v = 0.0f;
                                            for (int w = 0; w < wpr; w++) v += part[warp + w][m][i][lane];
                                            sum[m][i] = v;
                                        }
                                }
                                __syncthreads(); /* part is free for the next band group */
                            }
                            /* sum[m]: (row g, column 2q), (row g, 2q+1), (row g+8, 2q), (row g+8, 2q+1) */
                            int row0 = band_row0(cb);
                            if (kw == 0 && row0 < R) {
#pragma unroll
                                for (int i = 0; i < 4; i++) {
                                    int row = row0 + g + (i >> 1) * 8, col = 2 * q + (i & 1);
                                    if (row < R && col < ncols) {
                                        float v;
                                        if (UP)
                                            v = rnd(k3c_dev_gated_act(act.kind, act.beta, act.beta_lin,
                                                                      rnd(sum[0][i], round), rnd(sum[NM - 1][i], round)),
                                                    round);
                                        else v = rnd(sum[0][i], round);
                                        out[(size_t)plist[t0 + col] * R + row] = v;
                                    }
                                }
                            }
#pragma unroll
                            for (int m = 0; m < NM; m++) /* the next band group starts from zero */
#pragma unroll
                                for (int c = 0; c < CH; c++)
#pragma unroll
                                    for (int i = 0; i < 4; i++) acc[m][c][i] = 0.0f;
                        }
                        if (++cslot == S) cslot = 0;
                        if (++s == s_hi) {
                            s = s_lo;
                            ++cb;
                        }
                    }
                }
            }
        }
    }
    K3C_STAMP_BLOCK_END(K3C_KID_MOE_MMA);
}

/* The launch's shape. The leaders (distinct experts) are not known on the host: estimate min(pairs,
 * experts). Per wpr (warps per band): nbg band groups per expert, spread over `chunks` blocks per expert so
 * that chunks x leaders fill one wave of resident blocks (cap), each block taking ceil(nbg / chunks) band
 * groups; the score is the wave's fill times the balance of band groups over blocks. K3C_MOE_BGPB (band
 * groups per block) overrides the spread and K3C_MOE_WPR (1, 2, 4 or 8) the warps per band, for benchmark
 * sweeps (a forced wpr that leaves fewer than two steps per warp falls back to 1). */
typedef struct moe_shape {
    int wpr, nbg, chunks;
} moe_shape;

static moe_shape moe_plan(int bands, int leaders, int steps, int cap) {
    int nbg1 = (bands + MOE_WARPS - 1) / MOE_WARPS; /* wpr 1: MOE_WARPS bands per group */
    moe_shape best = {1, nbg1, nbg1};
    double best_eff = -1.0;
    static int bgpb = -1, only_wpr = -1;
    if (bgpb < 0) {
        const char *v = getenv("K3C_MOE_BGPB"), *w = getenv("K3C_MOE_WPR");
        bgpb = v ? atoi(v) : 0;
        only_wpr = w ? atoi(w) : 0;
    }
    for (int wpr = 1; wpr <= MOE_WARPS; wpr *= 2) {
        if (only_wpr > 0 && wpr != only_wpr) continue;
        if (wpr > 1 && steps < 2 * wpr) break; /* at least two steps per warp: a pipeline, not a prologue */
        int groups = MOE_WARPS / wpr, nbg = (bands + groups - 1) / groups;
        int chunks = cap / leaders;
        if (chunks < 1) chunks = 1;
        if (chunks > nbg) chunks = nbg;
        int per = (nbg + chunks - 1) / chunks;
        if (bgpb > 0) per = bgpb < nbg ? bgpb : nbg;
        chunks = (nbg + per - 1) / per; /* as few blocks as carry that many band groups each */
        double blocks = (double)chunks * leaders, fill = blocks >= cap ? 1.0 : blocks / cap;
        /* more blocks than one wave: the last wave's share */
        if (blocks > cap) {
            double waves = ceil(blocks / cap);
            fill = blocks / (waves * cap);
        }
        double eff = fill * (double)nbg / ((double)per * chunks);
        /* wasted rows of a partial last band group count too */
        eff *= (double)bands / ((double)nbg * groups);
        if (eff > best_eff + 0.02) {
            best_eff = eff;
            best.wpr = wpr;
            best.nbg = nbg;
            best.chunks = chunks;
        }
    }
    return best;
}

/* Resident blocks per SM of `kernel` at `smem` bytes of dynamic shared memory (a few (kernel, size) pairs
 * remembered: the launch plan asks for the same ones every step). The kernel is part of the key: the four
 * instantiations share one signature, so one template instance serves them all. Under a lock: rank threads
 * launch at once, and a torn entry would give a rank another launch plan than its peers. */
template <typename K>
static int moe_blocks_per_sm(K kernel, size_t smem) {
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static const void *fns[16];
    static size_t sizes[16];
    static int blocks[16], n;
    pthread_mutex_lock(&lock);
    int b = 0;
    for (int i = 0; i < n && !b; i++)
        if (fns[i] == (const void *)kernel && sizes[i] == smem) b = blocks[i];
    if (!b) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, MOE_WARPS * 32, smem) != cudaSuccess || b < 1)
            b = 1;
        if (n < 16) fns[n] = (const void *)kernel, sizes[n] = smem, blocks[n] = b, n++;
    }
    pthread_mutex_unlock(&lock);
    return b;
}

/* Dynamic shared memory a block may take beside the static split-k sums. */
static constexpr size_t moe_smem_max(bool up) {
    return 227 * 1024 - (size_t)MOE_WARPS * (up ? 2 : 1) * 4 * 32 * sizeof(float) - 64;
}

/* The grouped kernels' limits, the four moe_launch instantiates (kernel_limits.h). */
extern "C" int k3c_cuda_moe_limits(void) {
    K3C_CUDA_TRY(k3c_cuda_smem_limit((const void *)moe_mma_kernel<true, true, 5>, moe_smem_max(true)));
    K3C_CUDA_TRY(k3c_cuda_smem_limit((const void *)moe_mma_kernel<false, true, 5>, moe_smem_max(true)));
    K3C_CUDA_TRY(k3c_cuda_smem_limit((const void *)moe_mma_kernel<true, false, 6>, moe_smem_max(false)));
    K3C_CUDA_TRY(k3c_cuda_smem_limit((const void *)moe_mma_kernel<false, false, 6>, moe_smem_max(false)));
    return K3C_OK;
}

template <bool MX, bool UP, int S>
static int moe_launch(const k3c_cuda_expert *experts, int num_experts, int K, int R, const float *x, int x_by_token,
                      const int *idx, int npairs, int k, int tokens, k3c_cuda_act act, int round, float *out,
                      cudaStream_t s) {
    auto kernel = moe_mma_kernel<MX, UP, S>;
    constexpr size_t ring = (size_t)MOE_WARPS * S * moe_stage<UP ? 2 : 1>::bytes;
    /* plist window: every pair when they are few, else 2048 per window (8 KB); a multiple of 4 so the plane
     * starts 16-byte aligned, and >= 32 so one ballot always fits */
    int plist_cap = npairs < 2048 ? (npairs + 3) & ~3 : 2048;
    if (plist_cap < 32) plist_cap = 32;
    int bands = (R + 15) / 16, nchunk = MX ? K >> 5 : K >> 3, steps = (nchunk + 3) >> 2;
    /* B columns per pass: an expert gets at most one pair per token (the router picks distinct experts), so
     * `tokens` columns cover every pass at decode; more pairs (tests, skewed routing) take more passes.
     * Fewer columns when the plane would not fit beside the ring (2 K bytes per column). */
    int bcols = tokens < MOE_MAX_COLS ? (tokens > 0 ? tokens : 1) : MOE_MAX_COLS;
    /* K3C_MOE_BCOLS caps the columns (benchmarks: fewer columns keep more blocks per SM, more passes re-read
     * an expert with many pairs) */
    static int bcols_cap = -1;
    if (bcols_cap < 0) {
        const char *v = getenv("K3C_MOE_BCOLS");
        bcols_cap = v ? atoi(v) : 0;
    }
    if (bcols_cap > 0 && bcols > bcols_cap) bcols = bcols_cap;
    /* dynamic shared memory beside the static split-k sums */
    const size_t smem_max = moe_smem_max(UP);
    /* the kernel may use up to smem_max (raised once per device, k3c_cuda_moe_limits: the occupancy queries
     * below and the launch ask for less) */
    K3C_TRY(k3c_cuda_kernels_prepare());
    while (bcols > 1 && (size_t)plist_cap * sizeof(int) + moe_plane_bytes(MX, steps, bcols) + ring > smem_max) bcols /= 2;
    /* Leaders = distinct experts of the step, unknown on the host: their expected count under uniform
     * routing, E (1 - (1 - k/E)^tokens) (k = slots per token). min(pairs, E) overstated it by half at
     * T = 4, k = 16, E = 64 (44 of 64), which left a third of the wave's blocks empty. */
    int slots = tokens > 0 ? (npairs + tokens - 1) / tokens : npairs;
    double frac = slots >= num_experts ? 1.0 : 1.0 - pow(1.0 - (double)slots / num_experts, tokens > 0 ? tokens : 1);
    int leaders = (int)ceil(num_experts * frac - 1e-9);
    if (leaders > npairs) leaders = npairs;
    if (leaders > num_experts) leaders = num_experts;
    if (leaders < 1) leaders = 1;
    /* Fewer B columns when the plane costs blocks per SM and the step's experts have few pairs each: the
     * kernel is built for (UP || MX) ? 2 : 3 blocks per SM, and Kimi Linear's bf16 gate/up (K 2304) with 8
     * columns (a 37 KB plane beside 87 KB of rings) fit one (docs/BENCHMARKS.md, kimi-linear-48b b=32: 1.6
     * pairs per expert). Halved while the smaller count still covers twice the expected pairs per expert,
     * so an expert rarely needs a second pass (which re-reads its weights); K3C_MOE_BCOLS overrides. */
    if (bcols_cap <= 0) {
        const int target = (UP || MX) ? 2 : 3;
        double per_leader = (double)npairs / leaders;
        while (bcols > 1 && (double)(bcols / 2) >= 2.0 * per_leader &&
               moe_blocks_per_sm(kernel, (size_t)plist_cap * sizeof(int) + moe_plane_bytes(MX, steps, bcols) + ring) <
                   target)
            bcols /= 2;
    }
    size_t smem = (size_t)plist_cap * sizeof(int) + moe_plane_bytes(MX, steps, bcols) + ring;
    if (smem > smem_max)
        return k3c_errorf("moe experts: a width of %d needs %zu bytes of shared memory per block (at most %zu)", K,
                          smem, smem_max);
    /* blocks per SM at this launch's shared memory (the plist window and the B plane grow with the step's
     * pairs; moe_blocks_per_sm remembers the sizes it was asked) */
    int occ = moe_blocks_per_sm(kernel, smem);
    moe_shape sh = moe_plan(bands, leaders, steps, occ * k3c_cuda_sm_count());
    dim3 grid(sh.chunks, npairs);
    kernel<<<grid, MOE_WARPS * 32, smem, s>>>(experts, num_experts, K, R, x, x_by_token, idx, npairs, k, act, round,
                                              out, sh.wpr, sh.nbg, plist_cap, bcols);
    return K3C_OK;
}

/* out[t, r] = sum_j weight[t, j] * part[t*k + j, r], j in order; invalid experts contribute nothing. */
__global__ void moe_combine_kernel(const float *__restrict__ part, const float *__restrict__ weight,
                                   const int *__restrict__ idx, int num_experts, int k, int Out, int T, int round,
                                   float *out) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_MOE_COMBINE);
    k3c_pdl_trigger(); /* a PDL-launched weight stream after this kernel (the MoE tail) may start (common.cuh) */
    size_t n = (size_t)T * Out;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int t = (int)(i / Out), r = (int)(i % Out);
        float s = 0.0f;
        for (int j = 0; j < k; j++) {
            int p = t * k + j, e = idx[p];
            if (e >= 0 && e < num_experts) s = fmaf(weight[p], part[(size_t)p * Out + r], s);
        }
        out[i] = rnd(s, round);
    }
    K3C_STAMP_BLOCK_END(K3C_KID_MOE_COMBINE);
}

/* The expert-parallel combine (moe.h k3c_cuda_moe_combine_rows): moe_combine_kernel's arithmetic with pair
 * (t, j)'s output at row pair_row[t k + j] of part instead of row t k + j, so that a token's sum over its
 * experts' outputs, computed on other ranks and gathered in any order, has world size 1's bits. */
__global__ void moe_combine_rows_kernel(const float *__restrict__ part, const int *__restrict__ pair_row,
                                        const float *__restrict__ weight, int k, int Out, int T, int round,
                                        float *out) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_MOE_COMBINE);
    size_t n = (size_t)T * Out;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int t = (int)(i / Out), r = (int)(i % Out);
        float s = 0.0f;
        for (int j = 0; j < k; j++) {
            int p = t * k + j, row = pair_row[p];
            if (row >= 0) s = fmaf(weight[p], part[(size_t)row * Out + r], s);
        }
        out[i] = rnd(s, round);
    }
    K3C_STAMP_BLOCK_END(K3C_KID_MOE_COMBINE);
}

extern "C" int k3c_cuda_moe_combine_rows(const float *part, const int *pair_row, const float *weight, int k, int Out,
                                         int T, int round_bf16, float *out, cudaStream_t stream) {
    if (k <= 0 || Out <= 0 || T < 0)
        return k3c_errorf("moe combine rows: %d slots per token, width %d, %d tokens", k, Out, T);
    size_t n = (size_t)T * Out;
    if (n == 0) return K3C_OK;
    size_t blocks = (n + 255) / 256;
    if (blocks > 2048) blocks = 2048;
    moe_combine_rows_kernel<<<(unsigned)blocks, 256, 0, stream>>>(part, pair_row, weight, k, Out, T, round_bf16 == 1,
                                                                  out);
    K3C_CUDA_LAUNCHED("moe_combine_rows");
    return K3C_OK;
}

static int check_dims(int mxfp4, int a, const char *what) {
    int q = mxfp4 ? 32 : 8;
    if (a <= 0 || a % q) return k3c_errorf("moe experts: %s = %d must be a positive multiple of %d", what, a, q);
    return K3C_OK;
}

extern "C" int k3c_cuda_moe_gate_up(const k3c_cuda_expert *experts, int num_experts, int mxfp4, int In, int F,
                                    const float *x, int T, const int *idx, int k, k3c_cuda_act act, int round_bf16,
                                    float *h, cudaStream_t stream) {
    K3C_TRY(check_dims(mxfp4, In, "input width"));
    if (F <= 0) return k3c_errorf("moe experts: intermediate width %d", F);
    if (T * k == 0) return K3C_OK;
    if (mxfp4) K3C_TRY((moe_launch<true, true, 5>(experts, num_experts, In, F, x, 1, idx, T * k, k, T, act, round_bf16, h, stream)));
    else K3C_TRY((moe_launch<false, true, 5>(experts, num_experts, In, F, x, 1, idx, T * k, k, T, act, round_bf16, h, stream)));
    K3C_CUDA_LAUNCHED("moe_gate_up");
    return K3C_OK;
}

extern "C" int k3c_cuda_moe_down(const k3c_cuda_expert *experts, int num_experts, int mxfp4, int F, int Out,
                                 const float *h, int pairs, int k, const int *idx, int round_bf16, float *part,
                                 cudaStream_t stream) {
    K3C_TRY(check_dims(mxfp4, F, "intermediate width"));
    if (Out <= 0) return k3c_errorf("moe experts: output width %d", Out);
    if (pairs == 0) return K3C_OK;
    if (k <= 0) return k3c_errorf("moe experts: %d slots per token", k);
    int tokens = (pairs + k - 1) / k;
    k3c_cuda_act none = {1, 0.0f, 0.0f};
    if (mxfp4) K3C_TRY((moe_launch<true, false, 6>(experts, num_experts, F, Out, h, 0, idx, pairs, 1, tokens, none, round_bf16, part, stream)));
    else K3C_TRY((moe_launch<false, false, 6>(experts, num_experts, F, Out, h, 0, idx, pairs, 1, tokens, none, round_bf16, part, stream)));
    K3C_CUDA_LAUNCHED("moe_down");
    return K3C_OK;
}

/* The per-pair path's limit in (token, slot) pairs, 0 when off. bf16: up to MOE_PAIR_MAX (2026-11-30, H200:
 * kimi-linear-48b b=1 specialized 4.18 -> 3.73 ms, b=8 13.15 -> 10.20 ms against the grouped kernel; then
 * with the two-launch kernels, kimi-linear-48b specialized, limit 64 / 256: b=16 22.01 / 17.62 ms, b=32
 * 37.58 / 31.08 ms against the grouped kernel), and since a later A/B the same day up to 64 pairs only: past that
 * the band kernels read each selected expert once for up to 8 of its pairs, b=16 17.37 -> 15.52 ms, b=32
 * 29.33 -> 21.22 ms against the per-pair path at 256 (which reads a repeated expert once per pair), while at
 * 64 pairs (b=8) the per-pair path stays ahead, 9.42 against 10.22 ms with the band there.
 * MXFP4: up to MOE_PAIR_MX_DEFAULT pairs. `bench_gpu moe` (H200, 2026-11-30), the pipelined kernel against
 * the grouped one: 16 pairs (T = 1, k = 16) 0.501 vs 0.417 of copy bandwidth, k3-slice b=1 specialized 6.52
 * ms (7.05 with the grouped kernel); 64 pairs (T = 4) 0.253 vs 0.350, since at 64 pairs over K3's experts
 * many pairs share an expert, which the grouped kernel reads once and the per-pair path once per pair.
 * Past that limit MXFP4 goes to the band kernels (moe_pair.cu: each selected expert once, up to 8 of its
 * pairs as the mma's columns; bench_gpu moe: 64 pairs 0.467, 128 pairs 0.492 of copy bandwidth, against
 * the grouped kernel's 0.387 / 0.440 before; k3-slice b=64 specialized 26.4 ms against 35.2) up to 1024
 * pairs, then to the grouped kernel; MXFP4 tiles of 32 pairs (16 where the plane does not fit) past 8 pairs an
 * expert (k3c_cuda_moe_band_cols; tiles of 16 there, 2026-11-30: k3-slice b=64 -0.5 ms, forced at 4-8 pairs an
 * expert slower by 0.3-1.7 ms; 32 so that an expert with 17-32 pairs is streamed once, not twice).
 * Switches for A/B runs and tests: K3C_MOE_PAIR_GEMV=0 turns both off; K3C_MOE_PAIR_MX=0 the MXFP4 one
 * off, =1 on up to 64 pairs; K3C_MOE_PAIR_MAX=N moves bf16's limit to N pairs; K3C_MOE_BAND_MX=0 / K3C_MOE_BAND_BF16=0
 * the band kernels off for that format. */
#define MOE_PAIR_MAX 64
#define MOE_PAIR_MX_DEFAULT 16
static int env_flag(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && *v ? v[0] != '0' : dflt;
}
/* Past the per-pair limit: by expert band (moe_pair.cu) unless K3C_MOE_BAND_MX=0 (MXFP4) or
 * K3C_MOE_BAND_BF16=0 (bf16) sends the format to the grouped kernel (for A/B runs). */
static int moe_band_on(int mxfp4) {
    static int on[2] = {-1, -1};
    if (on[mxfp4] < 0) on[mxfp4] = env_flag(mxfp4 ? "K3C_MOE_BAND_MX" : "K3C_MOE_BAND_BF16", 1);
    return on[mxfp4];
}
static int moe_pair_limit(int mxfp4) {
    static int bf16_max = -1, mx_max = -1;
    if (bf16_max < 0) {
        const char *lim = getenv("K3C_MOE_PAIR_MAX"); /* bf16's limit, for A/B runs past 64 pairs */
        bf16_max = !env_flag("K3C_MOE_PAIR_GEMV", 1) ? 0 : lim && atoi(lim) > 0 ? atoi(lim) : MOE_PAIR_MAX;
        const char *v = getenv("K3C_MOE_PAIR_MX");
        mx_max = !bf16_max ? 0 : !v || !*v ? MOE_PAIR_MX_DEFAULT : v[0] != '0' ? 64 : 0;
    }
    return mxfp4 ? mx_max : bf16_max;
}

/* nm matrices a pair, per pair (MXFP4: k3c_cuda_moe_pair_mx, from idx) or by expert band
 * (k3c_cuda_moe_band, from its tile table `lists`), as k3c_cuda_moe_experts runs them. */
static int stream_mats(int band, const k3c_cuda_expert *experts, int num_experts, int mxfp4, const int *idx,
                       const int *lists, int tile_cols, int pairs, int nm, int rows, int cols, const float *x,
                       int x_per_pair, float *y0, float *y1, int round_bf16, cudaStream_t s) {
    if (band)
        return k3c_cuda_moe_band(experts, num_experts, mxfp4, lists, pairs, tile_cols, nm, rows, cols, x, x_per_pair,
                                 y0, y1, round_bf16, s);
    return k3c_cuda_moe_pair_mx(experts, num_experts, idx, pairs, nm, rows, cols, x, x_per_pair, y0, y1, round_bf16, s);
}

extern "C" int k3c_cuda_moe_experts(const k3c_cuda_expert *experts, int num_experts, int mxfp4, int In, int F,
                                    int Out, const float *x, int T, const int *idx, const float *weight, int k,
                                    k3c_cuda_act act, int round_bf16, float *h, float *part, float *out,
                                    cudaStream_t stream) {
    int pairs = T * k, mx_fits = k3c_cuda_moe_pair_mx_fits(In, F);
    /* rh: gate, up and h rounded; ro: the down outputs and the weighted sum too (moe.h round_bf16) */
    const int rh = round_bf16 != 0, ro = round_bf16 == 1;
    /* both streaming paths keep gate/up rows of F in part's rows of Out */
    const int streamed = pairs > 0 && Out >= F;
    const int per_pair = streamed && pairs <= moe_pair_limit(mxfp4) && (!mxfp4 || mx_fits);
    const int band = streamed && !per_pair && moe_band_on(mxfp4) && k3c_cuda_moe_band_fits(mxfp4, In, F, pairs) &&
                     k3c_cuda_moe_band_lists_ints(pairs) <= (size_t)T * Out;
    if (per_pair || band) {
        K3C_TRY(check_dims(mxfp4, In, "input width"));
        K3C_TRY(check_dims(mxfp4, F, "intermediate width"));
        if (k <= 0) return k3c_errorf("moe experts: %d slots per token", k);
        if (per_pair && !mxfp4)
            return k3c_cuda_moe_pair_bf16(experts, num_experts, In, F, Out, x, T, idx, weight, k, act, round_bf16, h, out,
                                 stream);
        /* gate into h, up into part (rows of F: part holds pairs x Out >= pairs x F), the activation in place
         * into h, then down into part, and the weighted sum below; per pair (MXFP4) or by expert band
         * (moe_pair.h: its tile table lives in out until the combine writes it) */
        int *lists = band ? (int *)out : NULL;
        const int tile_cols = band ? k3c_cuda_moe_band_cols(mxfp4, pairs, num_experts, In, F) : 0;
        if (band) K3C_TRY(k3c_cuda_moe_band_lists(idx, pairs, num_experts, tile_cols, lists, stream));
        K3C_TRY(stream_mats(band, experts, num_experts, mxfp4, idx, lists, tile_cols, pairs, 2, F, In, x, k, h, part,
                            rh, stream));
        K3C_TRY(k3c_cuda_gated_act(act, h, F, part, F, pairs, F, rh, h, stream));
        K3C_TRY(stream_mats(band, experts, num_experts, mxfp4, idx, lists, tile_cols, pairs, 1, Out, F, h, 1, part,
                            part, ro, stream));
    } else {
        K3C_TRY(k3c_cuda_moe_gate_up(experts, num_experts, mxfp4, In, F, x, T, idx, k, act, rh, h, stream));
        K3C_TRY(k3c_cuda_moe_down(experts, num_experts, mxfp4, F, Out, h, T * k, k, idx, ro, part, stream));
    }
    size_t n = (size_t)T * Out;
    if (n == 0) return K3C_OK;
    size_t blocks = (n + 255) / 256;
    if (blocks > 2048) blocks = 2048;
    moe_combine_kernel<<<(unsigned)blocks, 256, 0, stream>>>(part, weight, idx, num_experts, k, Out, T, ro, out);
    K3C_CUDA_LAUNCHED("moe_combine");
    return K3C_OK;
}

K3C_STAMP_TU(moe) /* K3C_CUDA_PROFILE=3: this file's stamped kernels (cuda/stamp.cuh) */
