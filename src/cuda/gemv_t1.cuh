/* The T = 1 weight-streaming GEMV work item (one block's share of rows of a bf16 matrix against one f32
 * vector), shared by cuda/gemm.cu's GEMV kernels and cuda/moe.cu's per-pair expert products, so both stream
 * weights the same way; and the host-side plan of such a persistent launch. */
#ifndef K3C_CUDA_GEMV_T1_CUH
#define K3C_CUDA_GEMV_T1_CUH

#include <stdint.h>

#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/gemm.h"

#define GEMV_WARPS 8
#define T1_RPW 2 /* T = 1: rows per warp */
#define T1_U 4   /* T = 1: 16-byte chunks per row in flight per lane */
#define T1_PREFETCH 2 /* T = 1: batches of a warp's first item prefetched into L2 before the PDL wait */

/* The stored output: the f32 sum, or (round) its bf16 value, as the model's bf16 activations are; the
 * same rounding as k3c_cuda_round_bf16, done in the store instead of a pass of its own. */
__device__ __forceinline__ float out_value(float v, int round) { return round ? k3c_dev_bf16(k3c_dev_to_bf16(v)) : v; }

/* T = 1: a warp owns T1_RPW rows; lane l of warp k of the row's group reads chunks (b*wpr + k)*32*T1_U +
 * 32 u + l, so each load instruction of the warp is 512 contiguous bytes, and keeps T1_RPW * T1_U 16-byte
 * loads in flight. The token vector is read through L1 (shared by all warps of the SM). A work item is one
 * block's share: GEMV_WARPS / wpr row groups of T1_RPW rows, wpr warps splitting each row's k range (their
 * partials summed in warp order through shared memory). The item functions below serve the one-matrix
 * kernel and the grouped one alike, so a matrix's outputs do not depend on which of them ran it. */

/* PDL (common.cuh): while the kernel before this one finishes, bring the weights of this warp's first
 * T1_PREFETCH batches of item `item` into L2 (the weights are written by no kernel of a step) */
__device__ __forceinline__ void t1_prefetch(const uint16_t *__restrict__ W, int rows, int cols, int wpr, int item) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int groups = GEMV_WARPS / wpr, group = warp / wpr, kw = warp % wpr, chunks = cols >> 3;
    int row0 = (item * groups + group) * T1_RPW;
    if (row0 >= rows) return;
#pragma unroll
    for (int r = 0; r < T1_RPW; r++) {
        const uint16_t *wr = W + (size_t)min(row0 + r, rows - 1) * cols;
        for (int b = 0; b < T1_PREFETCH; b++)
#pragma unroll
            for (int u = 0; u < T1_U; u++) {
                int c = (b * wpr + kw) * 32 * T1_U + 32 * u + lane;
                if (c < chunks && (lane & 7) == 0) k3c_prefetch_l2(wr + (size_t)c * 8); /* a lane per line */
            }
    }
}

/* s + the 8 products of a 16-byte chunk of bf16 weights w with activations (a, b), by fmaf in order. */
__device__ __forceinline__ float t1_dot8(uint4 w, float4 a, float4 b, float s) {
    s = fmaf(k3c_dev_bf16_lo(w.x), a.x, s);
    s = fmaf(k3c_dev_bf16_hi(w.x), a.y, s);
    s = fmaf(k3c_dev_bf16_lo(w.y), a.z, s);
    s = fmaf(k3c_dev_bf16_hi(w.y), a.w, s);
    s = fmaf(k3c_dev_bf16_lo(w.z), b.x, s);
    s = fmaf(k3c_dev_bf16_hi(w.z), b.y, s);
    s = fmaf(k3c_dev_bf16_lo(w.w), b.z, s);
    s = fmaf(k3c_dev_bf16_hi(w.w), b.w, s);
    return s;
}

/* The dot products of T1_RPW rows (wr, cols bf16 each) with x (f32, read through L1) over this warp's share
 * of their k range (warp kw of the wpr warps of a row group), U 16-byte chunks of each row per lane in
 * flight, reduced over the group's warps in warp order through part (shared, [GEMV_WARPS][T1_RPW]; unused
 * when wpr = 1). The sums land in acc in every lane of the group's first warp (kw == 0); live = 0: the warp
 * has no rows (its sums are 0). With wpr > 1, every warp of the block calls it the same number of times (it
 * __syncthreads); with wpr = 1 it has no barrier. */
template <int U = T1_U>
__device__ __forceinline__ void t1_dot(const uint16_t *const (&wr)[T1_RPW], bool live, int cols,
                                       const float *__restrict__ x, int wpr, float (&acc)[T1_RPW],
                                       float (*part)[T1_RPW]) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, kw = warp % wpr, chunks = cols >> 3;
#pragma unroll
    for (int r = 0; r < T1_RPW; r++) acc[r] = 0.0f;
    if (live) {
        for (int base = kw * 32 * U; base < chunks; base += wpr * 32 * U) {
            uint4 wv[T1_RPW][U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                int c = base + 32 * u + lane;
#pragma unroll
                for (int r = 0; r < T1_RPW; r++)
                    wv[r][u] = c < chunks ? k3c_ld_stream16(wr[r] + (size_t)c * 8) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                int c = base + 32 * u + lane;
                if (c < chunks) {
                    const float4 *xp = (const float4 *)(x + (size_t)c * 8);
                    float4 a = __ldg(xp), b = __ldg(xp + 1);
#pragma unroll
                    for (int r = 0; r < T1_RPW; r++) acc[r] = t1_dot8(wv[r][u], a, b, acc[r]);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < T1_RPW; r++) acc[r] = k3c_warp_sum(acc[r]);
    if (wpr == 1) return;
    if (lane == 0)
#pragma unroll
        for (int r = 0; r < T1_RPW; r++) part[warp][r] = acc[r];
    __syncthreads();
    if (kw == 0)
#pragma unroll
        for (int r = 0; r < T1_RPW; r++) {
            float s = 0.0f;
            for (int j = 0; j < wpr; j++) s += part[warp + j][r];
            acc[r] = s;
        }
    __syncthreads();
}

/* One item: rows row0 .. row0 + T1_RPW - 1 of this warp's group into y; every warp of the block calls it
 * with the same arguments (it may __syncthreads). fo (cuda/gemm.h k3c_cuda_fanout, NULL: none): each output
 * also stored at every destination, po floats past its parity-0 place. */
__device__ __forceinline__ void t1_item(const uint16_t *__restrict__ W, int rows, int cols,
                                        const float *__restrict__ x, float *__restrict__ y, int wpr, int item,
                                        int round, float (*part)[T1_RPW], const k3c_cuda_fanout *fo = nullptr,
                                        size_t po = 0) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int groups = GEMV_WARPS / wpr, group = warp / wpr, kw = warp % wpr;
    int row0 = (item * groups + group) * T1_RPW;
    const uint16_t *wr[T1_RPW];
#pragma unroll
    for (int r = 0; r < T1_RPW; r++) wr[r] = W + (size_t)min(row0 + r, rows - 1) * cols;
    float acc[T1_RPW];
    t1_dot(wr, row0 < rows, cols, x, wpr, acc, part);
    float v = acc[0];
#pragma unroll
    for (int r = 1; r < T1_RPW; r++) v = lane == r ? acc[r] : v;
    if (kw == 0 && lane < T1_RPW && row0 + lane < rows) {
        const float o = out_value(v, round);
        y[row0 + lane] = o;
        if (fo)
            for (int d = 0; d < fo->n; d++) __stcg(fo->dst[d] + po + row0 + lane, o);
    }
}

/* A streaming kernel launched with PDL where the build and K3C_PDL allow (common.cuh), else as usual. */
template <typename... Params, typename... Args>
static int launch_stream(void (*kernel)(Params...), int grid, cudaStream_t s, Args... args) {
#ifndef K3C_EMU_NO_PDL
    if (k3c_pdl_enabled()) {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.gridDim = dim3(grid);
        cfg.blockDim = dim3(GEMV_WARPS * 32);
        cfg.dynamicSmemBytes = 0;
        cfg.stream = s;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        K3C_CUDA_TRY(cudaLaunchKernelEx(&cfg, kernel, args...));
        return K3C_OK;
    }
#endif
    kernel<<<grid, GEMV_WARPS * 32, 0, s>>>(args...);
    return K3C_OK;
}

/* Resident blocks of GEMV_WARPS warps per SM for a kernel (queried once). */
template <typename K>
static inline int resident_blocks(K kernel, int *cache) {
    if (!*cache) {
        int n = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, GEMV_WARPS * 32, 0) != cudaSuccess || n < 1)
            n = 1;
        *cache = n;
    }
    return *cache * k3c_cuda_sm_count();
}

/* units: row groups of one warp; batches: runs of loads along one row (a warp of a split row gets at least
 * one). Chooses warps per row (1..8) and the grid: items of one block = GEMV_WARPS / wpr row groups; when
 * there are more items than resident blocks, the best choice spreads them evenly (items / (waves * cap)
 * near 1); with fewer, enough warps to keep about 16 per SM streaming. */
static inline void plan_grid(int units, int batches, int cap, int *wpr_out, int *grid_out, int *items_out) {
    int best_wpr = 1;
    double best = -1.0;
    for (int wpr = 1; wpr <= GEMV_WARPS; wpr *= 2) {
        if (wpr > 1 && batches < wpr) break;
        int groups = GEMV_WARPS / wpr;
        int items = (units + groups - 1) / groups;
        double eff;
        if (items <= cap) {
            eff = (double)items * GEMV_WARPS / (16.0 * k3c_cuda_sm_count());
            if (eff > 1.0) eff = 1.0;
        } else {
            int waves = (items + cap - 1) / cap;
            eff = (double)items / ((double)waves * cap);
        }
        if (eff > best + 0.02) {
            best = eff;
            best_wpr = wpr;
        }
    }
    int groups = GEMV_WARPS / best_wpr;
    int items = (units + groups - 1) / groups;
    *wpr_out = best_wpr;
    *items_out = items;
    *grid_out = items < cap ? items : cap;
}

/* A given split of rows into wpr warps each (halved while a row has fewer load batches than warps): the
 * items of `units` row groups of one warp. Returns the wpr taken. */
static inline int plan_split(int units, int batches, int wpr, int *items_out) {
    while (wpr > 1 && batches < wpr) wpr >>= 1;
    const int groups = GEMV_WARPS / wpr;
    *items_out = (units + groups - 1) / groups;
    return wpr;
}

/* An A/B knob forcing warps per row: the environment variable's 1, 2, 4 or 8, else 0 (not forced). */
static inline int forced_wpr_from_env(const char *name) {
    const char *v = getenv(name);
    const int w = v && *v ? atoi(v) : 0;
    return w == 1 || w == 2 || w == 4 || w == 8 ? w : 0;
}

#endif
