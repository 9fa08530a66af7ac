/* bf16 matrix products: a weight-streaming kernel for skinny T (decode) and cuBLASLt for prefill. */
#include "cuda/gemm.h"

#include <string.h>

#include "cuda/check.h"
#include "cuda/cublaslt.h"
#include "cuda/common.cuh"
#include "cuda/elementwise.h"

#include "cuda/gemv_t1.cuh"
#include "cuda/mma.cuh"

#define MM_U 4        /* T = 2..8: 32-element k steps in flight per lane (2 x 16 bytes each) */
#define MM_PREFETCH 2 /* T = 2..8: runs of MM_U steps of a warp's first band prefetched into L2 before the PDL
                       * wait (T = 1's T1_PREFETCH likewise, gemv_t1.cuh) */

/* Both streaming kernels are persistent: the launcher sizes the grid to what stays resident and picks how
 * many warps share a row (wpr, a split of the row's k range whose partials are summed in a fixed order
 * through shared memory: deterministic) so that every block gets the same number of work items. Measured
 * before (docs/kernels.md): one block per row group left a partial last wave that cost 10-50% of the time. */

/* Below this many rows, T > 1 products run the T = 1 kernel once per token (see gemv_tile). */
#define GEMV_MMA_MIN_ROWS 256

__global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_t1_kernel(const uint16_t *__restrict__ W, int rows, int cols, const float *__restrict__ x,
               float *__restrict__ y, int wpr, int items, int round) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_GEMV_T1);
    __shared__ float part[GEMV_WARPS][T1_RPW];
    /* PDL: let the next kernel start as this one's blocks retire; x is read only after the wait */
    k3c_pdl_trigger();
    if ((int)blockIdx.x < items) t1_prefetch(W, rows, cols, wpr, blockIdx.x);
    k3c_pdl_wait();
    for (int item = blockIdx.x; item < items; item += gridDim.x) t1_item(W, rows, cols, x, y, wpr, item, round, part);
    K3C_STAMP_BLOCK_END(K3C_KID_GEMV_T1);
}

/* A grouped launch (k3c_cuda_gemv_group): up to GROUP_VMAX products, each with its own matrix, input,
 * output, wpr and rounding; product s owns items first[s] .. first[s + 1] - 1 of the launch. Passed as a
 * __grid_constant__ parameter (read in place from the parameter bank, ~2.8 KB of the 4 KB allowed). */
#define GROUP_VMAX 64
struct gemv_group {
    int n, T;
    int first[GROUP_VMAX + 1];
    const uint16_t *W[GROUP_VMAX];
    const float *x[GROUP_VMAX];
    float *y[GROUP_VMAX];
    int rows[GROUP_VMAX], cols[GROUP_VMAX], wpr[GROUP_VMAX], round[GROUP_VMAX];
};

__device__ __forceinline__ int group_find(const gemv_group &g, int item) {
    int s = 0;
    while (s + 1 < g.n && item >= g.first[s + 1]) s++;
    return s;
}

__global__ void __launch_bounds__(GEMV_WARPS * 32, 4) gemv_t1_group_kernel(const __grid_constant__ gemv_group g) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_GEMV_T1_GROUP);
    __shared__ float part[GEMV_WARPS][T1_RPW];
    int items = g.first[g.n];
    k3c_pdl_trigger();
    if ((int)blockIdx.x < items) {
        int s = group_find(g, blockIdx.x);
        t1_prefetch(g.W[s], g.rows[s], g.cols[s], g.wpr[s], blockIdx.x - g.first[s]);
    }
    k3c_pdl_wait();
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
        int s = group_find(g, item);
        t1_item(g.W[s], g.rows[s], g.cols[s], g.x[s], g.y[s], g.wpr[s], item - g.first[s], g.round[s], part);
    }
    K3C_STAMP_BLOCK_END(K3C_KID_GEMV_T1_GROUP);
}

/* T = 2..8 on tensor cores (mma.cuh): a warp owns a band of 16 rows; per 32-element k step s lane (g, q)
 * loads chunk 4 s + q (16 bytes) of rows g and g + 8 and the same 8 activations of token g, split into
 * bf16 terms. Steps are taken MM_U at a time (2 MM_U 16-byte weight loads in flight per lane); the warps of
 * a row group split the steps in runs of MM_U. Each run's products are summed into a fresh fragment and
 * then added to the f32 accumulator. */

/* PDL prefetch of the first MM_PREFETCH runs of this warp's band of item `item` (a run of a row is MM_U * 64
 * contiguous bytes: lanes q = 0 of u = 0, 2 touch its two 128-byte lines) */
__device__ __forceinline__ void mma_prefetch(const uint16_t *__restrict__ W, int rows, int cols, int wpr, int item) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    int groups = GEMV_WARPS / wpr, group = warp / wpr, kw = warp % wpr, chunks = cols >> 3;
    int row0 = (item * groups + group) * 16;
    if (row0 >= rows || q != 0) return;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const uint16_t *wr = W + (size_t)min(row0 + g + 8 * h, rows - 1) * cols;
        for (int b = 0; b < MM_PREFETCH; b++)
#pragma unroll
            for (int u = 0; u < MM_U; u += 2) {
                int c = ((b * wpr + kw) * MM_U + u) * 4;
                if (c < chunks) k3c_prefetch_l2(wr + (size_t)c * 8);
            }
    }
}

/* One 32-element k step's products, NT bf16 terms of the activations (1 when they are all bf16 values, else
 * 3), into a fresh fragment d. */
template <int NT>
__device__ __forceinline__ void mma_step(const uint4 &va, const uint4 &vb, const float4 &x0, const float4 &x1,
                                         float (&d)[4]) {
#pragma unroll
    for (int i = 0; i < 4; i++) d[i] = 0.0f;
    if (NT == 1) {
        k3c_mma_bf16(d, va.x, vb.x, va.y, vb.y, k3c_pack_hi16(x0.x, x0.y), k3c_pack_hi16(x0.z, x0.w));
        k3c_mma_bf16(d, va.z, vb.z, va.w, vb.w, k3c_pack_hi16(x1.x, x1.y), k3c_pack_hi16(x1.z, x1.w));
    } else {
        uint32_t b0[3], b1[3], b2[3], b3[3];
        k3c_split3(x0.x, x0.y, b0);
        k3c_split3(x0.z, x0.w, b1);
        k3c_split3(x1.x, x1.y, b2);
        k3c_split3(x1.z, x1.w, b3);
#pragma unroll
        for (int k = 0; k < 3; k++) {
            k3c_mma_bf16(d, va.x, vb.x, va.y, vb.y, b0[k], b1[k]);
            k3c_mma_bf16(d, va.z, vb.z, va.w, vb.w, b2[k], b3[k]);
        }
    }
}

/* One item of the tensor-core kernel; every warp of the block calls it with the same arguments. RUNVOTE: one
 * warp vote a run picks the term count of all its steps, so a run's steps have no branch between them (the
 * MXFP4 kernels' lesson, moe_pair.cu mxp_compute); else one vote a step, as before 2026-11-30
 * (K3C_GEMV_MMA_VOTE=step, the A/B knob). The same sums either way, except that a bf16-exact step inside a
 * run that is not also multiplies its zero mid and lo terms (adding zeros). */
template <bool RUNVOTE>
__device__ __forceinline__ void mma_item(const uint16_t *__restrict__ W, int rows, int cols,
                                         const float *__restrict__ x, int T, float *__restrict__ y, int wpr,
                                         int item, int round, float (*part)[4][32],
                                         const k3c_cuda_fanout *fo = nullptr, size_t po = 0) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    int groups = GEMV_WARPS / wpr, group = warp / wpr, kw = warp % wpr;
    int chunks = cols >> 3, steps = (chunks + 3) >> 2;
    bool tok = g < T;
    const float *xg = x + (size_t)(tok ? g : 0) * cols;
    int row0 = (item * groups + group) * 16;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (row0 < rows) {
        const uint16_t *wa = W + (size_t)min(row0 + g, rows - 1) * cols;
        const uint16_t *wb = W + (size_t)min(row0 + g + 8, rows - 1) * cols;
        for (int base = kw * MM_U; base < steps; base += wpr * MM_U) {
            uint4 va[MM_U], vb[MM_U];
#pragma unroll
            for (int u = 0; u < MM_U; u++) {
                int c = (base + u) * 4 + q;
                bool ok = c < chunks;
                va[u] = ok ? k3c_ld_stream16(wa + (size_t)c * 8) : make_uint4(0, 0, 0, 0);
                vb[u] = ok ? k3c_ld_stream16(wb + (size_t)c * 8) : make_uint4(0, 0, 0, 0);
            }
            /* one accumulator per step: MM_U independent mma chains (one chain of 4 MM_U..12 MM_U dependent
             * mma was latency-bound: bench_gpu gemm read 0.55 of copy bandwidth), then the steps in order */
            float d[MM_U][4];
            if (RUNVOTE) {
                float4 x0[MM_U], x1[MM_U];
                bool exact = true;
#pragma unroll
                for (int u = 0; u < MM_U; u++) {
                    int c = (base + u) * 4 + q;
                    x0[u] = x1[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    if (tok && c < chunks) {
                        x0[u] = __ldg((const float4 *)(xg + (size_t)c * 8));
                        x1[u] = __ldg((const float4 *)(xg + (size_t)c * 8) + 1);
                    }
                    exact = exact && k3c_bf16_exact8(x0[u], x1[u]);
                }
                if (__all_sync(0xffffffffu, exact)) {
#pragma unroll
                    for (int u = 0; u < MM_U; u++) mma_step<1>(va[u], vb[u], x0[u], x1[u], d[u]);
                } else {
#pragma unroll
                    for (int u = 0; u < MM_U; u++) mma_step<3>(va[u], vb[u], x0[u], x1[u], d[u]);
                }
            } else {
#pragma unroll
                for (int u = 0; u < MM_U; u++) {
                    int c = (base + u) * 4 + q;
                    float4 x0 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), x1 = x0;
                    if (tok && c < chunks) {
                        x0 = __ldg((const float4 *)(xg + (size_t)c * 8));
                        x1 = __ldg((const float4 *)(xg + (size_t)c * 8) + 1);
                    }
                    if (__all_sync(0xffffffffu, k3c_bf16_exact8(x0, x1))) mma_step<1>(va[u], vb[u], x0, x1, d[u]);
                    else mma_step<3>(va[u], vb[u], x0, x1, d[u]);
                }
            }
#pragma unroll
            for (int u = 0; u < MM_U; u++)
#pragma unroll
                for (int i = 0; i < 4; i++) acc[i] += d[u][i];
        }
    }
    /* acc: (row g, token 2q), (row g, token 2q+1), (row g+8, token 2q), (row g+8, token 2q+1) */
    if (wpr > 1) {
#pragma unroll
        for (int i = 0; i < 4; i++) part[warp][i][lane] = acc[i];
        __syncthreads();
        if (kw == 0) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float s = 0.0f;
                for (int j = 0; j < wpr; j++) s += part[warp + j][i][lane];
                acc[i] = s;
            }
        }
    }
    if (kw == 0 && row0 < rows) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int row = row0 + g + (i >> 1) * 8, t = 2 * q + (i & 1);
            if (row < rows && t < T) {
                const float o = out_value(acc[i], round);
                y[(size_t)t * rows + row] = o;
                if (fo) /* the fanout's stores (k3c_cuda_matmul_bf16_fanout) */
                    for (int d = 0; d < fo->n; d++) __stcg(fo->dst[d] + po + (size_t)t * rows + row, o);
            }
        }
    }
    if (wpr > 1) __syncthreads();
}

template <bool RUNVOTE>
__global__ void __launch_bounds__(GEMV_WARPS * 32, 2)
gemv_mma_kernel(const uint16_t *__restrict__ W, int rows, int cols, const float *__restrict__ x, int T,
                float *__restrict__ y, int wpr, int items, int round) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_GEMV_MMA);
    __shared__ float part[GEMV_WARPS][4][32];
    k3c_pdl_trigger();
    if ((int)blockIdx.x < items) mma_prefetch(W, rows, cols, wpr, blockIdx.x);
    k3c_pdl_wait();
    for (int item = blockIdx.x; item < items; item += gridDim.x)
        mma_item<RUNVOTE>(W, rows, cols, x, T, y, wpr, item, round, part);
    K3C_STAMP_BLOCK_END(K3C_KID_GEMV_MMA);
}

template <bool RUNVOTE>
__global__ void __launch_bounds__(GEMV_WARPS * 32, 2) gemv_mma_group_kernel(const __grid_constant__ gemv_group g) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_GEMV_MMA_GROUP);
    __shared__ float part[GEMV_WARPS][4][32];
    int items = g.first[g.n];
    k3c_pdl_trigger();
    if ((int)blockIdx.x < items) {
        int s = group_find(g, blockIdx.x);
        mma_prefetch(g.W[s], g.rows[s], g.cols[s], g.wpr[s], blockIdx.x - g.first[s]);
    }
    k3c_pdl_wait();
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
        int s = group_find(g, item);
        mma_item<RUNVOTE>(g.W[s], g.rows[s], g.cols[s], g.x[s], g.T, g.y[s], g.wpr[s], item - g.first[s], g.round[s], part);
    }
    K3C_STAMP_BLOCK_END(K3C_KID_GEMV_MMA_GROUP);
}

/* The fanout forms of the two streaming kernels (k3c_cuda_matmul_bf16_fanout): the same items in the same
 * order, each output also stored at the destinations. The skip and parity words are read after the PDL
 * wait: the kernels before this one on the stream have completed by then (the mailbox kernel that last
 * advanced the epoch among them; it is never PDL-launched and never triggers early, so every kernel after
 * it starts after it ended). The stores are fenced at system scope before the kernel ends, so the flags a
 * later kernel publishes order them (comm/mailbox.h: the pushed one-shot). */
__device__ __forceinline__ const k3c_cuda_fanout *fanout_begin(const k3c_cuda_fanout &fo, size_t *po) {
    const bool skip = *(const volatile uint32_t *)fo.skip != 0;
    *po = (*(const volatile uint32_t *)fo.parity_word & 1u) ? fo.parity_floats : 0;
    return skip ? nullptr : &fo;
}

__global__ void __launch_bounds__(GEMV_WARPS * 32)
gemv_t1_fanout_kernel(const uint16_t *__restrict__ W, int rows, int cols, const float *__restrict__ x,
                      float *__restrict__ y, int wpr, int items, const __grid_constant__ k3c_cuda_fanout fo) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_GEMV_T1);
    __shared__ float part[GEMV_WARPS][T1_RPW];
    k3c_pdl_trigger();
    if ((int)blockIdx.x < items) t1_prefetch(W, rows, cols, wpr, blockIdx.x);
    k3c_pdl_wait();
    size_t po;
    const k3c_cuda_fanout *f = fanout_begin(fo, &po);
    for (int item = blockIdx.x; item < items; item += gridDim.x)
        t1_item(W, rows, cols, x, y, wpr, item, 0, part, f, po);
    if (f) __threadfence_system();
    K3C_STAMP_BLOCK_END(K3C_KID_GEMV_T1);
}

template <bool RUNVOTE>
__global__ void __launch_bounds__(GEMV_WARPS * 32, 2)
gemv_mma_fanout_kernel(const uint16_t *__restrict__ W, int rows, int cols, const float *__restrict__ x, int T,
                       float *__restrict__ y, int wpr, int items, const __grid_constant__ k3c_cuda_fanout fo) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_GEMV_MMA);
    __shared__ float part[GEMV_WARPS][4][32];
    k3c_pdl_trigger();
    if ((int)blockIdx.x < items) mma_prefetch(W, rows, cols, wpr, blockIdx.x);
    k3c_pdl_wait();
    size_t po;
    const k3c_cuda_fanout *f = fanout_begin(fo, &po);
    for (int item = blockIdx.x; item < items; item += gridDim.x)
        mma_item<RUNVOTE>(W, rows, cols, x, T, y, wpr, item, 0, part, f, po);
    if (f) __threadfence_system();
    K3C_STAMP_BLOCK_END(K3C_KID_GEMV_MMA);
}

/* Any shape or alignment: one warp per (row, token), scalar loads. */
__global__ void gemv_bf16_scalar(const uint16_t *__restrict__ W, int rows, int cols, const float *__restrict__ x,
                                 int T, float *__restrict__ y, int round) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_GEMV_SCALAR);
    long long warp = (long long)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (warp >= (long long)rows * T) return;
    int row = (int)(warp % rows), t = (int)(warp / rows);
    const uint16_t *w = W + (size_t)row * cols;
    const float *xt = x + (size_t)t * cols;
    float s = 0.0f;
    for (int c = lane; c < cols; c += 32) s = fmaf(k3c_dev_bf16(w[c]), xt[c], s);
    s = k3c_warp_sum(s);
    if (lane == 0) y[(size_t)t * rows + row] = out_value(s, round);
    K3C_STAMP_BLOCK_END(K3C_KID_GEMV_SCALAR);
}

/* How a matrix runs at T <= K3C_CUDA_GEMV_MAX_T tokens, alone or in a group: the kernel, its split of rows
 * (wpr, which fixes each output's reduction order) and its item count. Planned against the one-matrix
 * kernels' residency, so a matrix in a group gets the wpr it gets alone, hence the same outputs. */
typedef struct gemv_plan {
    int scalar; /* unaligned: the scalar kernel, not groupable */
    int mma;    /* 1: the tensor-core kernel for all T tokens; 0: the T = 1 kernel once per token */
    int wpr, items, cap;
} gemv_plan;

/* K3C_GEMV_WPR / K3C_GEMV_MMA_WPR = 1, 2, 4 or 8: warps per row of the T = 1 / tensor-core GEMVs instead of
 * the planned split (A/B runs; halved while a row has fewer load runs than warps). Read once. */
static int gemv_forced_wpr(int mma) {
    static int forced[2] = {-1, -1};
    if (forced[mma] < 0) forced[mma] = forced_wpr_from_env(mma ? "K3C_GEMV_MMA_WPR" : "K3C_GEMV_WPR");
    return forced[mma];
}

/* K3C_GEMV_MMA_GRID=1: the tensor-core GEMVs planned by plan_grid (their plan before 2026-11-30) instead of
 * rows over all warps. Read once. */
static bool gemv_mma_grid(void) {
    static int grid = -1;
    if (grid < 0) {
        const char *v = getenv("K3C_GEMV_MMA_GRID");
        grid = v && v[0] == '1';
    }
    return grid;
}

/* K3C_GEMV_MMA_VOTE=step: the tensor-core kernels' exactness vote once a step instead of once a run (A/B
 * runs). Read once. */
static bool gemv_mma_runvote(void) {
    static int runvote = -1;
    if (runvote < 0) {
        const char *v = getenv("K3C_GEMV_MMA_VOTE");
        runvote = !(v && strcmp(v, "step") == 0);
    }
    return runvote;
}

static void plan_forced(int units, int batches, int wpr, gemv_plan *p) { p->wpr = plan_split(units, batches, wpr, &p->items); }

/* The streaming kernels' alignment (else the scalar kernel). */
static bool gemv_aligned(const uint16_t *W, int cols, const float *x) {
    return cols % 8 == 0 && ((uintptr_t)W & 15) == 0 && ((uintptr_t)x & 15) == 0;
}

static gemv_plan plan_matrix(const uint16_t *W, int rows, int cols, const float *x, int T) {
    static int occ_t1, occ_mma;
    gemv_plan p = {0, 0, 1, 0, 0};
    if (!gemv_aligned(W, cols, x)) {
        p.scalar = 1;
        return p;
    }
    int grid;
    if (T == 1 || rows < GEMV_MMA_MIN_ROWS) {
        /* T = 1, or a matrix too short for the tensor-core kernel (whose warps own 16 rows each: 64 rows at
         * T = 4 ran on 4 blocks, 87 us a call for k3-slice's router on the H200): token by token, each launch
         * with the whole GPU */
        int chunks = cols >> 3;
        p.cap = resident_blocks(gemv_t1_kernel, &occ_t1);
        plan_grid((rows + T1_RPW - 1) / T1_RPW, (chunks + 32 * T1_U - 1) / (32 * T1_U), p.cap, &p.wpr, &grid,
                  &p.items);
        if (gemv_forced_wpr(0))
            plan_forced((rows + T1_RPW - 1) / T1_RPW, (chunks + 32 * T1_U - 1) / (32 * T1_U), gemv_forced_wpr(0), &p);
    } else {
        int steps = ((cols >> 3) + 3) >> 2;
        p.mma = 1;
        p.cap = resident_blocks(gemv_mma_runvote() ? gemv_mma_kernel<true> : gemv_mma_kernel<false>, &occ_mma);
        /* Rows split over all GEMV_WARPS warps (fewer while a row has fewer runs): each warp reads the
         * activations of its own k range only, so an item's block reads them once from L2 (T tokens x
         * cols x 4 bytes: at T = 8 as many bytes as the item's weights); with whole rows a warp, its 8
         * warps each read all of them. plan_grid (K3C_GEMV_MMA_GRID=1, the A/B knob) picks the fewest warps
         * a row that fill the GPU: often 1 for a matrix of many bands. */
        if (gemv_mma_grid())
            plan_grid((rows + 15) / 16, (steps + MM_U - 1) / MM_U, p.cap, &p.wpr, &grid, &p.items);
        else
            plan_forced((rows + 15) / 16, (steps + MM_U - 1) / MM_U, GEMV_WARPS, &p);
        if (gemv_forced_wpr(1)) plan_forced((rows + 15) / 16, (steps + MM_U - 1) / MM_U, gemv_forced_wpr(1), &p);
    }
    return p;
}

static int gemv_tile(const uint16_t *W, int rows, int cols, const float *x, int T, float *y, int round,
                     cudaStream_t s) {
    gemv_plan p = plan_matrix(W, rows, cols, x, T);
    int grid = p.items < p.cap ? p.items : p.cap;
    if (p.scalar) {
        long long warps = (long long)rows * T;
        gemv_bf16_scalar<<<(unsigned)((warps + GEMV_WARPS - 1) / GEMV_WARPS), GEMV_WARPS * 32, 0, s>>>(W, rows, cols,
                                                                                                      x, T, y, round);
    } else if (!p.mma) {
        for (int t = 0; t < T; t++)
            K3C_TRY(launch_stream(gemv_t1_kernel, grid, s, W, rows, cols, x + (size_t)t * cols, y + (size_t)t * rows,
                                  p.wpr, p.items, round));
    } else {
        auto *mma_kernel = gemv_mma_runvote() ? gemv_mma_kernel<true> : gemv_mma_kernel<false>;
        K3C_TRY(launch_stream(mma_kernel, grid, s, W, rows, cols, x, T, y, p.wpr, p.items, round));
    }
    K3C_CUDA_LAUNCHED("gemv_bf16");
    return K3C_OK;
}

extern "C" int k3c_cuda_fanout_ok(const uint16_t *W, int rows, int cols, const float *x, int T) {
    return rows > 0 && cols > 0 && T >= 1 && T <= K3C_CUDA_GEMV_MAX_T && gemv_aligned(W, cols, x);
}

/* gemv_tile's launches (the same plan and grid: the plan, from the one-matrix kernels' residency, fixes the
 * reduction order) in their fanout forms, unrounded. */
extern "C" int k3c_cuda_matmul_bf16_fanout(const uint16_t *W, int rows, int cols, const float *x, int T, float *y,
                                           const k3c_cuda_fanout *fo, cudaStream_t s) {
    if (!k3c_cuda_fanout_ok(W, rows, cols, x, T) || !fo || fo->n < 0 || fo->n > K3C_CUDA_FANOUT_MAX ||
        !fo->parity_word || !fo->skip)
        return k3c_errorf("k3c_cuda_matmul_bf16_fanout: rows %d cols %d T %d (T 1..%d, W and x 16-byte aligned, cols "
                          "a multiple of 8) or a bad fanout", rows, cols, T, K3C_CUDA_GEMV_MAX_T);
    for (int d = 0; d < fo->n; d++)
        if (!fo->dst[d]) return k3c_errorf("k3c_cuda_matmul_bf16_fanout: destination %d is NULL", d);
    gemv_plan p = plan_matrix(W, rows, cols, x, T);
    int grid = p.items < p.cap ? p.items : p.cap;
    if (!p.mma) {
        for (int t = 0; t < T; t++) {
            k3c_cuda_fanout ft = *fo; /* token t's outputs start t * rows into y and into every destination */
            for (int d = 0; d < ft.n; d++) ft.dst[d] += (size_t)t * rows;
            K3C_TRY(launch_stream(gemv_t1_fanout_kernel, grid, s, W, rows, cols, x + (size_t)t * cols,
                                  y + (size_t)t * rows, p.wpr, p.items, ft));
        }
    } else {
        auto *mma_kernel = gemv_mma_runvote() ? gemv_mma_fanout_kernel<true> : gemv_mma_fanout_kernel<false>;
        K3C_TRY(launch_stream(mma_kernel, grid, s, W, rows, cols, x, T, y, p.wpr, p.items, *fo));
    }
    K3C_CUDA_LAUNCHED("gemv_bf16 fanout");
    return K3C_OK;
}

/* Launches a filled group (and empties it); the grid is what the group kernel keeps resident. */
static int group_flush(gemv_group *grp, int mma, cudaStream_t s) {
    static int occ_t1g, occ_mmag;
    if (grp->n == 0) return K3C_OK;
    int items = grp->first[grp->n];
    auto *mma_kernel = gemv_mma_runvote() ? gemv_mma_group_kernel<true> : gemv_mma_group_kernel<false>;
    int cap = mma ? resident_blocks(mma_kernel, &occ_mmag) : resident_blocks(gemv_t1_group_kernel, &occ_t1g);
    int grid = items < cap ? items : cap;
    if (mma) K3C_TRY(launch_stream(mma_kernel, grid, s, *grp));
    else K3C_TRY(launch_stream(gemv_t1_group_kernel, grid, s, *grp));
    K3C_CUDA_LAUNCHED(mma ? "gemv_mma_group" : "gemv_t1_group");
    grp->n = 0;
    return K3C_OK;
}

static int group_add(gemv_group *grp, int mma, const uint16_t *W, int rows, int cols, const float *x, float *y,
                     int round, const gemv_plan *p, cudaStream_t s) {
    if (grp->n == GROUP_VMAX) K3C_TRY(group_flush(grp, mma, s));
    int i = grp->n++;
    if (i == 0) grp->first[0] = 0;
    grp->W[i] = W;
    grp->x[i] = x;
    grp->y[i] = y;
    grp->rows[i] = rows;
    grp->cols[i] = cols;
    grp->wpr[i] = p->wpr;
    grp->round[i] = round;
    grp->first[i + 1] = grp->first[i] + p->items;
    return K3C_OK;
}

extern "C" int k3c_cuda_gemv_group(k3c_cuda_gemm *g, const k3c_cuda_gemv_seg *segs, int n, int T,
                                   cudaStream_t stream) {
    if (n < 1 || n > K3C_CUDA_GEMV_GROUP_MAX || T < 0)
        return k3c_errorf("k3c_cuda_gemv_group: %d products at T %d (1..%d products)", n, T, K3C_CUDA_GEMV_GROUP_MAX);
    for (int i = 0; i < n; i++)
        if (!segs[i].W || !segs[i].x || !segs[i].y || segs[i].rows <= 0 || segs[i].cols <= 0)
            return k3c_errorf("k3c_cuda_gemv_group: product %d: bad matrix rows %d cols %d or NULL pointer", i,
                              segs[i].rows, segs[i].cols);
    if (T == 0) return K3C_OK;
    if (T > K3C_CUDA_GEMV_MAX_T) { /* prefill-sized: each product as the stock path runs it */
        for (int i = 0; i < n; i++)
            K3C_TRY(k3c_cuda_matmul_bf16_round(g, segs[i].W, segs[i].rows, segs[i].cols, segs[i].x, T, segs[i].y,
                                               segs[i].round, stream));
        return K3C_OK;
    }
    gemv_group t1, mm; /* host staging; a launch copies it into the kernel's parameters */
    t1.n = mm.n = 0;
    t1.T = 1;
    mm.T = T;
    for (int i = 0; i < n; i++) {
        const k3c_cuda_gemv_seg *sg = &segs[i];
        gemv_plan p = plan_matrix(sg->W, sg->rows, sg->cols, sg->x, T);
        if (p.scalar) K3C_TRY(gemv_tile(sg->W, sg->rows, sg->cols, sg->x, T, sg->y, sg->round, stream));
        else if (p.mma) K3C_TRY(group_add(&mm, 1, sg->W, sg->rows, sg->cols, sg->x, sg->y, sg->round, &p, stream));
        else
            for (int t = 0; t < T; t++)
                K3C_TRY(group_add(&t1, 0, sg->W, sg->rows, sg->cols, sg->x + (size_t)t * sg->cols,
                                  sg->y + (size_t)t * sg->rows, sg->round, &p, stream));
    }
    K3C_TRY(group_flush(&mm, 1, stream));
    return group_flush(&t1, 0, stream);
}

static int gemv_tiles(const uint16_t *W, int rows, int cols, const float *x, int T, float *y, int round,
                      cudaStream_t stream) {
    for (int t0 = 0; t0 < T; t0 += K3C_CUDA_GEMV_MAX_T) {
        int n = T - t0 < K3C_CUDA_GEMV_MAX_T ? T - t0 : K3C_CUDA_GEMV_MAX_T;
        K3C_TRY(gemv_tile(W, rows, cols, x + (size_t)t0 * cols, n, y + (size_t)t0 * rows, round, stream));
    }
    return K3C_OK;
}

extern "C" int k3c_cuda_gemv_bf16(const uint16_t *W, int rows, int cols, const float *x, int T, float *y,
                                  cudaStream_t stream) {
    if (rows <= 0 || cols <= 0 || T < 0)
        return k3c_errorf("k3c_cuda_gemv_bf16: bad shape rows %d cols %d T %d", rows, cols, T);
    return gemv_tiles(W, rows, cols, x, T, y, 0, stream);
}

__global__ void f32_to_bf16_kernel(const float *__restrict__ x, size_t n, uint16_t *__restrict__ out) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_F32_TO_BF16);
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = k3c_dev_to_bf16(x[i]);
    K3C_STAMP_BLOCK_END(K3C_KID_F32_TO_BF16);
}

extern "C" int k3c_cuda_f32_to_bf16(const float *x, size_t n, uint16_t *out, cudaStream_t stream) {
    if (n == 0) return K3C_OK;
    size_t blocks = (n + 255) / 256;
    if (blocks > 4096) blocks = 4096;
    f32_to_bf16_kernel<<<(unsigned)blocks, 256, 0, stream>>>(x, n, out);
    K3C_CUDA_LAUNCHED("f32_to_bf16");
    return K3C_OK;
}

#define LT_TRY(call)                                                                                               \
    do {                                                                                                           \
        cublasStatus_t st_ = (call);                                                                               \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                                        \
            rc = k3c_errorf_kind(K3C_ERROR_DEVICE, "%s:%d: %s: cuBLASLt status %d", __FILE__, __LINE__, #call, (int)st_);                 \
            goto done;                                                                                             \
        }                                                                                                          \
    } while (0)

static void plan_destroy(k3c_cuda_gemm_plan *p);

extern "C" int k3c_cuda_gemm_init(k3c_cuda_gemm *g, void *workspace, size_t workspace_bytes, uint16_t *xbf,
                                  size_t xbf_elems) {
    g->lt = NULL;
    g->workspace = workspace;
    g->workspace_bytes = workspace_bytes;
    g->xbf = xbf;
    g->xbf_elems = xbf_elems;
    g->nplans = g->next_evict = 0;
    memset(g->plans, 0, sizeof g->plans);
    const k3c_cublaslt_api *lt = k3c_cublaslt(); /* loaded here, on the first cuda engine (cuda/cublaslt.h) */
    if (!lt) return k3c_error_context("cuBLASLt");
    cublasLtHandle_t h;
    cublasStatus_t st = lt->Create(&h);
    if (st != CUBLAS_STATUS_SUCCESS) return k3c_errorf_kind(K3C_ERROR_DEVICE, "cublasLtCreate: status %d", (int)st);
    g->lt = h;
    return K3C_OK;
}

extern "C" void k3c_cuda_gemm_free(k3c_cuda_gemm *g) {
    if (g->lt) { /* a handle exists: the library is loaded */
        for (int i = 0; i < g->nplans; i++) plan_destroy(&g->plans[i]);
        g->nplans = 0;
        k3c_cublaslt()->Destroy((cublasLtHandle_t)g->lt);
    }
    g->lt = NULL;
}

static void plan_destroy(k3c_cuda_gemm_plan *p) {
    const k3c_cublaslt_api *lt = k3c_cublaslt();
    if (p->ld) lt->MatrixLayoutDestroy((cublasLtMatrixLayout_t)p->ld);
    if (p->lb) lt->MatrixLayoutDestroy((cublasLtMatrixLayout_t)p->lb);
    if (p->la) lt->MatrixLayoutDestroy((cublasLtMatrixLayout_t)p->la);
    if (p->op) lt->MatmulDescDestroy((cublasLtMatmulDesc_t)p->op);
    memset(p, 0, sizeof *p);
}

/* The largest power of two (4 .. 256) dividing every address: cuBLASLt's heuristic assumes 256-byte aligned
 * operands unless told less, and an algorithm chosen for 256 refuses (CUBLAS_STATUS_NOT_SUPPORTED) a pointer
 * that is not, e.g. a view into a fused projection's output. */
static int common_alignment(const void *a, const void *b, const void *c) {
    uintptr_t u = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c;
    int al = 256;
    while (al > 4 && (u & (uintptr_t)(al - 1))) al >>= 1;
    return al;
}

/* Column-major view for cuBLASLt: Y^T [rows, T] = W [cols x rows col-major]^T * X^T [cols, T]; so A = W with
 * op T (lda = cols), B = x as bf16 [cols, T] (ldb = cols), D = y [rows, T] (ldd = rows), all f32-accumulated.
 * The descriptors and algorithm of a (shape, alignment) are made once and kept in g->plans. */
static int lt_plan(k3c_cuda_gemm *g, int rows, int cols, int T, int align, k3c_cuda_gemm_plan **out) {
    for (int i = 0; i < g->nplans; i++) {
        k3c_cuda_gemm_plan *p = &g->plans[i];
        if (p->rows == rows && p->cols == cols && p->T == T && p->align == align) {
            *out = p;
            return K3C_OK;
        }
    }
    int rc = K3C_OK;
    const k3c_cublaslt_api *lt = k3c_cublaslt(); /* loaded: g->lt exists */
    k3c_cuda_gemm_plan np = {.rows = rows, .cols = cols, .T = T, .align = align};
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    uint32_t al = (uint32_t)align;
    LT_TRY(lt->MatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    np.op = op;
    LT_TRY(lt->MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_TRY(lt->MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    LT_TRY(lt->MatrixLayoutCreate(&la, CUDA_R_16BF, cols, rows, cols));
    np.la = la;
    LT_TRY(lt->MatrixLayoutCreate(&lb, CUDA_R_16BF, cols, T, cols));
    np.lb = lb;
    LT_TRY(lt->MatrixLayoutCreate(&ld, CUDA_R_32F, rows, T, rows));
    np.ld = ld;
    LT_TRY(lt->MatmulPreferenceCreate(&pref));
    LT_TRY(lt->MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &g->workspace_bytes,
                                            sizeof g->workspace_bytes));
    LT_TRY(lt->MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al));
    LT_TRY(lt->MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al));
    LT_TRY(lt->MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al));
    LT_TRY(lt->MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al));
    LT_TRY(lt->MatmulAlgoGetHeuristic((cublasLtHandle_t)g->lt, op, la, lb, ld, ld, pref, 1, &heur, &found));
    if (found < 1) {
        rc = k3c_errorf_kind(K3C_ERROR_DEVICE, "cuBLASLt: no algorithm for bf16 [%d x %d] x [%d x %d] (%d-byte "
                             "aligned operands)", rows, cols, cols, T, align);
        goto done;
    }
    static_assert(sizeof heur.algo == sizeof np.algo, "cublasLtMatmulAlgo_t is 64 bytes");
    memcpy(np.algo, &heur.algo, sizeof np.algo);
done:
    if (pref) lt->MatmulPreferenceDestroy(pref);
    if (rc != K3C_OK) {
        plan_destroy(&np);
        return rc;
    }
    /* a full table replaces its entries in turn (a model needs far fewer shapes than this) */
    int slot = g->nplans < K3C_CUDA_GEMM_PLANS ? g->nplans++ : g->next_evict++ % K3C_CUDA_GEMM_PLANS;
    if (g->plans[slot].op) plan_destroy(&g->plans[slot]);
    g->plans[slot] = np;
    *out = &g->plans[slot];
    return K3C_OK;
}

/* The algorithm the heuristic picks for 256-byte aligned operands is used first, as it always was; only a
 * product it refuses (CUBLAS_STATUS_NOT_SUPPORTED: an operand less aligned, e.g. a view into a fused
 * projection's output) takes the plan made for the operands' real alignment. (With every product planned
 * for its real alignment, kimi-linear-48b's 512-token prefill products read 104 ms of GPU time where the
 * build before had read 58, K3C_CUDA_PROFILE=1 on the H200, 2026-12-02, two device sessions apart.) */
static int lt_matmul(k3c_cuda_gemm *g, const uint16_t *W, int rows, int cols, int T, float *y, cudaStream_t s) {
    int rc = K3C_OK;
    const k3c_cublaslt_api *lt = k3c_cublaslt();
    int real = common_alignment(W, g->xbf, y);
    float alpha = 1.0f, beta = 0.0f;
    for (int align = 256;; align = real) {
        k3c_cuda_gemm_plan *p;
        K3C_TRY(lt_plan(g, rows, cols, T, align, &p));
        /* K3C_CUDA_PROFILE=3 counts cuBLASLt's kernels apart: they carry no block stamps (cuda/stamp.h) */
        long fb = k3c_cuda_stamp_foreign_begin(s);
        cublasStatus_t st = lt->Matmul((cublasLtHandle_t)g->lt, (cublasLtMatmulDesc_t)p->op, &alpha, W,
                                       (cublasLtMatrixLayout_t)p->la, g->xbf, (cublasLtMatrixLayout_t)p->lb, &beta,
                                       y, (cublasLtMatrixLayout_t)p->ld, y, (cublasLtMatrixLayout_t)p->ld,
                                       (const cublasLtMatmulAlgo_t *)p->algo, g->workspace, g->workspace_bytes, s);
        k3c_cuda_stamp_foreign_end(s, fb);
        if (st == CUBLAS_STATUS_NOT_SUPPORTED && align != real) continue;
        if (st != CUBLAS_STATUS_SUCCESS)
            rc = k3c_errorf_kind(K3C_ERROR_DEVICE, "cuBLASLt: bf16 [%d x %d] x [%d x %d] (%d-byte aligned operands): "
                                 "cublasLtMatmul status %d", rows, cols, cols, T, align, (int)st);
        break;
    }
    return rc;
}

extern "C" int k3c_cuda_matmul_bf16_round(k3c_cuda_gemm *g, const uint16_t *W, int rows, int cols, const float *x,
                                          int T, float *y, int round_bf16, cudaStream_t stream) {
    if (rows <= 0 || cols <= 0 || T < 0)
        return k3c_errorf("k3c_cuda_matmul_bf16: bad shape rows %d cols %d T %d", rows, cols, T);
    if (T == 0) return K3C_OK;
    if (T <= K3C_CUDA_GEMV_MAX_T || !g || !g->lt) return gemv_tiles(W, rows, cols, x, T, y, round_bf16, stream);
    size_t n = (size_t)T * cols;
    if (n > g->xbf_elems)
        return k3c_errorf("k3c_cuda_matmul_bf16: activation staging holds %zu elements, product needs %zu (T %d, "
                          "cols %d)", g->xbf_elems, n, T, cols);
    K3C_TRY(k3c_cuda_f32_to_bf16(x, n, g->xbf, stream));
    K3C_TRY(lt_matmul(g, W, rows, cols, T, y, stream));
    /* cuBLASLt writes f32: the rounding is a pass of its own here (prefill; decode products round in the
     * streaming kernels' stores) */
    return round_bf16 ? k3c_cuda_round_bf16(y, (size_t)T * rows, stream) : K3C_OK;
}

extern "C" int k3c_cuda_matmul_bf16(k3c_cuda_gemm *g, const uint16_t *W, int rows, int cols, const float *x, int T,
                                    float *y, cudaStream_t stream) {
    return k3c_cuda_matmul_bf16_round(g, W, rows, cols, x, T, y, 0, stream);
}

K3C_STAMP_TU(gemm) /* K3C_CUDA_PROFILE=3: this file's stamped kernels (cuda/stamp.cuh) */
