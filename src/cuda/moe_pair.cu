/* Routed experts at decode, one (token, slot) pair per expert product (cuda/moe_pair.h): bf16 experts as
 * GEMV rows in two launches, MXFP4 experts as 16-row bands decoded in registers. cuda/moe.cu chooses between
 * these and its grouped kernels. */
#include "cuda/moe_pair.h"

#include <pthread.h>
#include <stdlib.h>

#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/gemv_t1.cuh"
#include "cuda/kernel_limits.h"
#include "cuda/mma.cuh"
#include "cuda/mxfp4.cuh"

/* bf16 experts at decode, one (token, slot) pair per expert product: few pairs mostly choose distinct
 * experts (Kimi Linear: 8 of 256 per token), so the grouped kernel's B columns carry one token each and
 * its tensor-core staging buys nothing; bench_gpu moe read 0.44 of copy bandwidth at one token. Here
 * each pair's matrices are streamed as GEMV rows, in two launches (an op profile, 2026-11-30, put ~46 us a layer on
 * the four launches of before for 113 MB at kimi-linear-48b b=1, 27 us at copy bandwidth):
 *
 * moe_pair_gate_up_kernel: a warp owns row r of one pair and streams row r of the gate and of the up
 * matrix together, PG_U 16-byte chunks of each per lane in flight, then h[p, r] = act(gate, up) with the
 * stock roundings (gate and up rounded, then the activation): what the per-pair GEMV, then
 * k3c_cuda_gated_act, stored. An invalid expert: h = act(0, 0), as before.
 *
 * moe_pair_down_kernel: a warp owns output row r of one token and streams that row of PD_K of the
 * token's experts at once (PD_U chunks each per lane in flight), each expert's sum its own; then, in slot
 * order, each expert's rounded output goes into the weighted sum by fmaf, and the sum is rounded:
 * moe_combine_kernel's arithmetic, so out needs no pass of its own. (A first version, 2026-11-30, took the
 * experts one after another, one load round trip each: 0.39 of copy bandwidth for the down projection.)
 *
 * Sums of a row: lane l takes chunks c = base + 32 u + l, base in steps of 32 * U, u in order, each chunk's
 * 8 products by fmaf in order, then the warp butterfly (k3c_warp_sum). Both are PDL-launched: gate/up waits
 * before it reads anything and only then lets the down launch start, so that down may read the expert ids
 * (written by the router, complete by then) before its own wait and prefetch its first rows into L2. */
#define PG_U 6 /* gate/up: chunks of each row per lane in flight (2 rows: 12 x 16 B) */
static_assert(T1_RPW == 2, "moe_pair_gate_up_kernel passes the gate and the up row as t1_dot's rows");
#define PD_K 4 /* down: experts streamed at once */
#define PD_U 4 /* down: chunks per lane per expert in flight (PD_K x PD_U x 16 B; F = 1024: one pass) */

/* U: chunks of each row per lane in flight; MINB: the blocks an SM the compiler must fit (registers). Every
 * lane takes its chunks in the same order at any U (t1_dot), so the sums are the same bits at every variant
 * (K3C_MOE_PAIR_OCC below). */
template <int U, int MINB>
__global__ void __launch_bounds__(GEMV_WARPS * 32, MINB)
moe_pair_gate_up_kernel(const k3c_cuda_expert *__restrict__ experts, int num_experts, const int *__restrict__ idx,
                        int pairs, int F, int In, const float *__restrict__ x, int k, k3c_cuda_act act, int round,
                        float *__restrict__ h) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_MOE_PAIR_GATE_UP);
    k3c_pdl_wait(); /* idx, x: written by the kernels before this one */
    k3c_pdl_trigger();
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, per = (F + GEMV_WARPS - 1) / GEMV_WARPS;
    for (int item = blockIdx.x; item < pairs * per; item += gridDim.x) {
        int p = item / per, r = (item - p * per) * GEMV_WARPS + warp, e = idx[p];
        if (r >= F) continue; /* no barriers in this kernel: a warp may skip */
        /* the gate and the up row as t1_dot's two rows, one warp a row (no barrier), PG_U chunks in flight */
        bool valid = e >= 0 && e < num_experts;
        const uint16_t *wr[T1_RPW] = {valid ? experts[e].gate_w + (size_t)r * In : NULL,
                                      valid ? experts[e].up_w + (size_t)r * In : NULL};
        float acc[T1_RPW];
        t1_dot<U>(wr, valid, In, x + (size_t)(p / k) * In, 1, acc, NULL);
        float g = valid ? out_value(acc[0], round) : 0.0f, u = valid ? out_value(acc[1], round) : 0.0f;
        if (lane == 0) h[(size_t)p * F + r] = out_value(k3c_dev_gated_act(act.kind, act.beta, act.beta_lin, g, u), round);
    }
    K3C_STAMP_BLOCK_END(K3C_KID_MOE_PAIR_GATE_UP);
}

/* K: experts streamed at once (each expert's chunks in the same order at any K, the experts summed in slot
 * order: the same bits at every variant); MINB as above. */
template <int K, int MINB>
__global__ void __launch_bounds__(GEMV_WARPS * 32, MINB)
moe_pair_down_kernel(const k3c_cuda_expert *__restrict__ experts, int num_experts, const int *__restrict__ idx,
                     const float *__restrict__ weight, int T, int Out, int F, const float *__restrict__ h, int k,
                     int round, float *__restrict__ out) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_MOE_PAIR_DOWN);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, chunks = F >> 3, per = (Out + GEMV_WARPS - 1) / GEMV_WARPS;
    { /* before the wait (see above): the first expert's first chunks of this warp's first row into L2 */
        int t = blockIdx.x / per, r = (blockIdx.x - t * per) * GEMV_WARPS + warp;
        int e = blockIdx.x < T * per && r < Out ? idx[t * k] : -1;
        if (e >= 0 && e < num_experts)
            for (int i = 0; i < PD_U; i++) {
                int c = 32 * i + lane;
                if (c < chunks && (lane & 7) == 0) k3c_prefetch_l2(experts[e].down_w + (size_t)r * F + (size_t)c * 8);
            }
    }
    k3c_pdl_wait(); /* h: written by the gate/up launch */
    k3c_pdl_trigger();
    for (int item = blockIdx.x; item < T * per; item += gridDim.x) {
        int t = item / per, r = (item - t * per) * GEMV_WARPS + warp;
        if (r >= Out) continue; /* no barriers in this kernel */
        float sum = 0.0f;
        for (int j0 = 0; j0 < k; j0 += K) {
            const uint16_t *wr[K];
            const float *hr[K];
            float acc[K];
#pragma unroll
            for (int jj = 0; jj < K; jj++) {
                int j = j0 + jj, e = j < k ? idx[t * k + j] : -1;
                bool ok = e >= 0 && e < num_experts;
                wr[jj] = ok ? experts[e].down_w + (size_t)r * F : NULL;
                hr[jj] = h + (size_t)(t * k + (ok ? j : 0)) * F;
                acc[jj] = 0.0f;
            }
            for (int base = 0; base < chunks; base += 32 * PD_U) {
                uint4 v[K][PD_U];
#pragma unroll
                for (int jj = 0; jj < K; jj++)
#pragma unroll
                    for (int i = 0; i < PD_U; i++) {
                        int c = base + 32 * i + lane;
                        v[jj][i] = wr[jj] && c < chunks ? k3c_ld_stream16(wr[jj] + (size_t)c * 8) : make_uint4(0, 0, 0, 0);
                    }
#pragma unroll
                for (int jj = 0; jj < K; jj++)
#pragma unroll
                    for (int i = 0; i < PD_U; i++) {
                        int c = base + 32 * i + lane;
                        if (wr[jj] && c < chunks) {
                            const float4 *xp = (const float4 *)(hr[jj] + (size_t)c * 8);
                            acc[jj] = t1_dot8(v[jj][i], __ldg(xp), __ldg(xp + 1), acc[jj]);
                        }
                    }
            }
#pragma unroll
            for (int jj = 0; jj < K; jj++) {
                float y = k3c_warp_sum(acc[jj]); /* every lane: the same sum */
                if (wr[jj]) sum = fmaf(weight[t * k + j0 + jj], out_value(y, round), sum);
            }
        }
        if (lane == 0) out[(size_t)t * Out + r] = out_value(sum, round);
    }
    K3C_STAMP_BLOCK_END(K3C_KID_MOE_PAIR_DOWN);
}

/* MXFP4 experts at decode, one pair per expert product, for the same reason as the bf16 per-pair kernels (the
 * grouped kernel spends ~275 warp instructions per KB streamed on copies, shared loads and bookkeeping:
 * 0.43 of copy bandwidth at one token, bench_gpu moe). Item = (pair, matrix, band group) as there; a warp owns a
 * band of 16 rows and streams them straight into registers: per step lane (g, q) loads 16 bytes (scale
 * group c = 4 s + q) of rows g and g + 8 and their scale bytes, MXP_U (U) steps in flight; mx_word turns each
 * word into the A fragments and the mma takes the activations as its B column 0 (the other columns are
 * zero), so per KB streamed about 110 instructions. The pair's activation row is staged once per block in
 * shared memory as B fragments (the pairing of mx_word, up to three bf16 terms when it is not bf16-exact,
 * as in the grouped kernel), and kept while the block's next items use the same row: a block takes a
 * contiguous run of items. Sums: the MXP_U step chains in order, then the wpr warps of a row group in warp
 * order. Invalid experts: zeros (the weighted sum skips them). */
/* MXP_U: steps per run, a template parameter U below; two runs in registers (one loading while the other
 * is decoded). 2 or 3 (K3C_MOE_MXP_U; 4 spills at the 128 registers two blocks per SM allow) */
#define MXP_MAX_CHUNKS 224 /* cols / 32 the staged plane holds: 3 terms x 224 x 64 bytes = 42 KB (+ 3 KB static: under the 48 KB a launch gets without opting in) */

/* One run of MXP_U steps of a lane: 16 bytes of rows g and g + 8 per step (scale group c = 4 s + q) and
 * their scale bytes. */
template <int U>
struct mxp_run {
    uint4 wa[U], wb[U];
    uint32_t ea[U], eb[U];
};

/* PROBE (a bandwidth probe, K3C_MOE_MXP_PROBE=1, wrong results): the same bytes of the warp's 16-row band
 * read in another order, the 1 KB of a step as two 512-byte runs in lane order (every load instruction of
 * the warp contiguous, as t1_dot's are) instead of 64 bytes of each of 16 rows. It asks whether a layout
 * stored in that order (made by the repack) would stream faster; it needs full bands and rows of whole
 * steps (rows % 16 == 0, chunks % 4 == 0), which the host checks. */
template <int U, bool PROBE>
__device__ __forceinline__ void mxp_load(mxp_run<U> &r, const uint8_t *pa, const uint8_t *pb, const uint8_t *sa,
                                         const uint8_t *sb, const uint8_t *band, int base, int q, int chunks) {
    /* pa, pb, sa, sb: this lane's first bytes (piece q of the rows, scale byte q); step s at + 64 s / + 4 s.
     * A run inside the row (every step whole: warp-uniform) loads without predicates or zero fills, with
     * 32-bit offsets (the address arithmetic of the predicated form was ~27 instructions a KB). */
    if (!PROBE && (base + U) * 4 <= chunks) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const unsigned w = (unsigned)(base + u) * 64u, sc = (unsigned)(base + u) * 4u;
            r.wa[u] = k3c_ld_stream16(pa + w);
            r.wb[u] = k3c_ld_stream16(pb + w);
            r.ea[u] = (uint32_t)__ldg(sa + sc);
            r.eb[u] = (uint32_t)__ldg(sb + sc);
        }
        return;
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int c = (base + u) * 4 + q;
        const bool ok = c < chunks;
        if (PROBE) {
            const uint8_t *st = band + (size_t)(base + u) * 1024 + (threadIdx.x & 31) * 16;
            r.wa[u] = ok ? k3c_ld_stream16(st) : make_uint4(0u, 0u, 0u, 0u);
            r.wb[u] = ok ? k3c_ld_stream16(st + 512) : make_uint4(0u, 0u, 0u, 0u);
        } else {
            r.wa[u] = ok ? k3c_ld_stream16(pa + (size_t)(base + u) * 64) : make_uint4(0u, 0u, 0u, 0u);
            r.wb[u] = ok ? k3c_ld_stream16(pb + (size_t)(base + u) * 64) : make_uint4(0u, 0u, 0u, 0u);
        }
        r.ea[u] = ok ? (uint32_t)__ldg(sa + (size_t)(base + u) * 4) : 127u;
        r.eb[u] = ok ? (uint32_t)__ldg(sb + (size_t)(base + u) * 4) : 127u;
    }
}

/* The sub-steps of a run: for each 8-element sub-step, each step's two words decoded and their mma pair on
 * that step's chain d[h][u]. Sub-step outer, step inner, so that consecutive mma go to independent chains (the
 * step-outer order put each step's 8 dependent mma back to back); the sums of each chain are the same as
 * before, in the same order. BIG: the run has a scale above 2^1 somewhere in the warp (the second multiply,
 * by exactly 1 where a scale is not). B fragments: every lane loads lane (0, q)'s (a broadcast): the other
 * lanes' fragments only feed output columns 1-7, which nothing reads, so they need not be zero (the
 * predicated load and its zero fill were 3 instructions a sub-step). COLS: the staged plane's columns (1:
 * one pair, that broadcast; 8, 16 or 32: the band kernel below, lane (g, q) reading column g's fragment of
 * each of COLS / 8 mma column groups (columns g, g + 8, ...), each decoded word used by the mma pairs of
 * every group). HA: the groups computed (mxp_compute). */
template <int NT, int U, bool BIG, int COLS, int HA>
__device__ __forceinline__ void mxp_subs(const mxp_run<U> &r, const uint4 *const (&bp)[HA][U],
                                         const uint32_t (&mula)[U], const uint32_t (&mulb)[U], int chunks,
                                         float (&d)[HA][U][4]) {
#pragma unroll
    for (int sub = 0; sub < 4; sub++)
#pragma unroll
        for (int u = 0; u < U; u++) {
            const uint32_t va = sub == 0 ? r.wa[u].x : sub == 1 ? r.wa[u].y : sub == 2 ? r.wa[u].z : r.wa[u].w;
            const uint32_t vb = sub == 0 ? r.wb[u].x : sub == 1 ? r.wb[u].y : sub == 2 ? r.wb[u].z : r.wb[u].w;
            uint32_t a[4], cb[4];
            mx_word(va, mula[u], a);
            mx_word(vb, mulb[u], cb);
            if (BIG) {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    a[i] = bf16x2_mul(a[i], mx_mul2(r.ea[u]));
                    cb[i] = bf16x2_mul(cb[i], mx_mul2(r.eb[u]));
                }
            }
#pragma unroll
            for (int h = 0; h < HA; h++)
#pragma unroll
                for (int term = 0; term < NT; term++) {
                    const uint4 bq = bp[h][u][term * chunks * 4 + sub * (COLS == 1 ? 1 : 4 * COLS)];
                    k3c_mma_bf16(d[h][u], a[0], cb[0], a[1], cb[1], bq.x, bq.y);
                    k3c_mma_bf16(d[h][u], a[2], cb[2], a[3], cb[3], bq.z, bq.w);
                }
        }
}

/* Decodes a run and adds its products (one mma chain per step, then the steps in order) to acc. NT: the
 * activation's bf16 terms (1, or 3 when it is not bf16-exact), a template parameter so that the term loop
 * unrolls (a runtime loop cost a branch and a warp sync around every mma pair: the SASS of the loop was
 * ~2700 instructions per 4 KB, against ~500 of arithmetic). One warp vote a run decides the second
 * multiply (it was one a step and a branch a sub-step). ng (warp-uniform, 1..H): the column groups the tile
 * fills (a tile of nc pairs fills (nc + 7) / 8); one branch a run takes the variant computing only those
 * (HA = ng: the empty groups' mma would only feed output columns nothing writes). An mma's output column
 * depends on its B column alone, so a pair's sums are the same bits in any group, at any H and ng. */
template <int NT, int U, int COLS, int H, int HA = H>
__device__ __forceinline__ void mxp_compute(const mxp_run<U> &r, int base, int q, int chunks, const uint4 *plane,
                                            float (&acc)[H][4], const int (&bcol)[H], int ng) {
    if constexpr (HA > 1) {
        if (ng < HA) {
            mxp_compute<NT, U, COLS, H, HA - 1>(r, base, q, chunks, plane, acc, bcol, ng);
            return;
        }
    }
    float d[HA][U][4];
    const uint4 *bp[HA][U];
    uint32_t mula[U], mulb[U];
    bool big = false;
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int c = min((base + u) * 4 + q, chunks - 1);
        /* COLS > 1: the band plane [step][sub][column][q], columns bcol[h] (see moe_band_kernel) */
#pragma unroll
        for (int h = 0; h < HA; h++) {
            bp[h][u] = COLS == 1 ? plane + (size_t)c * 4
                                 : plane + ((size_t)(c >> 2) * 4 * COLS + bcol[h]) * 4 + (c & 3);
#pragma unroll
            for (int i = 0; i < 4; i++) d[h][u][i] = 0.0f;
        }
        mula[u] = mx_mul(r.ea[u]);
        mulb[u] = mx_mul(r.eb[u]);
        big = big || r.ea[u] > 128u || r.eb[u] > 128u;
    }
    if (__ballot_sync(0xffffffffu, big) != 0) mxp_subs<NT, U, true, COLS, HA>(r, bp, mula, mulb, chunks, d);
    else mxp_subs<NT, U, false, COLS, HA>(r, bp, mula, mulb, chunks, d);
#pragma unroll
    for (int h = 0; h < HA; h++)
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[h][i] += d[h][u][i];
}

/* The two-runs-in-registers loop of the streaming kernels: runs at base, base + stride, ... below steps, run
 * i + 1 loaded (load(run, base)) before run i is computed (compute(run, base)), so a warp has bytes in flight
 * while it computes; runs computed in order, so the same sums as one at a time. */
template <typename Run, typename Load, typename Compute>
__device__ __forceinline__ void stream_runs(int base, int stride, int steps, Load load, Compute compute) {
    Run r0, r1;
    if (base < steps) load(r0, base);
    while (base < steps) {
        int next = base + stride;
        if (next < steps) load(r1, next);
        compute(r0, base);
        base = next;
        if (base >= steps) break;
        next = base + stride;
        if (next < steps) load(r0, next);
        compute(r1, base);
        base = next;
    }
}

/* Streams a warp's 16-row band (rows row0 + g and row0 + g + 8 of P, S; row0 < rows) over the steps kw,
 * kw + wpr, ... in runs of U and adds the products to acc, two runs in registers (stream_runs). nterms:
 * the staged plane's bf16 terms (1, or 3 when MAXNT is 3; the choice made per run, as one loop: two loops,
 * one per term count, spilled 164 bytes of the per-pair kernel's 128 registers); COLS, bcol, ng: as
 * mxp_compute. */
template <int U, bool PROBE, int MAXNT, int COLS, int H>
__device__ __forceinline__ void mxp_stream(const uint8_t *P, const uint8_t *S, int row0, int rows, int row_bytes,
                                           int chunks, int steps, int g, int q, int kw, int wpr, const uint4 *plane,
                                           float (&acc)[H][4], const int (&bcol)[H], int ng, int nterms) {
    const int ra = min(row0 + g, rows - 1), rb = min(row0 + g + 8, rows - 1);
    const uint8_t *pa = P + (size_t)ra * row_bytes + q * 16, *pb = P + (size_t)rb * row_bytes + q * 16;
    const uint8_t *band = P + (size_t)row0 * row_bytes; /* PROBE only */
    const uint8_t *sa = S + (size_t)ra * chunks + q, *sb = S + (size_t)rb * chunks + q;
    stream_runs<mxp_run<U>>(
        kw * U, wpr * U, steps,
        [&](mxp_run<U> &r, int base) { mxp_load<U, PROBE>(r, pa, pb, sa, sb, band, base, q, chunks); },
        [&](const mxp_run<U> &r, int base) {
            if (MAXNT == 1 || nterms == 1) mxp_compute<1, U, COLS, H>(r, base, q, chunks, plane, acc, bcol, ng);
            else mxp_compute<MAXNT, U, COLS, H>(r, base, q, chunks, plane, acc, bcol, ng);
        });
}

template <int U, bool PROBE>
__global__ void __launch_bounds__(GEMV_WARPS * 32, 2)
moe_pair_mx_kernel(const k3c_cuda_expert *__restrict__ experts, int num_experts, const int *__restrict__ idx, int nm,
                   int per, int items, int rows, int cols, const float *__restrict__ x, int x_per_pair,
                   float *__restrict__ y0, float *__restrict__ y1, int wpr, int round) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_MOE_PAIR_MX);
    extern __shared__ uint4 mxp_plane[]; /* [term][chunk][sub] */
    __shared__ float part[GEMV_WARPS][2][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int groups = GEMV_WARPS / wpr, group = warp / wpr, kw = warp % wpr;
    const int chunks = cols >> 5, steps = (chunks + 3) >> 2, row_bytes = cols >> 1;
    const int per_block = (items + (int)gridDim.x - 1) / (int)gridDim.x;
    const int i0 = (int)blockIdx.x * per_block, i1 = min(items, i0 + per_block);
    const float *staged = nullptr;
    int nterms = 1;
    for (int item = i0; item < i1; item++) {
        const int mat = item / per, p = mat / nm, m = mat % nm, e = idx[p], local = item - mat * per;
        const int row0 = (local * groups + group) * 16;
        float *yp = (m == 0 ? y0 : y1) + (size_t)p * rows;
        if (e < 0 || e >= num_experts) { /* block-uniform */
            if (kw == 0 && q == 0) {
                if (row0 + g < rows) yp[row0 + g] = 0.0f;
                if (row0 + g + 8 < rows) yp[row0 + g + 8] = 0.0f;
            }
            continue;
        }
        const float *xp = x + (size_t)(p / x_per_pair) * cols;
        if (xp != staged) { /* block-uniform: stage this row's B fragments (entry (term, c, sub): the pairs
                             * (j, j + 4) of elements 8 sub .. 8 sub + 7 of group c, term `term`) */
            __syncthreads(); /* every warp is done with the previous plane */
            bool inexact = false;
            for (int it = threadIdx.x; it < chunks * 4; it += blockDim.x) {
                const float *xr = xp + (it >> 2) * 32 + 8 * (it & 3);
                float4 a = __ldg((const float4 *)xr), b = __ldg((const float4 *)xr + 1);
                float lo[4] = {a.x, a.y, a.z, a.w}, hi[4] = {b.x, b.y, b.z, b.w};
                uint32_t t[4][3];
#pragma unroll
                for (int j = 0; j < 4; j++) inexact |= k3c_split3(lo[j], hi[j], t[j]);
#pragma unroll
                for (int term = 0; term < 3; term++)
                    mxp_plane[term * chunks * 4 + it] = make_uint4(t[0][term], t[1][term], t[2][term], t[3][term]);
            }
            nterms = __syncthreads_or(inexact) ? 3 : 1;
            staged = xp;
        }
        const k3c_cuda_expert &ex = experts[e];
        const uint8_t *P = nm == 1 ? ex.down_packed : m == 0 ? ex.gate_packed : ex.up_packed;
        const uint8_t *S = nm == 1 ? ex.down_scale : m == 0 ? ex.gate_scale : ex.up_scale;
        float acc2[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
        float(&acc)[4] = acc2[0];
        const int col0[1] = {0};
        if (row0 < rows)
            mxp_stream<U, PROBE, 3, 1, 1>(P, S, row0, rows, row_bytes, chunks, steps, g, q, kw, wpr, mxp_plane, acc2,
                                          col0, 1, nterms);
        /* column 0 of the product: lane (g, 0)'s acc[0] is row g, acc[2] row g + 8 */
        if (wpr > 1) {
            part[warp][0][lane] = acc[0];
            part[warp][1][lane] = acc[2];
            __syncthreads();
            if (kw == 0) {
                float s0 = 0.0f, s1 = 0.0f;
                for (int j = 0; j < wpr; j++) {
                    s0 += part[warp + j][0][lane];
                    s1 += part[warp + j][1][lane];
                }
                acc[0] = s0;
                acc[2] = s1;
            }
        }
        if (kw == 0 && q == 0) {
            if (row0 + g < rows) yp[row0 + g] = out_value(acc[0], round);
            if (row0 + g + 8 < rows) yp[row0 + g + 8] = out_value(acc[2], round);
        }
        if (wpr > 1) __syncthreads();
    }
    K3C_STAMP_BLOCK_END(K3C_KID_MOE_PAIR_MX);
}

/* A per-pair launch's plan: `units` row groups of one matrix with `runs` load runs along a row, `matrices`
 * (pairs x matrices per pair) of them. The split of a row (wpr, warps per row) is `wpr` (halved while a
 * row has fewer runs than warps), or K3C_MOE_MXP_WPR's when that is set (force_wpr); per = items (blocks'
 * shares) of one matrix; the grid is what stays resident.
 *
 * The launchers pass 1 for MXFP4 and 2 for the bf16 band kernel. 2026-11-30 (H200, k3c bench SPEC,
 * context 64) swept K3C_MOE_MXP_WPR over plan_grid's choice (0) and 1, 2, 4, 8: k3-slice (MXFP4) b=1 / 8 /
 * 16 / 32 / 64 6.03 / 12.32 / 12.57-13.11 / 16.54-17.25 / 24.40-24.84 ms with plan_grid's choice, 5.94 /
 * 11.37-11.43 / 11.84 / 15.33-15.35 / 22.59-22.64 with 1 (two rounds; 2, 4, 8 slower); kimi-linear-48b (bf16
 * band) b=16 / 32 / 64 15.22 / 20.95 / 28.20 with plan_grid's choice, 14.74 / 19.89 / 27.25 with 2 (1: 14.74
 * / 20.46 / 27.81). A warp owning whole rows needs no cross-warp sum (two block barriers an item) and keeps
 * its loads running along a row; plan_grid's wave arithmetic preferred splitting rows. */
typedef struct pair_plan {
    int wpr, per, items, grid;
} pair_plan;

static pair_plan plan_pairs(int units, int runs, int matrices, int cap, int wpr, int force_wpr) {
    pair_plan p;
    /* a forced wpr (K3C_MOE_MXP_WPR, an A/B knob) is taken as it is: no row has fewer than GEMV_WARPS runs */
    if (force_wpr > 0) p.wpr = plan_split(units, GEMV_WARPS, force_wpr, &p.per);
    else p.wpr = plan_split(units, runs, wpr, &p.per);
    p.items = p.per * matrices;
    p.grid = p.items < cap ? p.items : cap;
    return p;
}

template <int U, bool PROBE>
static int moe_pair_mx_launch_u(const k3c_cuda_expert *experts, int num_experts, const int *idx, int pairs, int nm,
                                int rows, int cols, const float *x, int x_per_pair, float *y0, float *y1, int round,
                                int force_wpr, cudaStream_t s) {
    static int occ;
    size_t smem = (size_t)3 * (cols >> 5) * 4 * sizeof(uint4);
    if (!occ) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, moe_pair_mx_kernel<U, PROBE>, GEMV_WARPS * 32,
                                                          (size_t)3 * MXP_MAX_CHUNKS * 4 * sizeof(uint4)) !=
                cudaSuccess ||
            occ < 1)
            occ = 1;
    }
    int steps = ((cols >> 5) + 3) >> 2;
    pair_plan pp =
        plan_pairs((rows + 15) / 16, (steps + U - 1) / U, pairs * nm, occ * k3c_cuda_sm_count(), 1, force_wpr);
    moe_pair_mx_kernel<U, PROBE><<<pp.grid, GEMV_WARPS * 32, smem, s>>>(experts, num_experts, idx, nm, pp.per,
                                                                        pp.items, rows, cols, x, x_per_pair, y0, y1,
                                                                        pp.wpr, round);
    K3C_CUDA_LAUNCHED("moe_pair_mx");
    return K3C_OK;
}

extern "C" int k3c_cuda_moe_pair_mx_fits(int In, int F) { return In / 32 <= MXP_MAX_CHUNKS && F / 32 <= MXP_MAX_CHUNKS; }

/* A/B knobs, read once: K3C_MOE_MXP_U (steps per run: 3, else 2, the kernel measured 2026-11-30), K3C_MOE_MXP_WPR
 * (warps per row: 1, 2, 4 or 8; else plan_pairs' choice) and K3C_MOE_MXP_PROBE=1 (the bandwidth probe
 * above: wrong results, benchmarks only). None of them moves the kernel (2026-11-30,
 * `K3C_MOE_PAIR_MX=1 bench_gpu moe`, moe_mxfp4_all_T1_k16 as fraction of copy bandwidth: default 0.499,
 * U 3 0.498, WPR 1 0.516, WPR 2 0.484; U 1 with 3 or 4 blocks per SM in the launch bounds (77 / 64
 * registers instead of 105) 0.451 / 0.484, U 2 with 3 blocks 0.490). Nsight Compute had it at 14.5 warps per
 * SM, one instruction issued every 1.7 cycles per scheduler, DRAM at 41-52% of peak and L2 at 68%: neither
 * more warps nor more bytes in flight help, so the next step is the access pattern (docs/kernels.md). */
static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && v[0] ? atoi(v) : dflt;
}
extern "C" int k3c_cuda_moe_pair_mx(const k3c_cuda_expert *experts, int num_experts, const int *idx, int pairs,
                                    int nm, int rows, int cols, const float *x, int x_per_pair, float *y0, float *y1,
                                    int round, cudaStream_t s) {
    static int u = -1, force_wpr, probe;
    if (u < 0) {
        u = env_int("K3C_MOE_MXP_U", 2) == 3 ? 3 : 2;
        force_wpr = forced_wpr_from_env("K3C_MOE_MXP_WPR");
        probe = env_int("K3C_MOE_MXP_PROBE", 0) == 1;
    }
    if (probe && rows % 16 == 0 && (cols >> 5) % 4 == 0)
        return moe_pair_mx_launch_u<2, true>(experts, num_experts, idx, pairs, nm, rows, cols, x, x_per_pair, y0, y1,
                                             round, force_wpr, s);
    return (u == 3 ? moe_pair_mx_launch_u<3, false> : moe_pair_mx_launch_u<2, false>)(
        experts, num_experts, idx, pairs, nm, rows, cols, x, x_per_pair, y0, y1, round, force_wpr, s);
}

/* MXFP4 experts by expert band, for more pairs than the per-pair path takes (decode at several tokens): the
 * per-pair kernel reads an expert once per pair that chose it, the grouped kernel (moe.cu) once per expert
 * but at ~275 instructions per KB of bookkeeping (0.45 of copy bandwidth at 8 tokens, 0.26 at 64). Here the
 * per-pair kernel's register streaming and decode (mxp_load, mxp_compute: the same instructions per byte)
 * run over each selected expert once, and the mma's 8 B columns, which the per-pair kernel leaves empty,
 * carry up to MXB_COLS pairs of that expert (a "tile"; MXFP4 with many pairs an expert takes tiles of 16 or
 * 32: two or four mma column groups share each decoded A fragment). An expert with more pairs than a tile
 * has more tiles, each streaming the expert again, from HBM: its next tile's items are a tile's worth of
 * items further on, which the blocks' contiguous runs reach a large part of a launch later. The lane (g, q)
 * that holds output column 8h + 2q, 8h + 2q + 1 of group h writes those pairs' rows.
 *
 * moe_band_lists_kernel (one block) sorts the pairs by (expert, pair) and writes the tile table: a tile is
 * an expert id, the offset of its pairs in the sorted list and their count (<= the tile width); pairs with an
 * expert outside [0, num_experts) sort last and get no tile: the band kernel writes their rows as 0 (the
 * per-pair kernel's zeros). The table lives in the caller's scratch (k3c_cuda_moe_experts: its `out`, written only by the
 * combine after both band launches). Item = (tile, matrix, band group), as the per-pair kernel's (pair,
 * matrix, band group); the item count is read from the table, so the grid (the resident blocks) is fixed
 * while the work follows the routing, and each block takes a contiguous run of items, keeping a tile's
 * staged activations while its next items share the tile. Staging: column c of the plane is pair c's
 * activation row split into bf16 terms (one term staged at a time: for activations that are not bf16
 * values, the f32 reference mode, the band streams once per term, adding each term's products in term
 * order). Each pair's sums are those of a column of the mma, independent of the other columns. */
#define MXB_COLS 8     /* a tile's pairs: the mma's 8 B columns */
#define MXB_COLS_WIDE 16 /* MXFP4 with many pairs an expert: two column groups, each decoded word used twice */
#define MXB_COLS_MAX 32  /* the same where the plane fits (K3's 3584 exactly): four groups, up to 32 pairs a pass */
#define MXB_SMEM_MAX (227 * 1024) /* a block's dynamic shared memory at most (H100 / H200, opted in) */
/* bytes of a band block's partial sums ([GEMV_WARPS][4 x column groups][32] floats) when rows are split */
#define MXB_PART_BYTES(NC) ((size_t)GEMV_WARPS * 4 * ((NC) / MXB_COLS) * 32 * sizeof(float))
#define MXB_MAX_PAIRS 1024   /* the list kernel's block: one pair a thread */
#define MXB_MAX_CHUNKS 192   /* MXFP4 plane: chunks x 4 subs x 8 x 16 bytes = 96 KB: two blocks per SM */
/* the most chunks of a row: a bf16 chunk (8 weights) stages one sub-step, a quarter of an MXFP4 chunk's
 * plane, so the same 96 KB hold 768 (a row of 6144; Kimi Linear's 2304 is 288) */
#define MXB_MAX_CHUNKS_OF(mx) ((mx) ? MXB_MAX_CHUNKS : 4 * MXB_MAX_CHUNKS)

__global__ void __launch_bounds__(MXB_MAX_PAIRS)
moe_band_lists_kernel(const int *__restrict__ idx, int pairs, int num_experts, int tile_cols, int *__restrict__ lists) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_MOE_BAND_LISTS);
    __shared__ uint32_t key[MXB_MAX_PAIRS];
    __shared__ int scan[MXB_MAX_PAIRS];
    const int t = threadIdx.x, n = blockDim.x; /* n: a power of two >= pairs */
    int *tile_e = lists + 2, *tile_off = tile_e + pairs, *tile_n = tile_off + pairs, *plist = tile_n + pairs;
    /* key = (expert, or num_experts for an invalid one) << 11 | pair; padding sorts last */
    if (t < pairs) {
        const int e = idx[t];
        key[t] = ((uint32_t)(e >= 0 && e < num_experts ? e : num_experts) << 11) | (uint32_t)t;
    } else {
        key[t] = 0xffffffffu;
    }
    __syncthreads();
    for (int size = 2; size <= n; size <<= 1) /* bitonic sort, ascending */
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            const int o = t ^ stride;
            if (o > t) {
                const uint32_t a = key[t], b = key[o];
                const bool up = (t & size) == 0;
                if ((a > b) == up) {
                    key[t] = b;
                    key[o] = a;
                }
            }
            __syncthreads();
        }
    /* position t starts a tile when it is valid and starts an expert's run, or lies a multiple of tile_cols
     * into it; the run's start comes from a prefix max of run starts, the tile's index from a prefix sum */
    const uint32_t kt = key[t];
    const int et = (int)(kt >> 11);
    const bool valid = t < pairs && et < num_experts;
    const bool run_start = valid && (t == 0 || (int)(key[t - 1] >> 11) != et);
    scan[t] = run_start ? t : 0;
    __syncthreads();
    for (int o = 1; o < n; o <<= 1) { /* inclusive prefix max */
        const int v = t >= o ? scan[t - o] : 0;
        __syncthreads();
        if (v > scan[t]) scan[t] = v;
        __syncthreads();
    }
    const int rs = scan[t];
    const bool tile_start = valid && (t - rs) % tile_cols == 0;
    __syncthreads();
    scan[t] = tile_start ? 1 : 0;
    __syncthreads();
    for (int o = 1; o < n; o <<= 1) { /* inclusive prefix sum */
        const int v = t >= o ? scan[t - o] : 0;
        __syncthreads();
        scan[t] += v;
        __syncthreads();
    }
    if (t < pairs) plist[t] = (int)(kt & 2047u); /* the invalid pairs last, from lists[1] on */
    if (t < pairs && valid && (t == pairs - 1 || (int)(key[t + 1] >> 11) >= num_experts)) lists[1] = t + 1;
    if (t == 0 && !valid) lists[1] = 0;
    if (tile_start) {
        int c = 1;
        while (c < tile_cols && t + c < pairs && (int)(key[t + c] >> 11) == et) c++;
        const int ti = scan[t] - 1;
        tile_e[ti] = et;
        tile_off[ti] = t;
        tile_n[ti] = c;
    }
    if (t == n - 1) lists[0] = scan[t];
    K3C_STAMP_BLOCK_END(K3C_KID_MOE_BAND_LISTS);
}

/* bf16 experts by band (moe_band_kernel<false>): lane (g, q) streams 16-byte chunk 4 s + q (8 weights) of
 * rows g and g + 8 at step s, U steps a run, and each chunk is two mma as it stands in memory: weights
 * (2j, 2j + 1) are the A word j (j = 0, 1 the first mma's k-low / k-high halves, 2, 3 the second's), and the
 * staged plane entry of (step, column, q) holds the activations in the same pairs. No decode, so about a
 * tenth of the MXFP4 band kernel's instructions per byte. Chunks past the row: zero weights (the loads'
 * fill) against a staged entry (the clamp), so they add nothing. bfb_run: a run's loaded chunks. */
template <int U>
struct bfb_run {
    uint4 wa[U], wb[U];
};

template <int U>
__device__ __forceinline__ void bfb_load(bfb_run<U> &r, const uint8_t *pa, const uint8_t *pb, int base, int q,
                                         int chunks) {
    if ((base + U) * 4 <= chunks) { /* a run inside the row: unpredicated */
#pragma unroll
        for (int u = 0; u < U; u++) {
            r.wa[u] = k3c_ld_stream16(pa + (unsigned)(base + u) * 64u);
            r.wb[u] = k3c_ld_stream16(pb + (unsigned)(base + u) * 64u);
        }
        return;
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
        const bool ok = (base + u) * 4 + q < chunks;
        r.wa[u] = ok ? k3c_ld_stream16(pa + (size_t)(base + u) * 64) : make_uint4(0u, 0u, 0u, 0u);
        r.wb[u] = ok ? k3c_ld_stream16(pb + (size_t)(base + u) * 64) : make_uint4(0u, 0u, 0u, 0u);
    }
}

template <int U>
__device__ __forceinline__ void bfb_compute(const bfb_run<U> &r, int base, int q, int chunks, const uint4 *plane,
                                            int bcol, float (&acc)[4]) {
    float d[U][4];
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int c = min((base + u) * 4 + q, chunks - 1);
        const uint4 bq = plane[((c >> 2) * MXB_COLS + bcol) * 4 + (c & 3)];
#pragma unroll
        for (int i = 0; i < 4; i++) d[u][i] = 0.0f;
        k3c_mma_bf16(d[u], r.wa[u].x, r.wb[u].x, r.wa[u].y, r.wb[u].y, bq.x, bq.y);
        k3c_mma_bf16(d[u], r.wa[u].z, r.wb[u].z, r.wa[u].w, r.wb[u].w, bq.z, bq.w);
    }
#pragma unroll
    for (int u = 0; u < U; u++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[i] += d[u][i];
}

/* The bf16 band of a warp (rows row0 + g, row0 + g + 8 of P; row0 < rows) over steps kw, kw + wpr, ...: two
 * runs in registers (stream_runs), as mxp_stream. */
template <int U>
__device__ __forceinline__ void bfb_stream(const uint8_t *P, int row0, int rows, int row_bytes, int chunks, int steps,
                                           int g, int q, int kw, int wpr, const uint4 *plane, float (&acc)[4],
                                           int bcol) {
    const int ra = min(row0 + g, rows - 1), rb = min(row0 + g + 8, rows - 1);
    const uint8_t *pa = P + (size_t)ra * row_bytes + q * 16, *pb = P + (size_t)rb * row_bytes + q * 16;
    stream_runs<bfb_run<U>>(
        kw * U, wpr * U, steps, [&](bfb_run<U> &r, int base) { bfb_load<U>(r, pa, pb, base, q, chunks); },
        [&](const bfb_run<U> &r, int base) { bfb_compute<U>(r, base, q, chunks, plane, bcol, acc); });
}

/* MX: MXFP4 experts (chunks of 32 weights: 16 packed bytes and a scale; 4 sub-steps of 8 a chunk), else bf16
 * (chunks of 8 weights, bfb_stream above); U steps a run. NC: a tile's columns, MXB_COLS, or MXFP4 only
 * MXB_COLS_WIDE / MXB_COLS_MAX: the plane 2 / 4 times as wide (one block per SM at K3's 3584: 112 / 224 KB),
 * each lane reading columns g, g + 8 (, g + 16, g + 24), so an expert with up to 16 / 32 pairs is streamed
 * and decoded once; a tile of fewer pairs computes only the groups it fills (mxp_compute), so at up to 16
 * pairs the 32-column kernel does the 16-column one's work. Registers (ptxas, sm_90a, nvcc 13.0): 125 at 8
 * columns (MINB 2), 207 at 16, 248 at 32 (MINB 1, 8 staged entries a thread), no spills. */
template <bool MX, int U, int NC, int MINB, int STG>
__global__ void __launch_bounds__(GEMV_WARPS * 32, MINB)
moe_band_kernel(const k3c_cuda_expert *__restrict__ experts, const int *__restrict__ lists, int pairs, int nm,
                int per, int rows, int cols, const float *__restrict__ x, int x_per_pair, float *__restrict__ y0,
                float *__restrict__ y1, int wpr, int round) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_MOE_BAND);
    /* [step][sub][column][q] (bf16: one sub): one bf16 term. Lane (g, q) reads column g of its step and
     * sub-step, or column 0 when the tile has no column g (those output columns are never written): with one
     * column the four q entries of a read lie in 64 contiguous bytes, one shared-memory wavefront, as the
     * per-pair kernel's broadcast (the [chunk][sub][column] layout put them 512 bytes apart: four wavefronts
     * at any width). */
    constexpr int SUBS = MX ? 4 : 1, H = NC / MXB_COLS;
    static_assert(NC == MXB_COLS || (MX && (NC == MXB_COLS_WIDE || NC == MXB_COLS_MAX)), "bf16 bands take 8 columns");
    extern __shared__ uint4 mxb_plane[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int groups = GEMV_WARPS / wpr, group = warp / wpr, kw = warp % wpr;
    const int chunks = MX ? cols >> 5 : cols >> 3, steps = (chunks + 3) >> 2, row_bytes = MX ? cols >> 1 : cols * 2;
    /* [GEMV_WARPS][4 H][32] partial sums of a row split over wpr > 1 warps, after the plane in the dynamic
     * shared memory, which holds them only when wpr > 1 can occur (moe_band_launch): at one warp a row (the
     * MXFP4 default) they take no room from the blocks an SM */
    float *part = (float *)(mxb_plane + (size_t)steps * 4 * SUBS * NC);
    const int *tile_e = lists + 2, *tile_off = tile_e + pairs, *tile_n = tile_off + pairs, *plist = tile_n + pairs;
    for (int i = lists[1] + blockIdx.x; i < pairs; i += gridDim.x) { /* invalid experts: their rows are 0 */
        const size_t p = (size_t)plist[i];
        for (int r = threadIdx.x; r < rows; r += blockDim.x) {
            y0[p * rows + r] = 0.0f;
            if (nm == 2) y1[p * rows + r] = 0.0f;
        }
    }
    const int items = lists[0] * nm * per;
    const int per_block = (items + (int)gridDim.x - 1) / (int)gridDim.x;
    const int i0 = (int)blockIdx.x * per_block, i1 = min(items, i0 + per_block);
    int staged_tile = -1, staged_term = -1, nterms = 1;
    for (int item = i0; item < i1; item++) {
        const int mat = item / per, tile = mat / nm, m = mat % nm, local = item - mat * per;
        const int row0 = (local * groups + group) * 16;
        const int e = tile_e[tile], off = tile_off[tile], nc = tile_n[tile];
        const int ng = (nc + MXB_COLS - 1) / MXB_COLS; /* the column groups the tile fills (mxp_subs) */
        int bcol[H]; /* the plane columns this lane reads (see the plane above) */
#pragma unroll
        for (int h = 0; h < H; h++) bcol[h] = g + 8 * h < nc ? g + 8 * h : 0;
        const k3c_cuda_expert &ex = experts[e];
        const uint8_t *P = MX ? (nm == 1 ? ex.down_packed : m == 0 ? ex.gate_packed : ex.up_packed)
                              : (const uint8_t *)(nm == 1 ? ex.down_w : m == 0 ? ex.gate_w : ex.up_w);
        const uint8_t *S = MX ? (nm == 1 ? ex.down_scale : m == 0 ? ex.gate_scale : ex.up_scale) : NULL;
        float acc[H][4];
#pragma unroll
        for (int h = 0; h < H; h++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[h][i] = 0.0f;
        for (int term = 0; term < nterms; term++) {
            if (tile != staged_tile || term != staged_term) { /* block-uniform */
                __syncthreads(); /* every warp is done with the previous plane */
                bool inexact = false;
                /* only the tile's nc columns: the others feed output columns nothing writes (stale entries
                 * are harmless, as the per-pair kernel's). STG entries a thread at once, their loads
                 * issued before any is used: one strided entry at a time, each thread's loads waited one
                 * after another (14 round trips a thread for a K3 row at one column), and bench_gpu moe measured the
                 * band kernel at one token 0.435 of copy bandwidth against the per-pair kernel's 0.581 on the
                 * same work. */
                const int total = chunks * SUBS * nc;
                for (int i0 = threadIdx.x; i0 < total; i0 += STG * blockDim.x) {
                    float4 va[STG], vb[STG];
#pragma unroll
                    for (int j = 0; j < STG; j++) {
                        const int i = i0 + j * blockDim.x;
                        if (i < total) {
                            const int col = i % nc, cs = i / nc; /* cs: chunk cs / SUBS, sub-step cs % SUBS */
                            const float *xr = x + (size_t)(plist[off + col] / x_per_pair) * cols +
                                              (MX ? (cs >> 2) * 32 + 8 * (cs & 3) : cs * 8);
                            va[j] = __ldg((const float4 *)xr);
                            vb[j] = __ldg((const float4 *)xr + 1);
                        }
                    }
#pragma unroll
                    for (int j = 0; j < STG; j++) {
                        const int i = i0 + j * blockDim.x;
                        if (i >= total) break;
                        const int col = i % nc, cs = i / nc;
                        /* the pairs of mx_word's A words (j, j + 4), or of bf16 words as stored (2j, 2j + 1) */
                        float lo[4], hi[4];
                        if (MX) {
                            lo[0] = va[j].x, lo[1] = va[j].y, lo[2] = va[j].z, lo[3] = va[j].w;
                            hi[0] = vb[j].x, hi[1] = vb[j].y, hi[2] = vb[j].z, hi[3] = vb[j].w;
                        } else {
                            lo[0] = va[j].x, hi[0] = va[j].y, lo[1] = va[j].z, hi[1] = va[j].w;
                            lo[2] = vb[j].x, hi[2] = vb[j].y, lo[3] = vb[j].z, hi[3] = vb[j].w;
                        }
                        uint32_t tt[4][3];
#pragma unroll
                        for (int k = 0; k < 4; k++) inexact |= k3c_split3(lo[k], hi[k], tt[k]);
                        const int c = cs / SUBS, sub = cs % SUBS;
                        mxb_plane[(((c >> 2) * SUBS + sub) * NC + col) * 4 + (c & 3)] =
                            term == 0   ? make_uint4(tt[0][0], tt[1][0], tt[2][0], tt[3][0])
                            : term == 1 ? make_uint4(tt[0][1], tt[1][1], tt[2][1], tt[3][1])
                                        : make_uint4(tt[0][2], tt[1][2], tt[2][2], tt[3][2]);
                    }
                }
                const bool any = __syncthreads_or(inexact);
                if (term == 0) nterms = any ? 3 : 1;
                staged_tile = tile;
                staged_term = term;
            }
            if (row0 < rows) {
                if constexpr (MX)
                    mxp_stream<U, false, 1, NC, H>(P, S, row0, rows, row_bytes, chunks, steps, g, q, kw, wpr,
                                                   mxb_plane, acc, bcol, ng, 1);
                else
                    bfb_stream<U>(P, row0, rows, row_bytes, chunks, steps, g, q, kw, wpr, mxb_plane, acc[0], bcol[0]);
            }
        }
        /* lane (g, q): rows g, g + 8 of columns 8h + 2q, 8h + 2q + 1 (acc[h][0], acc[h][1]; acc[h][2],
         * acc[h][3]) */
        if (wpr > 1) {
#pragma unroll
            for (int h = 0; h < H; h++)
#pragma unroll
                for (int i = 0; i < 4; i++) part[(warp * 4 * H + 4 * h + i) * 32 + lane] = acc[h][i];
            __syncthreads();
            if (kw == 0)
#pragma unroll
                for (int h = 0; h < H; h++)
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        float s = 0.0f;
                        for (int j = 0; j < wpr; j++) s += part[((warp + j) * 4 * H + 4 * h + i) * 32 + lane];
                        acc[h][i] = s;
                    }
        }
        if (kw == 0)
#pragma unroll
            for (int h = 0; h < H; h++)
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int col = 8 * h + 2 * q + hh;
                    if (col >= nc) continue;
                    float *yp = (m == 0 ? y0 : y1) + (size_t)plist[off + col] * rows;
                    if (row0 + g < rows) yp[row0 + g] = out_value(acc[h][hh], round);
                    if (row0 + g + 8 < rows) yp[row0 + g + 8] = out_value(acc[h][2 + hh], round);
                }
        if (wpr > 1) __syncthreads();
    }
    K3C_STAMP_BLOCK_END(K3C_KID_MOE_BAND);
}

extern "C" int k3c_cuda_moe_band_fits(int mxfp4, int In, int F, int pairs) {
    const int per = mxfp4 ? 32 : 8; /* weights a chunk */
    return pairs >= 1 && pairs <= MXB_MAX_PAIRS && In / per <= MXB_MAX_CHUNKS_OF(mxfp4) &&
           F / per <= MXB_MAX_CHUNKS_OF(mxfp4);
}

extern "C" size_t k3c_cuda_moe_band_lists_ints(int pairs) { return 2 + 4 * (size_t)pairs; }

/* K3C_MOE_MXP_WPR (an A/B knob, read once): the warps a row of the band kernels, else their default (1 for
 * MXFP4, 2 for bf16); plan_pairs takes a forced count and may lower the default, never raise it. */
static int band_forced_wpr(void) {
    static int v = -1;
    if (v < 0) v = forced_wpr_from_env("K3C_MOE_MXP_WPR");
    return v;
}
static int band_wpr_max(bool mx) { return band_forced_wpr() > 0 ? band_forced_wpr() : mx ? 1 : 2; }

/* A band launch's dynamic shared memory for rows of `cols` at nc columns a tile: the plane (whole steps of 4
 * chunks: [step][sub][column][q]) and, where a row can be split (wpr_max > 1), the partial sums. */
static size_t band_smem(bool mx, int cols, int nc, int wpr_max) {
    const int chunks = mx ? cols >> 5 : cols >> 3, steps = (chunks + 3) >> 2, subs = mx ? 4 : 1;
    return (size_t)steps * 4 * subs * nc * sizeof(uint4) + (wpr_max > 1 ? MXB_PART_BYTES(nc) : 0);
}

/* The tile width for `pairs` pairs over num_experts with rows of In (gate/up) and F (down): for MXFP4 when the
 * pairs average more than 8 an expert (k3-slice at b = 64: 1024 pairs over 64 experts), MXB_COLS_MAX where its
 * plane fits both widths (K3's 3584 x 3072: 224 and 192 KB), else MXB_COLS_WIDE; otherwise MXB_COLS. Each tile
 * streams and decodes its expert once, so an expert's pairs past a tile's width cost another pass over its
 * weights (at b = 64, 16 of 64 experts a token: ~16 pairs an expert, and under uniform routing 1.43 passes an
 * expert at tiles of 16, 1.00 at 32; a second pass starts a third of a launch later, when L2 no longer holds
 * the first's bytes). The wide kernels run one block (8 warps) an SM: the 16-column one at 0.25-0.34 of copy
 * bandwidth where the 8-column one reads 0.50-0.58 (bench_gpu moe, 2026-11-30), so they pay only where most
 * experts have more than 8 pairs: 16 columns past 4 an expert took k3-slice b=64 23.35/22.58 -> 22.05/21.79 ms
 * but b=32 (8 an expert) 15.23/15.31 -> 16.07/16.09. The 32-column kernel does the 16-column one's work on a
 * tile of up to 16 pairs (the empty groups' mma are left out, mxp_subs), so it replaces it where it fits.
 * K3C_MOE_BAND_COLS=8 / 16 / 32, or k3c_cuda_moe_band_cols_force, forces a width (A/B runs and tests; 16 and 32
 * only for MXFP4, 32 only where it fits, else 16). */
static int band_cols_forced; /* k3c_cuda_moe_band_cols_force (tests); 0: not forced */
extern "C" int k3c_cuda_moe_band_cols_force(int cols) {
    if (cols != 0 && cols != MXB_COLS && cols != MXB_COLS_WIDE && cols != MXB_COLS_MAX)
        return k3c_errorf("k3c_cuda_moe_band_cols_force: %d columns (%d, %d, %d, or 0 for the default)", cols,
                          MXB_COLS, MXB_COLS_WIDE, MXB_COLS_MAX);
    band_cols_forced = cols;
    return K3C_OK;
}

extern "C" int k3c_cuda_moe_band_cols(int mxfp4, int pairs, int num_experts, int In, int F) {
    static int env = -1;
    if (env < 0) {
        env = env_int("K3C_MOE_BAND_COLS", 0);
        if (env != MXB_COLS && env != MXB_COLS_WIDE && env != MXB_COLS_MAX) env = 0;
    }
    if (!mxfp4) return MXB_COLS;
    const int wpr_max = band_wpr_max(true);
    const bool max_fits = band_smem(true, In, MXB_COLS_MAX, wpr_max) <= MXB_SMEM_MAX &&
                          band_smem(true, F, MXB_COLS_MAX, wpr_max) <= MXB_SMEM_MAX;
    int force = band_cols_forced ? band_cols_forced : env;
    if (!force) force = pairs > 8 * num_experts ? MXB_COLS_MAX : MXB_COLS;
    return force == MXB_COLS_MAX && !max_fits ? MXB_COLS_WIDE : force;
}

extern "C" int k3c_cuda_moe_band_lists(const int *idx, int pairs, int num_experts, int tile_cols, int *lists,
                                       cudaStream_t s) {
    if (pairs < 1 || pairs > MXB_MAX_PAIRS || num_experts < 1 || num_experts >= (1 << 20))
        return k3c_errorf("moe band lists: %d pairs over %d experts (1..%d pairs, < 2^20 experts)", pairs, num_experts,
                          MXB_MAX_PAIRS);
    if (tile_cols != MXB_COLS && tile_cols != MXB_COLS_WIDE && tile_cols != MXB_COLS_MAX)
        return k3c_errorf("moe band lists: tiles of %d pairs (%d, %d or %d)", tile_cols, MXB_COLS, MXB_COLS_WIDE,
                          MXB_COLS_MAX);
    int n = 32;
    while (n < pairs) n <<= 1;
    moe_band_lists_kernel<<<1, n, 0, s>>>(idx, pairs, num_experts, tile_cols, lists);
    K3C_CUDA_LAUNCHED("moe_band_lists");
    return K3C_OK;
}

/* Resident blocks of a band kernel at `smem` bytes of plane (a few sizes occur: a model's In and F): found
 * once per size, under a lock (rank threads launch at once; a torn entry would give one rank another plan).
 * The kernel's shared memory limit is raised once per device (k3c_cuda_moe_pair_limits). */
template <bool MX, int U, int NC, int MINB, int STG>
static int band_occupancy(size_t smem) {
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static size_t sizes[4];
    static int occs[4], n;
    if (k3c_cuda_kernels_prepare() != K3C_OK) return 0;
    pthread_mutex_lock(&lock);
    int occ = 0;
    for (int i = 0; i < n && !occ; i++)
        if (sizes[i] == smem) occ = occs[i];
    if (!occ) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, moe_band_kernel<MX, U, NC, MINB, STG>,
                                                          GEMV_WARPS * 32, smem) != cudaSuccess ||
            occ < 1)
            occ = 1;
        if (n < 4) sizes[n] = smem, occs[n] = occ, n++;
    }
    pthread_mutex_unlock(&lock);
    return occ;
}

/* A band kernel's limit: what its widest rows can ask (kernel_limits.h). */
template <bool MX, int U, int NC, int MINB, int STG>
static int band_limit(void) {
    const size_t widest = (size_t)MXB_MAX_CHUNKS * 4 * NC * sizeof(uint4) + MXB_PART_BYTES(NC);
    K3C_CUDA_TRY(k3c_cuda_smem_limit((const void *)moe_band_kernel<MX, U, NC, MINB, STG>,
                                     widest < MXB_SMEM_MAX ? widest : MXB_SMEM_MAX));
    return K3C_OK;
}

/* Every band kernel k3c_cuda_moe_band instantiates (below). */
extern "C" int k3c_cuda_moe_pair_limits(void) {
    K3C_TRY((band_limit<false, 3, MXB_COLS, 2, 4>()));
    K3C_TRY((band_limit<false, 3, MXB_COLS, 2, 2>()));
    K3C_TRY((band_limit<true, 2, MXB_COLS, 2, 4>()));
    K3C_TRY((band_limit<true, 2, MXB_COLS, 2, 2>()));
    K3C_TRY((band_limit<true, 2, MXB_COLS_MAX, 1, 8>()));
    K3C_TRY((band_limit<true, 2, MXB_COLS_WIDE, 1, 2>()));
    K3C_TRY((band_limit<true, 2, MXB_COLS_WIDE, 1, 8>()));
    return K3C_OK;
}

template <bool MX, int U, int NC, int MINB, int STG>
static int moe_band_launch(const k3c_cuda_expert *experts, int num_experts, const int *lists, int pairs, int nm,
                           int rows, int cols, const float *x, int x_per_pair, float *y0, float *y1, int round,
                           cudaStream_t s) {
    const int force_wpr = band_forced_wpr();
    const int chunks = MX ? cols >> 5 : cols >> 3, steps = (chunks + 3) >> 2;
    if (chunks > MXB_MAX_CHUNKS_OF(MX) || cols % (MX ? 32 : 8) || rows < 1)
        return k3c_errorf("moe band: %d x %d %s matrices (cols a multiple of %d, at most %d)", rows, cols,
                          MX ? "MXFP4" : "bf16", MX ? 32 : 8, (MX ? 32 : 8) * MXB_MAX_CHUNKS_OF(MX));
    const int wpr_max = band_wpr_max(MX);
    const size_t smem = band_smem(MX, cols, NC, wpr_max);
    if (smem > MXB_SMEM_MAX)
        return k3c_errorf("moe band: rows of %d at %d columns a tile need %zu bytes of shared memory (at most %d)", cols,
                          NC, smem, MXB_SMEM_MAX);
    const int occ = band_occupancy<MX, U, NC, MINB, STG>(smem);
    if (!occ) return k3c_errorf("moe band: %zu bytes of shared memory a block", smem);
    /* planned for the most tiles the routing can give (every pair its own expert, up to num_experts) */
    const int tiles_max = pairs < num_experts ? pairs : num_experts;
    pair_plan pp = plan_pairs((rows + 15) / 16, (steps + U - 1) / U, tiles_max * nm, occ * k3c_cuda_sm_count(),
                              MX ? 1 : 2, force_wpr);
    if (pp.wpr > wpr_max) return k3c_errorf("moe band: %d warps a row planned, room for %d", pp.wpr, wpr_max);
    moe_band_kernel<MX, U, NC, MINB, STG><<<pp.grid, GEMV_WARPS * 32, smem, s>>>(experts, lists, pairs, nm, pp.per,
                                                                                  rows, cols, x, x_per_pair, y0, y1,
                                                                                  pp.wpr, round);
    K3C_CUDA_LAUNCHED(MX ? "moe_band_mx" : "moe_band_bf16");
    return K3C_OK;
}

/* Plane entries a thread stages at once, their loads in flight together (a tile's activation rows come from
 * L2, so a stage is a chain of round trips while the block's weight stream waits at the barrier): K3's
 * 3584-wide row at 8 columns is 3584 entries, 14 a thread, 7 round trips at 2; at 16 columns 28 a thread, 14
 * round trips, with one block an SM so that nothing else streams meanwhile. The wide kernel has registers to
 * spare (161 of 255 at one block an SM) and stages 8 at once (4 round trips); the 8-column kernels keep 2
 * (their 128-register bound). A/B knobs, read once: K3C_MOE_BAND_STAGE_W=2 (the wide kernel's old count),
 * K3C_MOE_BAND_STAGE_N=4 (the 8-column kernels, MXFP4 and bf16, at 4). 2026-11-30 (H200, k3c bench, context 64,
 * two rounds): k3-slice b=64 SPEC 19.98 / 19.99 -> 19.82 / 19.84 ms with 8 (predicted -1.0..-1.5: the stage
 * is not where the wide kernel's time goes), b=16 / 32 unchanged; STAGE_N=4 (spilling 44 / 72 bytes) made
 * k3-slice b=16 / 32 0.24 / 0.37 ms and kimi-linear-48b b=16 / 64 0.15 / 0.20 ms slower. */
static int band_stage_wide(void) {
    static int v = -1;
    if (v < 0) v = env_int("K3C_MOE_BAND_STAGE_W", 8) == 2 ? 2 : 8;
    return v;
}
static int band_stage_narrow(void) {
    static int v = -1;
    if (v < 0) v = env_int("K3C_MOE_BAND_STAGE_N", 2) == 4 ? 4 : 2;
    return v;
}

/* nm, rows, cols, x, x_per_pair, y0, y1: as k3c_cuda_moe_pair_mx; lists: moe_band_lists's table of `pairs` in
 * tiles of tile_cols (k3c_cuda_moe_band_cols). bf16 takes 3 steps a run (no decode: registers for more bytes
 * in flight; 4 spilled 36 bytes), MXFP4 2 as the per-pair kernel. */
extern "C" int k3c_cuda_moe_band(const k3c_cuda_expert *experts, int num_experts, int mxfp4, const int *lists, int pairs,
                                 int tile_cols, int nm, int rows, int cols, const float *x, int x_per_pair, float *y0,
                                 float *y1, int round, cudaStream_t s) {
    if (!mxfp4 && tile_cols != MXB_COLS)
        return k3c_errorf("moe band: bf16 tiles of %d pairs (%d)", tile_cols, MXB_COLS);
    if (tile_cols != MXB_COLS && tile_cols != MXB_COLS_WIDE && tile_cols != MXB_COLS_MAX)
        return k3c_errorf("moe band: tiles of %d pairs (%d, %d or %d)", tile_cols, MXB_COLS, MXB_COLS_WIDE,
                          MXB_COLS_MAX);
    const bool narrow4 = band_stage_narrow() == 4;
    if (!mxfp4)
        return (narrow4 ? moe_band_launch<false, 3, MXB_COLS, 2, 4> : moe_band_launch<false, 3, MXB_COLS, 2, 2>)(
            experts, num_experts, lists, pairs, nm, rows, cols, x, x_per_pair, y0, y1, round, s);
    /* the wide kernels at one block an SM (the 16-column one 209 registers, no spill): built for two (128
     * registers, spilled; or 118 at one step a run) the 16-column one was 1.5-2.0 ms slower at k3-slice b=64
     * (k3c bench, 2026-11-30); the 32-column one takes 224 KB of plane at K3's 3584, one block an SM anyway, and
     * stages 8 entries a thread at once */
    if (tile_cols == MXB_COLS)
        return (narrow4 ? moe_band_launch<true, 2, MXB_COLS, 2, 4> : moe_band_launch<true, 2, MXB_COLS, 2, 2>)(
            experts, num_experts, lists, pairs, nm, rows, cols, x, x_per_pair, y0, y1, round, s);
    if (tile_cols == MXB_COLS_MAX)
        return moe_band_launch<true, 2, MXB_COLS_MAX, 1, 8>(experts, num_experts, lists, pairs, nm, rows, cols, x,
                                                             x_per_pair, y0, y1, round, s);
    return (band_stage_wide() == 2 ? moe_band_launch<true, 2, MXB_COLS_WIDE, 1, 2>
                                   : moe_band_launch<true, 2, MXB_COLS_WIDE, 1, 8>)(
        experts, num_experts, lists, pairs, nm, rows, cols, x, x_per_pair, y0, y1, round, s);
}

/* The bf16 per-pair path: gate/up + activation into h, then down + weighted sum into out (the two kernels
 * above), each a persistent launch of at most its resident blocks. */
/* K3C_MOE_PAIR_OCC=N (A/B runs; the same outputs every way), read once: the bf16 per-pair kernels' variant,
 * (gate/up chunks in flight, its blocks an SM; down experts at once, its blocks an SM):
 *   0 (PG_U, 2; PD_K, 2): 80 / 102 registers, 3 / 2 blocks an SM (the kernels before 2026-11-30)
 *   1 (default) (4, 4; 2, 3), 2 (6, 3; 2, 4), 3 (PG_U, 2; 2, 3)
 * Why: at one token of kimi-linear-48b the down kernel has 288 items (8 rows each) for 264 resident blocks
 * at variant 0, so 24 blocks run a second round alone; gate/up has 1024 for 396 (2.6 rounds). More blocks an
 * SM put the down's items in one round, at the cost of fewer experts (or chunks) in flight a warp. k3c bench
 * (H200, 2026-11-30, kimi-linear-48b, context 64, two rounds): variant 1 against 0 at b = 1 / 2 / 4 / 8: 2.80 /
 * 3.96 / 5.45 / 8.89 ms against 2.96 / 4.12 / 5.87 / 9.40; b = 16 inside the spread; 2 and 3 in between. */
#define PAIR_OCC_VARIANTS 4
#define PAIR_OCC_DEFAULT 1
static int pair_occ_forced = -1; /* k3c_cuda_moe_pair_occ_force (tests) */
static int pair_occ(void) {
    static int v = -1;
    if (pair_occ_forced >= 0) return pair_occ_forced;
    if (v < 0) {
        const char *e = getenv("K3C_MOE_PAIR_OCC");
        const int n = e && *e ? atoi(e) : -1;
        v = n >= 0 && n < PAIR_OCC_VARIANTS ? n : PAIR_OCC_DEFAULT;
    }
    return v;
}

extern "C" int k3c_cuda_moe_pair_occ_force(int variant) {
    if (variant < -1 || variant >= PAIR_OCC_VARIANTS)
        return k3c_errorf("k3c_cuda_moe_pair_occ_force: variant %d (0..%d, or -1 for the default)", variant,
                          PAIR_OCC_VARIANTS - 1);
    pair_occ_forced = variant;
    return K3C_OK;
}

template <int GU, int GB, int DK, int DB>
static int pair_bf16_launch(const k3c_cuda_expert *experts, int num_experts, int In, int F, int Out, const float *x,
                            int T, const int *idx, const float *weight, int k, k3c_cuda_act act, int round, float *h,
                            float *out, cudaStream_t s) {
    static int occ_up, occ_down;
    int pairs = T * k, up_items = pairs * ((F + GEMV_WARPS - 1) / GEMV_WARPS);
    int down_items = T * ((Out + GEMV_WARPS - 1) / GEMV_WARPS);
    int up_cap = resident_blocks(moe_pair_gate_up_kernel<GU, GB>, &occ_up);
    int down_cap = resident_blocks(moe_pair_down_kernel<DK, DB>, &occ_down);
    /* round (cuda/moe.h): gate, up and h rounded unless 0; the down outputs and their sum only when 1 */
    K3C_TRY(launch_stream(moe_pair_gate_up_kernel<GU, GB>, up_items < up_cap ? up_items : up_cap, s, experts,
                          num_experts, idx, pairs, F, In, x, k, act, (int)(round != 0), h));
    K3C_CUDA_LAUNCHED("moe_pair_gate_up");
    K3C_TRY(launch_stream(moe_pair_down_kernel<DK, DB>, down_items < down_cap ? down_items : down_cap, s, experts,
                          num_experts, idx, weight, T, Out, F, (const float *)h, k, (int)(round == 1), out));
    K3C_CUDA_LAUNCHED("moe_pair_down");
    return K3C_OK;
}

extern "C" int k3c_cuda_moe_pair_bf16(const k3c_cuda_expert *experts, int num_experts, int In, int F, int Out,
                                      const float *x, int T, const int *idx, const float *weight, int k,
                                      k3c_cuda_act act, int round, float *h, float *out, cudaStream_t s) {
    switch (pair_occ()) {
    case 1: return pair_bf16_launch<4, 4, 2, 3>(experts, num_experts, In, F, Out, x, T, idx, weight, k, act, round, h, out, s);
    case 2: return pair_bf16_launch<6, 3, 2, 4>(experts, num_experts, In, F, Out, x, T, idx, weight, k, act, round, h, out, s);
    case 3: return pair_bf16_launch<PG_U, 2, 2, 3>(experts, num_experts, In, F, Out, x, T, idx, weight, k, act, round, h, out, s);
    default: return pair_bf16_launch<PG_U, 2, PD_K, 2>(experts, num_experts, In, F, Out, x, T, idx, weight, k, act, round, h, out, s);
    }
}

K3C_STAMP_TU(moe_pair) /* K3C_CUDA_PROFILE=3: this file's stamped kernels (cuda/stamp.cuh) */
