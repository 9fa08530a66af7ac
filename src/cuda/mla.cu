/* MLA kernels: cache write, absorptions, paged attention with an online softmax. */
#include "cuda/mla.h"

#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/kernel_limits.h"

__global__ void mla_cache_write_kernel(const float *__restrict__ lat, const int *__restrict__ slots, int Lat,
                                       int elem_bytes, void *cache) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_MLA_CACHE_WRITE);
    int t = blockIdx.x, slot = slots[t];
    if (slot < 0) return;
    const float *src = lat + (size_t)t * Lat;
    for (int i = threadIdx.x; i < Lat; i += blockDim.x) {
        if (elem_bytes == 2) ((uint16_t *)cache)[(size_t)slot * Lat + i] = k3c_dev_to_bf16(src[i]);
        else if (elem_bytes == 1) ((uint8_t *)cache)[(size_t)slot * Lat + i] = k3c_dev_to_e4m3(src[i]);
        else ((float *)cache)[(size_t)slot * Lat + i] = src[i];
    }
    K3C_STAMP_BLOCK_END(K3C_KID_MLA_CACHE_WRITE);
}

extern "C" int k3c_cuda_mla_cache_write(const float *lat, const int *slots, int T, int Lat, int elem_bytes,
                                        void *cache, cudaStream_t stream) {
    if (T == 0) return K3C_OK;
    if (elem_bytes != 1 && elem_bytes != 2 && elem_bytes != 4)
        return k3c_errorf("k3c_cuda_mla_cache_write: element size %d", elem_bytes);
    mla_cache_write_kernel<<<T, 256, 0, stream>>>(lat, slots, Lat, elem_bytes, cache);
    K3C_CUDA_LAUNCHED("mla_cache_write");
    return K3C_OK;
}

#define ABS_TT 8

/* grid (Hm, ceil(T / ABS_TT)); thread c of kvl accumulates ABS_TT tokens over the head's nope rows (each
 * weight row read coalesced across threads, once per token tile). */
__global__ void mla_absorb_q_kernel(const uint16_t *__restrict__ kv_b, const float *__restrict__ q, int T, int Hm,
                                    int nope, int rope, int vh, int kvl, float *q_abs) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_MLA_ABSORB_Q);
    int h = blockIdx.x, t0 = blockIdx.y * ABS_TT, qh = nope + rope, Lat = kvl + rope;
    int nt = min(ABS_TT, T - t0);
    const uint16_t *Wk = kv_b + (size_t)h * (nope + vh) * kvl;
    for (int c = threadIdx.x; c < kvl; c += blockDim.x) {
        float acc[ABS_TT];
#pragma unroll
        for (int j = 0; j < ABS_TT; j++) acc[j] = 0.0f;
        for (int i = 0; i < nope; i++) {
            float w = k3c_dev_bf16(Wk[(size_t)i * kvl + c]);
#pragma unroll
            for (int j = 0; j < ABS_TT; j++)
                if (j < nt) acc[j] = fmaf(q[(size_t)(t0 + j) * Hm * qh + (size_t)h * qh + i], w, acc[j]);
        }
#pragma unroll
        for (int j = 0; j < ABS_TT; j++)
            if (j < nt) q_abs[((size_t)(t0 + j) * Hm + h) * Lat + c] = acc[j];
    }
    for (int j = 0; j < nt; j++)
        for (int r = threadIdx.x; r < rope; r += blockDim.x)
            q_abs[((size_t)(t0 + j) * Hm + h) * Lat + kvl + r] = q[(size_t)(t0 + j) * Hm * qh + (size_t)h * qh + nope + r];
    K3C_STAMP_BLOCK_END(K3C_KID_MLA_ABSORB_Q);
}

/* The absorptions at decode sizes (T = 1 .. 64 rows), 16-byte weight loads. Both are per-head products
 * out[t, n] = sum_k a[t, k] B[k, n] over a head's kv_b rows, read once per block into registers and applied
 * to every token of the block in register tiles of ABS_TT tokens; the reduction dimension is split over the
 * block's threads and their partials are summed through shared memory in a fixed thread order, so the bits
 * of an output do not depend on T, on the token tiling or on timing (no atomics). The previous kernels
 * (2-byte loads: absorb_q one thread per kvl column walking the 128 nope rows serially, Hm blocks at T = 1;
 * absorb_o one warp per row re-reading W_UV for every 8 tokens) took 35-40 us at T = 1 and 170 / 700 us at
 * T = 64 on K3 dims (2026-11-30), latency bound; they stay the fallback for shapes the fast ones do not take. */
#define ABS_THREADS 128
#define AQ_COLS 64 /* absorb_q: kvl columns per block (8 chunks of 8 bf16) */
#define AQ_RG 16   /* absorb_q: row groups; group g holds nope rows g * AQ_J .. + AQ_J */
#define AQ_J 8     /* absorb_q: rows per group (nope <= AQ_RG * AQ_J = 128) */
#define AO_ROWS 16 /* absorb_o: W_UV rows (e) per block */
#define AO_KC 64   /* absorb_o: 8-element chunks of a row, one per thread (kvl <= 512) */

/* Tokens per block: all T in one block column unless the heads x slices grid would leave the GPU under
 * about 4 blocks per SM, then split into multiples of ABS_TT (the bits do not depend on it). */
static int absorb_tokens_per_block(int T, int base_blocks) {
    int tiles = (T + ABS_TT - 1) / ABS_TT;
    int want = (4 * k3c_cuda_sm_count() + base_blocks - 1) / base_blocks;
    int groups = want < 1 ? 1 : want > tiles ? tiles : want;
    int tiles_per = (tiles + groups - 1) / groups;
    return tiles_per * ABS_TT;
}

/* grid (Hm, ceil(kvl / AQ_COLS), token groups), ABS_THREADS threads: thread (g = tid / 8, chunk u = tid % 8)
 * holds W_UK[h] rows g * AQ_J + j (j < AQ_J) at columns col0 + 8 u .. + 8 as AQ_J 16-byte loads (the block
 * reads its 128 rows x 128 bytes once), multiplies them by q (staged per tile in shared memory) into
 * acc[token][8 columns], and the AQ_RG group partials of each output are summed in group order 0 .. 15 (each
 * partial is the group's rows in ascending order). */
__global__ void __launch_bounds__(ABS_THREADS)
mla_absorb_q_v_kernel(const uint16_t *__restrict__ kv_b, const float *__restrict__ q, int T, int Hm, int nope,
                      int rope, int vh, int kvl, float *__restrict__ q_abs, int tpb) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_MLA_ABSORB_Q_V);
    __shared__ float qs[ABS_TT][AQ_RG * AQ_J];
    /* [AQ_RG][ABS_TT * AQ_COLS + 4] floats as float4 (16-byte aligned); +4: the groups' rows start on other banks */
    __shared__ float4 red4[AQ_RG][(ABS_TT * AQ_COLS + 4) / 4];
    float(*red)[ABS_TT * AQ_COLS + 4] = (float(*)[ABS_TT * AQ_COLS + 4])red4;
    int h = blockIdx.x, col0 = blockIdx.y * AQ_COLS, tid = threadIdx.x, u = tid & 7, g = tid >> 3;
    int qh = nope + rope, Lat = kvl + rope, col = col0 + 8 * u;
    const uint16_t *Wk = kv_b + (size_t)h * (nope + vh) * kvl;
    uint4 w[AQ_J];
#pragma unroll
    for (int j = 0; j < AQ_J; j++) {
        int i = g * AQ_J + j;
        w[j] = col < kvl && i < nope ? __ldg((const uint4 *)(Wk + (size_t)i * kvl + col)) : make_uint4(0u, 0u, 0u, 0u);
    }
    int t_begin = blockIdx.z * tpb, t_end = min(T, t_begin + tpb);
    for (int t0 = t_begin; t0 < t_end; t0 += ABS_TT) {
        int nt = min(ABS_TT, t_end - t0);
        __syncthreads(); /* the previous tile's readers of qs and red are done */
        for (int k = tid; k < ABS_TT * AQ_RG * AQ_J; k += ABS_THREADS) {
            int tt = k / (AQ_RG * AQ_J), i = k % (AQ_RG * AQ_J);
            qs[tt][i] = tt < nt && i < nope ? q[(size_t)(t0 + tt) * Hm * qh + (size_t)h * qh + i] : 0.0f;
        }
        __syncthreads();
        float acc[ABS_TT][8];
#pragma unroll
        for (int tt = 0; tt < ABS_TT; tt++)
#pragma unroll
            for (int e = 0; e < 8; e++) acc[tt][e] = 0.0f;
#pragma unroll
        for (int j = 0; j < AQ_J; j++) {
            const uint32_t wv[4] = {w[j].x, w[j].y, w[j].z, w[j].w};
#pragma unroll
            for (int tt = 0; tt < ABS_TT; tt++) {
                if (tt < nt) { /* block-uniform */
                    float a = qs[tt][g * AQ_J + j];
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        acc[tt][2 * e] = fmaf(a, k3c_dev_bf16_lo(wv[e]), acc[tt][2 * e]);
                        acc[tt][2 * e + 1] = fmaf(a, k3c_dev_bf16_hi(wv[e]), acc[tt][2 * e + 1]);
                    }
                }
            }
        }
#pragma unroll
        for (int tt = 0; tt < ABS_TT; tt++) {
            if (tt < nt) {
                float4 *r = (float4 *)&red[g][tt * AQ_COLS + 8 * u];
                r[0] = make_float4(acc[tt][0], acc[tt][1], acc[tt][2], acc[tt][3]);
                r[1] = make_float4(acc[tt][4], acc[tt][5], acc[tt][6], acc[tt][7]);
            }
        }
        __syncthreads();
        for (int o = tid; o < nt * AQ_COLS; o += ABS_THREADS) {
            int tt = o / AQ_COLS, c = col0 + o % AQ_COLS;
            float s = red[0][o];
#pragma unroll
            for (int gg = 1; gg < AQ_RG; gg++) s += red[gg][o];
            if (c < kvl) q_abs[((size_t)(t0 + tt) * Hm + h) * Lat + c] = s;
        }
    }
    if (blockIdx.y == 0)
        for (int t = t_begin; t < t_end; t++)
            for (int r = tid; r < rope; r += ABS_THREADS)
                q_abs[((size_t)t * Hm + h) * Lat + kvl + r] = q[(size_t)t * Hm * qh + (size_t)h * qh + nope + r];
    K3C_STAMP_BLOCK_END(K3C_KID_MLA_ABSORB_Q_V);
}

/* grid (Hm, ceil(vh / AO_ROWS), token groups), ABS_THREADS threads: thread (s = tid / AO_KC, chunk k =
 * tid % AO_KC) holds W_UV[h] rows e0 + s + 2 j (j < 8) at k's 8 elements (the block reads its 16 rows x
 * kvl once), and per token its o_lat chunk (two float4, L1-shared by the block's rows); the AO_KC chunk
 * partials of an output are summed in chunk order 0 .. 63 (each partial: its 8 elements in order). */
__global__ void __launch_bounds__(ABS_THREADS)
mla_absorb_o_v_kernel(const uint16_t *__restrict__ kv_b, const float *__restrict__ o_lat, int T, int Hm, int nope,
                      int vh, int kvl, int round, float *__restrict__ o, int tpb) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_MLA_ABSORB_O_V);
    k3c_pdl_trigger(); /* a PDL-launched weight stream after this kernel (the o-projection) may start */
    __shared__ float red[AO_KC][AO_ROWS * ABS_TT + 1]; /* +1: the chunks' rows land on different banks */
    int h = blockIdx.x, e0 = blockIdx.y * AO_ROWS, tid = threadIdx.x, k = tid % AO_KC, s = tid / AO_KC;
    bool kin = 8 * k < kvl;
    const uint16_t *Wv = kv_b + ((size_t)h * (nope + vh) + nope) * kvl;
    uint4 w[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int e = e0 + s + 2 * j;
        w[j] = kin && e < vh ? __ldg((const uint4 *)(Wv + (size_t)e * kvl + 8 * k)) : make_uint4(0u, 0u, 0u, 0u);
    }
    int t_begin = blockIdx.z * tpb, t_end = min(T, t_begin + tpb);
    for (int t0 = t_begin; t0 < t_end; t0 += ABS_TT) {
        int nt = min(ABS_TT, t_end - t0);
        float acc[8][ABS_TT];
#pragma unroll
        for (int tt = 0; tt < ABS_TT; tt++) {
            if (tt < nt) { /* block-uniform */
                float a[8];
                if (kin) {
                    const float4 *lp = (const float4 *)(o_lat + ((size_t)(t0 + tt) * Hm + h) * kvl + 8 * k);
                    float4 a0 = __ldg(lp), a1 = __ldg(lp + 1);
                    a[0] = a0.x; a[1] = a0.y; a[2] = a0.z; a[3] = a0.w;
                    a[4] = a1.x; a[5] = a1.y; a[6] = a1.z; a[7] = a1.w;
                } else {
#pragma unroll
                    for (int e = 0; e < 8; e++) a[e] = 0.0f;
                }
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const uint32_t wv[4] = {w[j].x, w[j].y, w[j].z, w[j].w};
                    float d = a[0] * k3c_dev_bf16_lo(wv[0]);
                    d = fmaf(a[1], k3c_dev_bf16_hi(wv[0]), d);
#pragma unroll
                    for (int e = 1; e < 4; e++) {
                        d = fmaf(a[2 * e], k3c_dev_bf16_lo(wv[e]), d);
                        d = fmaf(a[2 * e + 1], k3c_dev_bf16_hi(wv[e]), d);
                    }
                    acc[j][tt] = d;
                }
            }
        }
        __syncthreads(); /* the previous tile's readers of red are done */
#pragma unroll
        for (int tt = 0; tt < ABS_TT; tt++)
            if (tt < nt)
#pragma unroll
                for (int j = 0; j < 8; j++) red[k][tt * AO_ROWS + s + 2 * j] = acc[j][tt];
        __syncthreads();
        if (tid < nt * AO_ROWS) {
            int tt = tid / AO_ROWS, e = e0 + tid % AO_ROWS;
            float v = red[0][tid];
#pragma unroll 16
            for (int kk = 1; kk < AO_KC; kk++) v += red[kk][tid];
            if (round) v = k3c_dev_bf16(k3c_dev_to_bf16(v));
            if (e < vh) o[(size_t)(t0 + tt) * Hm * vh + (size_t)h * vh + e] = v;
        }
    }
    K3C_STAMP_BLOCK_END(K3C_KID_MLA_ABSORB_O_V);
}

extern "C" int k3c_cuda_mla_absorb_q(const uint16_t *kv_b, const float *q, int T, int Hm, int nope, int rope, int vh,
                                     int kvl, float *q_abs, cudaStream_t stream) {
    if (T == 0) return K3C_OK;
    if (kvl % 8 == 0 && nope <= AQ_RG * AQ_J && ((uintptr_t)kv_b & 15) == 0) {
        dim3 g0(Hm, (kvl + AQ_COLS - 1) / AQ_COLS);
        int tpb = absorb_tokens_per_block(T, Hm * (int)g0.y);
        mla_absorb_q_v_kernel<<<dim3(g0.x, g0.y, (T + tpb - 1) / tpb), ABS_THREADS, 0, stream>>>(
            kv_b, q, T, Hm, nope, rope, vh, kvl, q_abs, tpb);
        K3C_CUDA_LAUNCHED("mla_absorb_q");
        return K3C_OK;
    }
    dim3 grid(Hm, (T + ABS_TT - 1) / ABS_TT);
    mla_absorb_q_kernel<<<grid, kvl >= 512 ? 512 : ((kvl + 31) / 32) * 32, 0, stream>>>(kv_b, q, T, Hm, nope, rope, vh,
                                                                                         kvl, q_abs);
    K3C_CUDA_LAUNCHED("mla_absorb_q");
    return K3C_OK;
}

/* One warp per (head, e) row of W_UV, lanes over kvl, ABS_TT tokens per pass. */
__global__ void mla_absorb_o_kernel(const uint16_t *__restrict__ kv_b, const float *__restrict__ o_lat, int T, int Hm,
                                    int nope, int vh, int kvl, int round, float *o) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_MLA_ABSORB_O);
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= Hm * vh) return;
    int h = row / vh, e = row % vh;
    const uint16_t *w = kv_b + ((size_t)h * (nope + vh) + nope + e) * kvl;
    for (int t0 = 0; t0 < T; t0 += ABS_TT) {
        int nt = min(ABS_TT, T - t0);
        float acc[ABS_TT];
#pragma unroll
        for (int j = 0; j < ABS_TT; j++) acc[j] = 0.0f;
        for (int c = lane; c < kvl; c += 32) {
            float wc = k3c_dev_bf16(w[c]);
#pragma unroll
            for (int j = 0; j < ABS_TT; j++)
                if (j < nt) acc[j] = fmaf(wc, o_lat[((size_t)(t0 + j) * Hm + h) * kvl + c], acc[j]);
        }
#pragma unroll
        for (int j = 0; j < ABS_TT; j++) {
            float s = k3c_warp_sum(acc[j]);
            if (lane == 0 && j < nt) {
                if (round) s = k3c_dev_bf16(k3c_dev_to_bf16(s));
                o[(size_t)(t0 + j) * Hm * vh + row] = s;
            }
        }
    }
    K3C_STAMP_BLOCK_END(K3C_KID_MLA_ABSORB_O);
}

extern "C" int k3c_cuda_mla_absorb_o(const uint16_t *kv_b, const float *o_lat, int T, int Hm, int nope, int vh,
                                     int kvl, int round_bf16, float *o, cudaStream_t stream) {
    if (T == 0) return K3C_OK;
    if (kvl % 8 == 0 && kvl <= 8 * AO_KC && ((uintptr_t)kv_b & 15) == 0 && ((uintptr_t)o_lat & 15) == 0) {
        dim3 g0(Hm, (vh + AO_ROWS - 1) / AO_ROWS);
        int tpb = absorb_tokens_per_block(T, Hm * (int)g0.y);
        mla_absorb_o_v_kernel<<<dim3(g0.x, g0.y, (T + tpb - 1) / tpb), ABS_THREADS, 0, stream>>>(
            kv_b, o_lat, T, Hm, nope, vh, kvl, round_bf16, o, tpb);
        K3C_CUDA_LAUNCHED("mla_absorb_o");
        return K3C_OK;
    }
    int rows = Hm * vh;
    mla_absorb_o_kernel<<<(rows + 7) / 8, 256, 0, stream>>>(kv_b, o_lat, T, Hm, nope, vh, kvl, round_bf16, o);
    K3C_CUDA_LAUNCHED("mla_absorb_o");
    return K3C_OK;
}

#define ATT_WARPS 8
/* Blocks per SM the splits aim at, and the most splits of one row and head. */
#define ATT_BLOCKS_PER_SM 8
#define ATT_MAX_SPLITS 64
#define ATT_P 4 /* positions per warp step */
#define ATT_MAXJ 24 /* Lat <= 768: 24 elements per lane */

template <int EB>
__device__ __forceinline__ float cache_elem(const void *cache, size_t i) {
    if (EB == 2) return k3c_dev_bf16(((const uint16_t *)cache)[i]);
    if (EB == 1) return k3c_dev_e4m3(((const uint8_t *)cache)[i]);
    return ((const float *)cache)[i];
}

/* Positions of one split and the splits a row really uses: split z of a row's len positions takes
 * [z * per, min(len, (z + 1) * per)), per = max(ceil(len / splits), ATT_MIN_PER), so a short row uses
 * eff = ceil(len / per) <= splits of them (every one non-empty) and the grid's others return at once; eff = 1
 * writes o_lat directly and the merge skips the row. Computed on the device from the row's len (a CUDA graph
 * captured once serves every length); the attention kernels and the merge use this one function. Why: with
 * the splits sized for the GPU only (33 at T = 1, 32 heads) a 64-position row got 2 positions a split and a
 * 33-way merge, about 35 us a call (op profile, 2026-11-30) for work that reads 74 KB. */
#define ATT_MIN_PER 32
__device__ __forceinline__ void attend_split_range(int len, int splits, int z, int *p_begin, int *p_end, int *eff) {
    int per = max((len + splits - 1) / splits, ATT_MIN_PER);
    *eff = (len + per - 1) / per;
    *p_begin = min(len, z * per);
    *p_end = min(len, *p_begin + per);
}

/* The end of an attention block: the warps' running max wm, sum wl and unnormalized outputs wo [ATT_WARPS][kvl]
 * (shared, complete) merged in warp order; one split in use (eff 1): the normalized output to o_lat[rh] (rh =
 * t * Hm + h); several: [acc | M | L] to part[rh * splits + z] (= slot), for mla_attend_merge_kernel. The warps'
 * factors e^(m_w - M) are computed once (wf, shared) instead of per element. */
__device__ __forceinline__ void attend_finish(const float *wm, const float *wl, const float *wo, float *wf, int kvl,
                                              size_t rh, size_t slot, int eff, float *o_lat, float *part,
                                              float *lse) {
    float M = -INFINITY;
    for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, wm[w]);
    if (threadIdx.x < ATT_WARPS) wf[threadIdx.x] = wm[threadIdx.x] == -INFINITY ? 0.0f : expf(wm[threadIdx.x] - M);
    __syncthreads();
    float L = 0.0f;
    for (int w = 0; w < ATT_WARPS; w++) L += wm[w] == -INFINITY ? 0.0f : wl[w] * wf[w];
    float inv = 1.0f / L;
    float *out = eff == 1 ? o_lat + rh * kvl : part + slot * (size_t)(kvl + 2);
    for (int i = threadIdx.x; i < kvl; i += blockDim.x) {
        float s = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            if (wm[w] != -INFINITY) s = fmaf(wo[w * kvl + i], wf[w], s);
        out[i] = eff == 1 ? s * inv : s;
    }
    if (eff > 1 && threadIdx.x == 0) {
        out[kvl] = M;
        out[kvl + 1] = L;
    }
    if (eff == 1 && lse && threadIdx.x == 0) lse[rh] = M + logf(L); /* DCP's partial (k3c_cuda_mla_attend_lse) */
}

/* grid (T, Hm, splits), ATT_WARPS warps. Split z of a row's len positions: attend_split_range (computed here
 * from the row's len, so a CUDA graph captured once serves every length); warp w takes positions [w*ATT_P, w*ATT_P + ATT_P) + k*ATT_WARPS*ATT_P of that range; lane l
 * holds elements l + 32 j of the query and of its partial output. Each warp keeps its own running max / sum;
 * the warps are merged at the end through shared memory, in warp order. One split: the normalized output
 * goes to o_lat. Several in use: the block's max M, sum L and unnormalized sum acc (relative to M) go to
 * part[((t * Hm + h) * splits + z) * (kvl + 2)] = [acc | M | L], and mla_attend_merge_kernel combines the
 * splits in split order (deterministic). Why splits: one block per (row, head) walked all positions as one
 * chain of dependent steps, 572 us for 96 heads over 8192 positions on the H200 (the cache's 9.4 MB would
 * take 2.2 us); the splits put about 8 blocks per SM to work whatever T and Hm are. */
template <int EB>
__global__ void __launch_bounds__(ATT_WARPS * 32)
mla_attend_kernel(const float *__restrict__ q_abs, const int *__restrict__ table_off, const int *__restrict__ lens,
                  const int *__restrict__ tables, int bs, const void *__restrict__ cache, int Hm, int kvl, int rope,
                  float scale, float *o_lat, float *__restrict__ part, float *__restrict__ lse) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_MLA_ATTEND);
    __shared__ float wm[ATT_WARPS], wl[ATT_WARPS], wf[ATT_WARPS];
    extern __shared__ float wo[]; /* [ATT_WARPS][kvl] */
    int t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int splits = gridDim.z, z = blockIdx.z;
    int Lat = kvl + rope, len_all = lens[t];
    int p_begin, len, eff;
    attend_split_range(len_all, splits, z, &p_begin, &len, &eff);
    if (z >= eff) return; /* an unused split of a short row (block-uniform, before any barrier) */
    const int *table = tables + table_off[t];
    const float *qv = q_abs + ((size_t)t * Hm + h) * Lat;
    float qr[ATT_MAXJ], acc[ATT_MAXJ];
#pragma unroll
    for (int j = 0; j < ATT_MAXJ; j++) {
        int i = lane + 32 * j;
        qr[j] = i < Lat ? qv[i] : 0.0f;
        acc[j] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    /* ATT_P consecutive positions per warp step: their loads and reductions are independent (latency
     * overlaps); the accumulation re-reads the rows (L1 hits) instead of holding them in registers. */
    for (int p0 = p_begin + warp * ATT_P; p0 < len; p0 += ATT_WARPS * ATT_P) {
        size_t base[ATT_P];
        float s[ATT_P];
#pragma unroll
        for (int u = 0; u < ATT_P; u++) {
            int p = min(p0 + u, len - 1);
            base[u] = ((size_t)table[p / bs] * bs + p % bs) * Lat;
            s[u] = 0.0f;
        }
#pragma unroll
        for (int j = 0; j < ATT_MAXJ; j++) {
            int i = lane + 32 * j;
            if (i < Lat) {
#pragma unroll
                for (int u = 0; u < ATT_P; u++) s[u] = fmaf(qr[j], cache_elem<EB>(cache, base[u] + i), s[u]);
            }
        }
        float bm = -INFINITY;
#pragma unroll
        for (int u = 0; u < ATT_P; u++) {
            s[u] = p0 + u < len ? k3c_warp_sum(s[u]) * scale : -INFINITY;
            bm = fmaxf(bm, s[u]);
        }
        if (bm > m) {
            float r = expf(m - bm); /* m = -inf on the first step: r = 0 */
            l *= r;
#pragma unroll
            for (int j = 0; j < ATT_MAXJ; j++) acc[j] *= r;
            m = bm;
        }
        float pr[ATT_P];
#pragma unroll
        for (int u = 0; u < ATT_P; u++) {
            pr[u] = p0 + u < len ? expf(s[u] - m) : 0.0f;
            l += pr[u];
        }
#pragma unroll
        for (int j = 0; j < ATT_MAXJ; j++) {
            int i = lane + 32 * j;
            if (i < kvl) {
#pragma unroll
                for (int u = 0; u < ATT_P; u++) acc[j] = fmaf(pr[u], cache_elem<EB>(cache, base[u] + i), acc[j]);
            }
        }
    }
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
#pragma unroll
    for (int j = 0; j < ATT_MAXJ; j++) {
        int i = lane + 32 * j;
        if (i < kvl) wo[warp * kvl + i] = acc[j];
    }
    __syncthreads();
    attend_finish(wm, wl, wo, wf, kvl, (size_t)t * Hm + h, ((size_t)t * Hm + h) * splits + z, eff, o_lat, part, lse);
    K3C_STAMP_BLOCK_END(K3C_KID_MLA_ATTEND);
}

/* The bf16 cache (the model's default) with 16-byte loads: lane l owns the row's 8-element chunks
 * c = l + 32 j (j < ATT_CJ), so a position costs a lane ATT_CJ 16-byte loads, and the chunks of the value
 * part (c < kvl / 8) stay in registers for the output sum instead of being read again; the generic kernel
 * above loads 2 bytes at a time (about 34 loads a lane per position). Same split, warp and merge structure
 * (attend_finish). Needs Lat % 8 == 0 (16-byte aligned rows) and kvl % 8 == 0. */
#define ATT_CJ 3   /* chunks per lane: Lat <= 768 */
#define ATT_PV 2   /* positions per warp step */
__global__ void __launch_bounds__(ATT_WARPS * 32)
mla_attend_bf16v_kernel(const float *__restrict__ q_abs, const int *__restrict__ table_off,
                        const int *__restrict__ lens, const int *__restrict__ tables, int bs,
                        const uint16_t *__restrict__ cache, int Hm, int kvl, int rope, float scale, float *o_lat,
                        float *__restrict__ part, float *__restrict__ lse) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_MLA_ATTEND_BF16V);
    __shared__ float wm[ATT_WARPS], wl[ATT_WARPS], wf[ATT_WARPS];
    extern __shared__ float wo[]; /* [ATT_WARPS][kvl] */
    int t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int splits = gridDim.z, z = blockIdx.z;
    int Lat = kvl + rope, nch = Lat / 8, vch = kvl / 8, len_all = lens[t];
    int p_begin, len, eff;
    attend_split_range(len_all, splits, z, &p_begin, &len, &eff);
    if (z >= eff) return; /* an unused split of a short row (block-uniform, before any barrier) */
    const int *table = tables + table_off[t];
    const float *qv = q_abs + ((size_t)t * Hm + h) * Lat;
    float qr[ATT_CJ][8], acc[ATT_CJ][8];
#pragma unroll
    for (int j = 0; j < ATT_CJ; j++)
#pragma unroll
        for (int e = 0; e < 8; e++) {
            int c = lane + 32 * j;
            qr[j][e] = c < nch ? qv[c * 8 + e] : 0.0f;
            acc[j][e] = 0.0f;
        }
    float m = -INFINITY, l = 0.0f;
    for (int p0 = p_begin + warp * ATT_PV; p0 < len; p0 += ATT_WARPS * ATT_PV) {
        uint4 w[ATT_PV][ATT_CJ];
        float s[ATT_PV];
#pragma unroll
        for (int u = 0; u < ATT_PV; u++) {
            int p = min(p0 + u, len - 1);
            const uint4 *row = (const uint4 *)(cache + ((size_t)table[p / bs] * bs + p % bs) * Lat);
#pragma unroll
            for (int j = 0; j < ATT_CJ; j++) {
                int c = lane + 32 * j;
                w[u][j] = c < nch ? __ldg(row + c) : make_uint4(0u, 0u, 0u, 0u);
            }
        }
#pragma unroll
        for (int u = 0; u < ATT_PV; u++) {
            float d = 0.0f;
#pragma unroll
            for (int j = 0; j < ATT_CJ; j++) {
                const uint32_t wv[4] = {w[u][j].x, w[u][j].y, w[u][j].z, w[u][j].w};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    d = fmaf(qr[j][2 * e], k3c_dev_bf16_lo(wv[e]), d);
                    d = fmaf(qr[j][2 * e + 1], k3c_dev_bf16_hi(wv[e]), d);
                }
            }
            s[u] = p0 + u < len ? k3c_warp_sum(d) * scale : -INFINITY;
        }
        float bm = -INFINITY;
#pragma unroll
        for (int u = 0; u < ATT_PV; u++) bm = fmaxf(bm, s[u]);
        if (bm > m) {
            float r = expf(m - bm); /* m = -inf on the first step: r = 0 */
            l *= r;
#pragma unroll
            for (int j = 0; j < ATT_CJ; j++)
#pragma unroll
                for (int e = 0; e < 8; e++) acc[j][e] *= r;
            m = bm;
        }
#pragma unroll
        for (int u = 0; u < ATT_PV; u++) {
            float pr = p0 + u < len ? expf(s[u] - m) : 0.0f;
            l += pr;
#pragma unroll
            for (int j = 0; j < ATT_CJ; j++) {
                if (lane + 32 * j >= vch) continue;
                const uint32_t wv[4] = {w[u][j].x, w[u][j].y, w[u][j].z, w[u][j].w};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    acc[j][2 * e] = fmaf(pr, k3c_dev_bf16_lo(wv[e]), acc[j][2 * e]);
                    acc[j][2 * e + 1] = fmaf(pr, k3c_dev_bf16_hi(wv[e]), acc[j][2 * e + 1]);
                }
            }
        }
    }
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
#pragma unroll
    for (int j = 0; j < ATT_CJ; j++) {
        int c = lane + 32 * j;
        if (c < vch)
#pragma unroll
            for (int e = 0; e < 8; e++) wo[warp * kvl + c * 8 + e] = acc[j][e];
    }
    __syncthreads();
    attend_finish(wm, wl, wo, wf, kvl, (size_t)t * Hm + h, ((size_t)t * Hm + h) * splits + z, eff, o_lat, part, lse);
    K3C_STAMP_BLOCK_END(K3C_KID_MLA_ATTEND_BF16V);
}

/* Attention by head groups: one block takes G heads of one row (G = 4, 8, 12 or 16, attend_hg_group) over
 * one split of its positions, so a cache row goes through L2 once per group instead of once per head. Per
 * tile of HG_P(EB) positions (32; 16 for an f32 cache), block of HG_THREADS threads:
 *  1. the tile's rows (raw cache bytes, Lat * EB each) are in shared memory, copied with 16-byte cp.async
 *     while the block computed the previous tile (two buffers); positions past the split's end copy its last
 *     position (finite bytes, masked below);
 *  2. scores: a unit of 4 heads x 4 positions is ksl lanes of one warp (ksl = 8 at G = 16); lane j sums
 *     the 4-element chunks c = j, j + ksl, .. of Lat (q in f32 from shared memory, in ascending c), then the
 *     ksl partials are summed by xor shuffles (a fixed tree); s * scale (-inf past the split's end) goes to
 *     ss[pos][head];
 *  3. softmax: warp w owns heads w and w + 8 for the whole block (its running max m and sum l in registers,
 *     lane = position): m' = max(m, tile max), r = e^(m - m'), p = e^(s - m') in place of s, l = l r + sum p
 *     (xor-shuffle tree); r to rs[head];
 *  4. values: thread (head quad vhq, chunk vc of kvl / 8) holds acc[4 heads][8 columns], scales it by r and
 *     adds p * cache[pos][8 vc .. + 8] over the tile's positions in order.
 * Three barriers a tile. End: one split in use (eff 1): o_lat = acc / l; several: [acc | m | l] to part in
 * the layout of the per-head kernels, and mla_attend_merge_kernel combines the splits. The bits depend on
 * Hm (the group size and the lane tree), kvl, rope and the split count only: no atomics, no timing. */
#define HG_THREADS 256
#define HG_BLOCKS_PER_SM 2 /* what the splits aim at: ~111 KB of shared memory a block at K3 dims (bf16) */
#define HG_P(EB) ((EB) == 4 ? 16 : 32)

__device__ __forceinline__ void mla_cp_async16(void *smem, const void *gmem) {
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(16) : "memory");
}
__device__ __forceinline__ void mla_cp_async_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void mla_cp_async_wait_all(void) { asm volatile("cp.async.wait_group %0;" ::"n"(0) : "memory"); }

/* Elements e .. e + 7 (e % 8 == 0) of a cache row in shared memory as f32. */
template <int EB>
__device__ __forceinline__ void hg_load8(const unsigned char *row, int e, float (&v)[8]) {
    if (EB == 2) {
        uint4 w = *(const uint4 *)(row + (size_t)e * 2);
        const uint32_t wv[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            v[2 * k] = k3c_dev_bf16_lo(wv[k]);
            v[2 * k + 1] = k3c_dev_bf16_hi(wv[k]);
        }
    } else if (EB == 1) {
        const uint32_t *w = (const uint32_t *)(row + e); /* 8-byte aligned: two words */
        uint32_t w0 = w[0], w1 = w[1];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            v[k] = k3c_dev_e4m3((uint8_t)(w0 >> (8 * k)));
            v[4 + k] = k3c_dev_e4m3((uint8_t)(w1 >> (8 * k)));
        }
    } else {
        const float4 *f = (const float4 *)(row + (size_t)e * 4);
        float4 a = f[0], b = f[1];
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
        v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    }
}

/* Elements e .. e + 3 (e % 4 == 0) of a cache row in shared memory as f32 (one 4-, 8- or 16-byte load). */
template <int EB>
__device__ __forceinline__ void hg_load4(const unsigned char *row, int e, float (&v)[4]) {
    if (EB == 2) {
        uint32_t w0 = ((const uint32_t *)(row + (size_t)e * 2))[0], w1 = ((const uint32_t *)(row + (size_t)e * 2))[1];
        v[0] = k3c_dev_bf16_lo(w0); v[1] = k3c_dev_bf16_hi(w0); v[2] = k3c_dev_bf16_lo(w1); v[3] = k3c_dev_bf16_hi(w1);
    } else if (EB == 1) {
        uint32_t w = *(const uint32_t *)(row + e);
#pragma unroll
        for (int k = 0; k < 4; k++) v[k] = k3c_dev_e4m3((uint8_t)(w >> (8 * k)));
    } else {
        float4 a = *(const float4 *)(row + (size_t)e * 4);
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    }
}

/* Copies positions p0 .. p0 + P - 1 of the row (clamped to p_end - 1) into a tile buffer, one commit group. */
template <int EB>
__device__ __forceinline__ void hg_load_tile(unsigned char *dst, const unsigned char *__restrict__ cache,
                                             const int *__restrict__ table, int bs, int rowb, int p0, int p_end) {
    constexpr int P = HG_P(EB);
    int nch = rowb / 16;
    for (int i = threadIdx.x; i < P * nch; i += HG_THREADS) {
        int pp = i / nch, c = i - pp * nch, p = min(p0 + pp, p_end - 1);
        const unsigned char *src = cache + ((size_t)table[p / bs] * bs + p % bs) * rowb + (size_t)c * 16;
        mla_cp_async16(dst + (size_t)pp * rowb + (size_t)c * 16, src);
    }
    mla_cp_async_commit();
}

/* Shared memory of a block: tiles [2][P][Lat * EB] bytes | q [G][Lat] | ss [P][G + 4] | rs [G] | ml [2][G]. */
static size_t attend_hg_smem(int eb, int G, int Lat) {
    int P = HG_P(eb);
    return (size_t)2 * P * Lat * eb + sizeof(float) * ((size_t)G * Lat + (size_t)P * (G + 4) + 3 * (size_t)G);
}

/* grid (T, ceil(Hm / G), splits), HG_THREADS threads; see above. */
template <int EB>
__global__ void __launch_bounds__(HG_THREADS, HG_BLOCKS_PER_SM)
mla_attend_hg_kernel(const float *__restrict__ q_abs, const int *__restrict__ table_off, const int *__restrict__ lens,
                     const int *__restrict__ tables, int bs, const unsigned char *__restrict__ cache, int Hm, int G,
                     int kvl, int rope, float scale, float *o_lat, float *__restrict__ part) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_MLA_ATTEND_HG);
    constexpr int P = HG_P(EB);
    extern __shared__ __align__(16) unsigned char hg_smem[];
    int Lat = kvl + rope, rowb = Lat * EB, GS = G + 4;
    unsigned char *tiles = hg_smem;
    float *qs = (float *)(hg_smem + (size_t)2 * P * rowb);
    float *ss = qs + (size_t)G * Lat, *rs = ss + P * GS, *ml = rs + G;
    int t = blockIdx.x, h0 = blockIdx.y * G, splits = gridDim.z, z = blockIdx.z, tid = threadIdx.x;
    int p_begin, p_end, eff;
    attend_split_range(lens[t], splits, z, &p_begin, &p_end, &eff);
    if (z >= eff) return; /* an unused split of a short row (block-uniform, before any barrier) */
    const int *table = tables + table_off[t];
    int nh = min(G, Hm - h0); /* heads of this group; the others have q = 0 and are not written */
    hg_load_tile<EB>(tiles, cache, table, bs, rowb, p_begin, p_end);
    for (int i = tid; i < G * Lat; i += HG_THREADS) {
        int hh = i / Lat;
        qs[i] = hh < nh ? q_abs[((size_t)t * Hm + h0) * Lat + i] : 0.0f;
    }
    /* score units: HQ head quads x P / 4 position quads, ksl lanes each (a power of 2 with ksl * units <=
     * HG_THREADS; units * ksl is a multiple of 32 for every G and P here, so whole warps are in or out). The
     * units of a warp share the head quad: their q loads are one broadcast, their cache loads 4 x 8 lanes x
     * 4 elements, so shared memory keeps pace with the FMAs (lane j's elements: 4c .. 4c + 3, c = j + ksl i) */
    int HQ = G / 4, units = HQ * (P / 4), ksl = 32;
    while (ksl * units > HG_THREADS) ksl >>= 1;
    int PQ = P / 4, su = tid / ksl, sj = tid % ksl, shq = su / PQ, spq = su % PQ;
    bool sact = su < units;
    int nchv = kvl / 8, vhq = tid / nchv, vc = tid % nchv, lane = tid & 31, warp = tid >> 5;
    bool vact = vhq < HQ;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    float acc[4][8];
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int e = 0; e < 8; e++) acc[a][e] = 0.0f;
    int ntiles = (p_end - p_begin + P - 1) / P;
    for (int it = 0; it < ntiles; it++) {
        int p0 = p_begin + it * P, np = min(P, p_end - p0);
        const unsigned char *kt = tiles + (size_t)(it & 1) * P * rowb;
        mla_cp_async_wait_all(); /* this tile's copies (the only ones in flight) */
        __syncthreads();         /* everyone's copies landed; the previous tile's readers are done */
        if (it + 1 < ntiles)
            hg_load_tile<EB>(tiles + (size_t)((it + 1) & 1) * P * rowb, cache, table, bs, rowb, p0 + P, p_end);
        if (sact) {
            float s[4][4];
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int u = 0; u < 4; u++) s[a][u] = 0.0f;
            for (int c = sj; c < Lat / 4; c += ksl) {
                float kv[4][4];
#pragma unroll
                for (int u = 0; u < 4; u++) hg_load4<EB>(kt + (size_t)(4 * spq + u) * rowb, 4 * c, kv[u]);
#pragma unroll
                for (int a = 0; a < 4; a++) {
                    float4 x = *(const float4 *)(qs + (size_t)(4 * shq + a) * Lat + 4 * c);
                    const float qv[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
                    for (int u = 0; u < 4; u++)
#pragma unroll
                        for (int e = 0; e < 4; e++) s[a][u] = fmaf(qv[e], kv[u][e], s[a][u]);
                }
            }
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    for (int o = ksl >> 1; o > 0; o >>= 1) s[a][u] += __shfl_xor_sync(0xffffffffu, s[a][u], o);
                    int pp = 4 * spq + u;
                    if (sj == 0) ss[pp * GS + 4 * shq + a] = pp < np ? s[a][u] * scale : -INFINITY;
                }
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < 2; k++) {
            int hh = warp + 8 * k; /* warp-uniform */
            if (hh < G) {
                float sv = lane < P ? ss[lane * GS + hh] : -INFINITY;
                float mn = fmaxf(m_run[k], k3c_warp_max(sv)); /* finite: position p0 < p_end is in the tile */
                float r = expf(m_run[k] - mn);                 /* m = -inf on the first tile: r = 0 */
                float pv = expf(sv - mn);                      /* masked positions: 0 */
                l_run[k] = l_run[k] * r + k3c_warp_sum(pv);
                m_run[k] = mn;
                if (lane < P) ss[lane * GS + hh] = pv;
                if (lane == 0) rs[hh] = r;
            }
        }
        __syncthreads();
        if (vact) {
#pragma unroll
            for (int a = 0; a < 4; a++) {
                float r = rs[4 * vhq + a];
#pragma unroll
                for (int e = 0; e < 8; e++) acc[a][e] *= r;
            }
            for (int pp = 0; pp < np; pp++) {
                float v[8];
                hg_load8<EB>(kt + (size_t)pp * rowb, 8 * vc, v);
                float4 pr = *(const float4 *)(ss + pp * GS + 4 * vhq);
                const float pa[4] = {pr.x, pr.y, pr.z, pr.w};
#pragma unroll
                for (int a = 0; a < 4; a++)
#pragma unroll
                    for (int e = 0; e < 8; e++) acc[a][e] = fmaf(pa[a], v[e], acc[a][e]);
            }
        }
    }
    if (lane == 0)
#pragma unroll
        for (int k = 0; k < 2; k++)
            if (warp + 8 * k < G) {
                ml[warp + 8 * k] = m_run[k];
                ml[G + warp + 8 * k] = l_run[k];
            }
    __syncthreads();
    if (!vact) return;
#pragma unroll
    for (int a = 0; a < 4; a++) {
        int hh = 4 * vhq + a;
        if (hh >= nh) break;
        size_t rh = (size_t)t * Hm + h0 + hh;
        if (eff == 1) {
            float inv = 1.0f / ml[G + hh];
            float *out = o_lat + rh * kvl + 8 * vc;
#pragma unroll
            for (int e = 0; e < 8; e++) out[e] = acc[a][e] * inv;
        } else {
            float *out = part + (rh * splits + z) * (size_t)(kvl + 2);
#pragma unroll
            for (int e = 0; e < 8; e++) out[8 * vc + e] = acc[a][e];
            if (vc == 0) {
                out[kvl] = ml[hh];
                out[kvl + 1] = ml[G + hh];
            }
        }
    }
    K3C_STAMP_BLOCK_END(K3C_KID_MLA_ATTEND_HG);
}

/* The head-group kernels' limits: their tiles follow the latent width, so all a block may opt in to
 * (kernel_limits.h). */
extern "C" int k3c_cuda_mla_limits(void) {
    K3C_CUDA_TRY(k3c_cuda_smem_limit((const void *)mla_attend_hg_kernel<1>, 0));
    K3C_CUDA_TRY(k3c_cuda_smem_limit((const void *)mla_attend_hg_kernel<2>, 0));
    K3C_CUDA_TRY(k3c_cuda_smem_limit((const void *)mla_attend_hg_kernel<4>, 0));
    return K3C_OK;
}

/* grid (T, Hm): o_lat[t, h] = sum_z acc_z e^(M_z - M) / sum_z L_z e^(M_z - M), M = max_z M_z, z in order over
 * the eff splits the row uses (attend_split_range; eff 1: the attention block wrote o_lat, nothing to do).
 * The factors e^(M_z - M) are computed once per split (shared). */
__global__ void mla_attend_merge_kernel(const float *__restrict__ part, const int *__restrict__ lens, int splits,
                                        int Hm, int kvl, float *o_lat, float *__restrict__ lse) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_MLA_ATTEND_MERGE);
    __shared__ float fz[ATT_MAX_SPLITS];
    __shared__ float Ls;
    int t = blockIdx.x, h = blockIdx.y, pb, pe, eff;
    attend_split_range(lens[t], splits, 0, &pb, &pe, &eff);
    if (eff <= 1) return;
    const float *pz = part + ((size_t)t * Hm + h) * splits * (size_t)(kvl + 2);
    float M = -INFINITY;
    for (int z = 0; z < eff; z++) M = fmaxf(M, pz[(size_t)z * (kvl + 2) + kvl]);
    for (int z = threadIdx.x; z < eff; z += blockDim.x) fz[z] = expf(pz[(size_t)z * (kvl + 2) + kvl] - M);
    __syncthreads();
    if (threadIdx.x == 0) {
        float L = 0.0f;
        for (int z = 0; z < eff; z++) L += pz[(size_t)z * (kvl + 2) + kvl + 1] * fz[z];
        Ls = L;
    }
    __syncthreads();
    float inv = 1.0f / Ls;
    if (lse && threadIdx.x == 0) lse[(size_t)t * Hm + h] = M + logf(Ls);
    float *out = o_lat + ((size_t)t * Hm + h) * kvl;
    for (int i = threadIdx.x; i < kvl; i += blockDim.x) {
        float s = 0.0f;
        /* unrolled so the loads of several splits are in flight at once (the sum stays in z order) */
#pragma unroll 8
        for (int z = 0; z < eff; z++) s = fmaf(pz[(size_t)z * (kvl + 2) + i], fz[z], s);
        out[i] = s * inv;
    }
    K3C_STAMP_BLOCK_END(K3C_KID_MLA_ATTEND_MERGE);
}


extern "C" size_t k3c_cuda_mla_attend_split_floats(int kvl) {
    return kvl > 0 ? (size_t)2 * ATT_BLOCKS_PER_SM * k3c_cuda_sm_count() * (size_t)(kvl + 2) : 0;
}

/* Splits per (row, head): enough blocks for ATT_BLOCKS_PER_SM per SM, a function of T and Hm only, so the
 * stock forward and a graph captured for the same rows split (and round) alike; 1 without scratch or when
 * T * Hm blocks already fill the GPU. T * Hm * splits <= 2 * ATT_BLOCKS_PER_SM * SMs whenever splits > 1,
 * which k3c_cuda_mla_attend_split_floats covers. */
static int attend_splits(int T, int Hm, int kvl, const float *part, size_t part_floats) {
    long long rows = (long long)T * Hm, want = (long long)ATT_BLOCKS_PER_SM * k3c_cuda_sm_count();
    if (!part || rows >= want) return 1;
    long long s = (want + rows - 1) / rows;
    if (s > ATT_MAX_SPLITS) s = ATT_MAX_SPLITS;
    while (s > 1 && (size_t)(rows * s) * (size_t)(kvl + 2) > part_floats) s--;
    return (int)s;
}

/* The head group of mla_attend_hg_kernel: at most 16 heads (softmax: 2 heads per warp) and as many as keep the
 * value threads (G / 4 head quads x kvl / 8 chunks) within the block; Hm split into equal groups rounded up
 * to a multiple of 4 (Hm 96: 6 groups of 16; 40: 3 of 16, the last one 8 heads; 6: one of 8). 0: none fits. */
static int attend_hg_group(int Hm, int kvl) {
    int hq = HG_THREADS / (kvl / 8);
    int gmax = 4 * (hq < 4 ? hq : 4);
    if (gmax < 4) return 0;
    int groups = (Hm + gmax - 1) / gmax, per = (Hm + groups - 1) / groups;
    return (per + 3) / 4 * 4;
}

/* Splits per row for the head-group kernel: enough blocks for HG_BLOCKS_PER_SM per SM (a function of T, Hm and
 * kvl only, as attend_splits), and rows * Hm * splits * (kvl + 2) within part. */
static int attend_hg_splits(int T, int groups, int Hm, int kvl, const float *part, size_t part_floats) {
    long long blocks = (long long)T * groups, want = (long long)HG_BLOCKS_PER_SM * k3c_cuda_sm_count();
    if (!part || blocks >= want) return 1;
    long long s = (want + blocks - 1) / blocks;
    if (s > ATT_MAX_SPLITS) s = ATT_MAX_SPLITS;
    while (s > 1 && (size_t)((long long)T * Hm * s) * (size_t)(kvl + 2) > part_floats) s--;
    return (int)s;
}

#define MLA_HG_MIN_ROWS 16

static int mla_attend(const float *q_abs, const int *table_off, const int *lens, const int *tables, int block_size,
                      const void *cache, int elem_bytes, int T, int Hm, int kvl, int rope, float scale, float *o_lat,
                      float *part, size_t part_floats, float *lse, cudaStream_t stream) {
    if (T == 0) return K3C_OK;
    if (kvl + rope > 32 * ATT_MAXJ || kvl <= 0 || rope < 0 || block_size <= 0)
        return k3c_errorf("k3c_cuda_mla_attend: unsupported latent %d + %d (at most %d) or block size %d", kvl, rope,
                          32 * ATT_MAXJ, block_size);
    if (elem_bytes != 1 && elem_bytes != 2 && elem_bytes != 4)
        return k3c_errorf("k3c_cuda_mla_attend: element size %d", elem_bytes);
    /* The head-group kernel from MLA_HG_MIN_ROWS rows (2026-11-30, bench_gpu mlacore, 96 heads: 64 rows x 64
     * positions 189 -> 79 us, x 4096 8.0 -> 2.9 ms, 8 rows x 4096 928 -> 591 us; but 1 row x 64 positions 16
     * -> 27 us). The choice is made here, where the row count is known and the lengths are not (a captured
     * graph serves every length). K3C_MLA_HG=1 / 0: at every row count / never. */
    static int hg_mode = -1;
    if (hg_mode < 0) {
        const char *v = getenv("K3C_MLA_HG");
        hg_mode = v && v[0] == '1' ? 1 : v && v[0] == '0' ? 0 : 2;
    }
    /* the head-group kernel has no LSE output: DCP's partials take the per-head kernels */
    int hg_on = !lse && (hg_mode == 1 || (hg_mode == 2 && T >= MLA_HG_MIN_ROWS));
    int Lat = kvl + rope, G = attend_hg_group(Hm, kvl);
    if (hg_on && G > 0 && kvl % 8 == 0 && rope % 8 == 0 && (Lat * elem_bytes) % 16 == 0 &&
        ((uintptr_t)cache & 15) == 0) {
        int groups = (Hm + G - 1) / G, splits = attend_hg_splits(T, groups, Hm, kvl, part, part_floats);
        size_t smem = attend_hg_smem(elem_bytes, G, Lat);
        dim3 grid(T, groups, splits);
        const unsigned char *c8 = (const unsigned char *)cache;
        /* above 48 KB of dynamic shared memory: the limits raised once per device (cuda/kernel_limits.h) */
        K3C_TRY(k3c_cuda_kernels_prepare());
        if (elem_bytes == 2)
            mla_attend_hg_kernel<2><<<grid, HG_THREADS, smem, stream>>>(q_abs, table_off, lens, tables, block_size, c8,
                                                                        Hm, G, kvl, rope, scale, o_lat, part);
        else if (elem_bytes == 1)
            mla_attend_hg_kernel<1><<<grid, HG_THREADS, smem, stream>>>(q_abs, table_off, lens, tables, block_size, c8,
                                                                        Hm, G, kvl, rope, scale, o_lat, part);
        else
            mla_attend_hg_kernel<4><<<grid, HG_THREADS, smem, stream>>>(q_abs, table_off, lens, tables, block_size, c8,
                                                                        Hm, G, kvl, rope, scale, o_lat, part);
        K3C_CUDA_LAUNCHED("mla_attend_hg");
        if (splits > 1) {
            mla_attend_merge_kernel<<<dim3(T, Hm), 256, 0, stream>>>(part, lens, splits, Hm, kvl, o_lat, NULL);
            K3C_CUDA_LAUNCHED("mla_attend merge");
        }
        return K3C_OK;
    }
    int splits = attend_splits(T, Hm, kvl, part, part_floats);
    dim3 grid(T, Hm, splits);
    size_t smem = (size_t)ATT_WARPS * kvl * sizeof(float);
    /* K3C_MLA_GENERIC=1: the 2-byte-load kernel for a bf16 cache too (a benchmark comparison: which of the two
     * is faster is not measured yet) */
    static int generic = -1;
    if (generic < 0) {
        const char *v = getenv("K3C_MLA_GENERIC");
        generic = v && v[0] == '1';
    }
    if (elem_bytes == 2 && !generic && (kvl + rope) % 8 == 0 && kvl % 8 == 0 && kvl + rope <= 256 * ATT_CJ &&
        ((uintptr_t)cache & 15) == 0)
        mla_attend_bf16v_kernel<<<grid, ATT_WARPS * 32, smem, stream>>>(q_abs, table_off, lens, tables, block_size,
                                                                         (const uint16_t *)cache, Hm, kvl, rope, scale,
                                                                         o_lat, part, lse);
    else if (elem_bytes == 2)
        mla_attend_kernel<2><<<grid, ATT_WARPS * 32, smem, stream>>>(q_abs, table_off, lens, tables, block_size, cache,
                                                                      Hm, kvl, rope, scale, o_lat, part, lse);
    else if (elem_bytes == 1)
        mla_attend_kernel<1><<<grid, ATT_WARPS * 32, smem, stream>>>(q_abs, table_off, lens, tables, block_size, cache,
                                                                      Hm, kvl, rope, scale, o_lat, part, lse);
    else if (elem_bytes == 4)
        mla_attend_kernel<4><<<grid, ATT_WARPS * 32, smem, stream>>>(q_abs, table_off, lens, tables, block_size, cache,
                                                                      Hm, kvl, rope, scale, o_lat, part, lse);
    else
        return k3c_errorf("k3c_cuda_mla_attend: element size %d", elem_bytes);
    K3C_CUDA_LAUNCHED("mla_attend");
    if (splits > 1) {
        mla_attend_merge_kernel<<<dim3(T, Hm), 256, 0, stream>>>(part, lens, splits, Hm, kvl, o_lat, lse);
        K3C_CUDA_LAUNCHED("mla_attend merge");
    }
    return K3C_OK;
}

extern "C" int k3c_cuda_mla_attend(const float *q_abs, const int *table_off, const int *lens, const int *tables,
                                   int block_size, const void *cache, int elem_bytes, int T, int Hm, int kvl, int rope,
                                   float scale, float *o_lat, float *part, size_t part_floats, cudaStream_t stream) {
    return mla_attend(q_abs, table_off, lens, tables, block_size, cache, elem_bytes, T, Hm, kvl, rope, scale, o_lat, part,
                      part_floats, NULL, stream);
}

/* grid (T, Hm): a row that sees none of the rank's positions (lens 0: every attention block returned at once)
 * gets the empty partial, o_lat 0 and lse -inf. */
__global__ void mla_part_empty_kernel(const int *__restrict__ lens, int Hm, int kvl, float *o_lat, float *lse) {
    int t = blockIdx.x, h = blockIdx.y;
    if (lens[t] > 0) return;
    for (int i = threadIdx.x; i < kvl; i += blockDim.x) o_lat[((size_t)t * Hm + h) * kvl + i] = 0.0f;
    if (threadIdx.x == 0) lse[(size_t)t * Hm + h] = -INFINITY;
}

extern "C" int k3c_cuda_mla_attend_lse(const float *q_abs, const int *table_off, const int *lens, const int *tables,
                                       int block_size, const void *cache, int elem_bytes, int T, int Hm, int kvl,
                                       int rope, float scale, float *o_lat, float *lse, float *part, size_t part_floats,
                                       cudaStream_t stream) {
    if (T == 0) return K3C_OK;
    if (!lse) return k3c_errorf("k3c_cuda_mla_attend_lse: no lse output");
    K3C_TRY(mla_attend(q_abs, table_off, lens, tables, block_size, cache, elem_bytes, T, Hm, kvl, rope, scale, o_lat,
                       part, part_floats, lse, stream));
    mla_part_empty_kernel<<<dim3(T, Hm), 128, 0, stream>>>(lens, Hm, kvl, o_lat, lse);
    K3C_CUDA_LAUNCHED("mla_part_empty");
    return K3C_OK;
}

/* grid (T, Hm): the exact merge of n DCP partials (backend.h mla_merge) into lat [T, Hm, kvl]: the factors
 * e^(lse_r - M) once per block (shared), then per element the sum over r in order, as the split merge above. */
#define MERGE_MAX_PARTS 64
__global__ void mla_dcp_merge_kernel(const float *__restrict__ o_parts, const float *__restrict__ lses, size_t stride,
                                     int n, int Hm, int kvl, float *lat) {
    __shared__ float f[MERGE_MAX_PARTS];
    __shared__ float inv_s;
    int t = blockIdx.x, h = blockIdx.y;
    size_t rh = (size_t)t * Hm + h, lp = stride, op = stride;
    if (threadIdx.x == 0) {
        float M = -INFINITY;
        for (int r = 0; r < n; r++) M = fmaxf(M, lses[r * lp + rh]);
        float L = 0.0f;
        for (int r = 0; r < n; r++) {
            float x = lses[r * lp + rh];
            f[r] = x == -INFINITY ? 0.0f : expf(x - M);
            L += f[r];
        }
        inv_s = L > 0.0f ? 1.0f / L : 0.0f;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kvl; i += blockDim.x) {
        float s = 0.0f;
        for (int r = 0; r < n; r++) s = fmaf(f[r], o_parts[r * op + rh * kvl + i], s);
        lat[rh * kvl + i] = s * inv_s;
    }
}

extern "C" int k3c_cuda_mla_dcp_merge(const float *o_parts, const float *lses, size_t stride, int n, int T, int Hm,
                                      int kvl, float *lat, cudaStream_t stream) {
    if (T == 0) return K3C_OK;
    if (n < 1 || n > MERGE_MAX_PARTS) return k3c_errorf("k3c_cuda_mla_dcp_merge: %d parts (1 .. %d)", n, MERGE_MAX_PARTS);
    mla_dcp_merge_kernel<<<dim3(T, Hm), 128, 0, stream>>>(o_parts, lses, stride, n, Hm, kvl, lat);
    K3C_CUDA_LAUNCHED("mla_dcp_merge");
    return K3C_OK;
}

K3C_STAMP_TU(mla) /* K3C_CUDA_PROFILE=3: this file's stamped kernels (cuda/stamp.cuh) */
