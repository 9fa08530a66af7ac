/* MLA expanded form (cuda/mla_expanded.h): latent gather, decompression through kv_b (the GEMM launcher),
 * and a tiled causal attention with an online softmax on f32 CUDA cores. */
#include "cuda/mla_expanded.h"

#include <math.h>

#include "cuda/check.h"
#include "cuda/common.cuh"
#include "cuda/kernel_limits.h"

/* ---- 1. gather ---- */

/* One block per position j of the pass: c[j] = cache row[0:kvl], pe[j] = cache row[kvl:kvl + rope]. */
__global__ void mla_exp_gather_kernel(const void *__restrict__ cache, int elem_bytes, const int *__restrict__ table,
                                      int bs, int p0, int kvl, int rope, float *__restrict__ c, float *__restrict__ pe) {
    int j = blockIdx.x, p = p0 + j, Lat = kvl + rope;
    size_t base = ((size_t)table[p / bs] * bs + p % bs) * Lat;
    for (int e = threadIdx.x; e < Lat; e += blockDim.x) {
        float v = elem_bytes == 2   ? k3c_dev_bf16(((const uint16_t *)cache)[base + e])
                  : elem_bytes == 1 ? k3c_dev_e4m3(((const uint8_t *)cache)[base + e])
                                    : ((const float *)cache)[base + e];
        if (e < kvl) c[(size_t)j * kvl + e] = v;
        else pe[(size_t)j * rope + (e - kvl)] = v;
    }
}

/* ---- 3. attention ---- */

#define XQ 64  /* query rows per block */
#define XK 32  /* key positions per tile */
#define XT 256 /* threads: tx = tid & 15 (keys tx, tx + 16; v columns tx + 16 c), ty = tid >> 4 (rows 4 ty .. 4 ty + 3) */
#define XPS (XQ + 4) /* row stride of the probability tile (float4 stores spread over banks) */

__device__ __forceinline__ float rnd_if(float v, int r) { return r ? k3c_dev_bf16(k3c_dev_to_bf16(v)) : v; }

/* Shared memory, floats (every part a multiple of 4 floats, so the float4 views stay 16-byte aligned):
 *   sq [qh][XQ]      the block's queries, transposed (a float4 = 4 rows of one dim)
 *   sk [XK][qh + 1]  key tile [k_nope | k_pe]; the odd stride puts the 16 keys a half-warp reads in 16 banks
 *   sv [XK][vh]      value tile
 *   sp [XK][XPS]     probabilities of the tile, transposed (a float4 = 4 rows of one key) */
static size_t attend_smem_bytes(int qh, int vh) {
    return sizeof(float) * ((size_t)qh * XQ + (size_t)XK * (qh + 1) + (size_t)XK * vh + (size_t)XK * XPS);
}

/* grid (ceil(n / XQ), Hm): block (tile, h) owns rows [i0, i0 + XQ) of head h over the pass's positions
 * [p0, p0 + len). Thread (tx, ty) holds the scores of rows 4 ty + r, keys tx and tx + 16 of a tile, and the
 * output of the same rows at columns tx + 16 c (c < VC). The running max / sum of a row are replicated in the
 * 16 threads of its half-warp (reduced by shuffles). first: no state to load; last: normalize and write o,
 * else the state goes to acc [n, Hm, vh] and ml [n, Hm, 2]. Rows past n are computed (zeros) but never
 * stored; they see every key of the segment, so no row has an empty softmax. */
template <int VC>
__global__ void __launch_bounds__(XT)
mla_exp_attend_kernel(const float *__restrict__ q, int n, int pos, int Hm, int nope, int rope, int vh,
                      const float *__restrict__ kv, const float *__restrict__ pe, int p0, int len, float scale,
                      int round_kv, int first, int last, float *__restrict__ acc, float *__restrict__ ml, int round_o,
                      float *__restrict__ o) {
    extern __shared__ __align__(16) float sm[];
    int qh = nope + rope, kw = Hm * (nope + vh), ks = qh + 1;
    float *sq = sm, *sk = sq + (size_t)qh * XQ, *sv = sk + (size_t)XK * ks, *sp = sv + (size_t)XK * vh;
    int h = blockIdx.y, i0 = (gridDim.x - 1 - blockIdx.x) * XQ; /* the longest (last) row tiles start first */
    int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4, lane = tid & 31, warp = tid >> 5;
    int nr = min(XQ, n - i0);
    size_t hq = (size_t)h * qh, hk = (size_t)h * (nope + vh);

    for (int idx = tid; idx < XQ * qh; idx += XT) {
        int i = idx / qh, d = idx - i * qh; /* d fastest: coalesced reads (the transposed stores conflict, once) */
        sq[d * XQ + i] = i < nr ? q[(size_t)(i0 + i) * Hm * qh + hq + d] : 0.0f;
    }

    float m[4], l[4], oa[4][VC];
    int lim[4]; /* last position row 4 ty + r sees (rows past n: the segment's last) */
#pragma unroll
    for (int r = 0; r < 4; r++) {
        int i = i0 + 4 * ty + r;
        lim[r] = pos + min(i, n - 1);
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int c = 0; c < VC; c++) oa[r][c] = 0.0f;
        if (!first && i < n) {
            size_t s = (size_t)i * Hm + h;
            m[r] = ml[2 * s];
            l[r] = ml[2 * s + 1];
#pragma unroll
            for (int c = 0; c < VC; c++)
                if (tx + 16 * c < vh) oa[r][c] = acc[s * vh + tx + 16 * c];
        }
    }

    int pend = p0 + len;                       /* the pass's positions end here */
    int kend = min(pend, pos + i0 + nr);       /* the block's last row sees positions < pos + i0 + nr */
    for (int kt = p0; kt < kend; kt += XK) {
        __syncthreads(); /* the previous tile's sk / sv / sp are consumed (and sq is written, first time) */
        for (int j = warp; j < XK; j += XT / 32) {
            int kp = kt + j;
            const float *kr = kv + (size_t)(kp - p0) * kw + hk;
            for (int d = lane; d < qh; d += 32) {
                float v = 0.0f;
                if (kp < pend) v = d < nope ? rnd_if(kr[d], round_kv) : pe[(size_t)(kp - p0) * rope + (d - nope)];
                sk[j * ks + d] = v;
            }
            for (int e = lane; e < vh; e += 32)
                sv[j * vh + e] = kp < pend ? rnd_if(kr[nope + e], round_kv) : 0.0f; /* zeros: 0 * v stays 0 */
        }
        __syncthreads();

        float s[4][2];
#pragma unroll
        for (int r = 0; r < 4; r++) s[r][0] = s[r][1] = 0.0f;
        const float *k0 = sk + tx * ks, *k1 = sk + (tx + 16) * ks;
#pragma unroll 4
        for (int d = 0; d < qh; d++) {
            float4 qv = *(const float4 *)(sq + d * XQ + 4 * ty);
            float a = k0[d], b = k1[d];
            s[0][0] = fmaf(qv.x, a, s[0][0]), s[0][1] = fmaf(qv.x, b, s[0][1]);
            s[1][0] = fmaf(qv.y, a, s[1][0]), s[1][1] = fmaf(qv.y, b, s[1][1]);
            s[2][0] = fmaf(qv.z, a, s[2][0]), s[2][1] = fmaf(qv.z, b, s[2][1]);
            s[3][0] = fmaf(qv.w, a, s[3][0]), s[3][1] = fmaf(qv.w, b, s[3][1]);
        }

        float p[4][2];
#pragma unroll
        for (int r = 0; r < 4; r++) {
            float tmax = -INFINITY;
#pragma unroll
            for (int u = 0; u < 2; u++) {
                int kp = kt + tx + 16 * u;
                s[r][u] = kp <= lim[r] && kp < pend ? s[r][u] * scale : -INFINITY;
                tmax = fmaxf(tmax, s[r][u]);
            }
#pragma unroll
            for (int off = 8; off > 0; off >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));
            float mn = fmaxf(m[r], tmax);
            /* m = -inf before the first visible key: alpha = 0 (l and oa are 0 then); mn = -inf only while no
             * key has been visible at all: nothing to rescale */
            float alpha = mn == -INFINITY ? 1.0f : expf(m[r] - mn);
            float rs = 0.0f;
#pragma unroll
            for (int u = 0; u < 2; u++) {
                p[r][u] = s[r][u] == -INFINITY ? 0.0f : expf(s[r][u] - mn);
                rs += p[r][u];
            }
#pragma unroll
            for (int off = 8; off > 0; off >>= 1) rs += __shfl_xor_sync(0xffffffffu, rs, off);
            l[r] = l[r] * alpha + rs;
            m[r] = mn;
#pragma unroll
            for (int c = 0; c < VC; c++) oa[r][c] *= alpha;
        }
#pragma unroll
        for (int u = 0; u < 2; u++)
            *(float4 *)(sp + (tx + 16 * u) * XPS + 4 * ty) = make_float4(p[0][u], p[1][u], p[2][u], p[3][u]);
        __syncthreads();

        int jn = min(XK, pend - kt); /* keys past the pass have p = 0 and v = 0 */
        for (int j = 0; j < jn; j++) {
            float4 pv = *(const float4 *)(sp + j * XPS + 4 * ty);
            const float *vr = sv + j * vh;
#pragma unroll
            for (int c = 0; c < VC; c++) {
                int col = tx + 16 * c;
                float v = col < vh ? vr[col] : 0.0f;
                oa[0][c] = fmaf(pv.x, v, oa[0][c]);
                oa[1][c] = fmaf(pv.y, v, oa[1][c]);
                oa[2][c] = fmaf(pv.z, v, oa[2][c]);
                oa[3][c] = fmaf(pv.w, v, oa[3][c]);
            }
        }
    }

#pragma unroll
    for (int r = 0; r < 4; r++) {
        int i = i0 + 4 * ty + r;
        if (i >= n) continue;
        size_t s = (size_t)i * Hm + h;
        if (last) {
            float inv = 1.0f / l[r];
#pragma unroll
            for (int c = 0; c < VC; c++) {
                int col = tx + 16 * c;
                if (col < vh) o[(size_t)i * Hm * vh + (size_t)h * vh + col] = rnd_if(oa[r][c] * inv, round_o);
            }
        } else {
            if (tx == 0) {
                ml[2 * s] = m[r];
                ml[2 * s + 1] = l[r];
            }
#pragma unroll
            for (int c = 0; c < VC; c++)
                if (tx + 16 * c < vh) acc[s * vh + tx + 16 * c] = oa[r][c];
        }
    }
}

/* The attend kernels' limits: their tiles follow the head dims, so all a block may opt in to
 * (kernel_limits.h). */
extern "C" int k3c_cuda_mla_expanded_limits(void) {
    K3C_CUDA_TRY(k3c_cuda_smem_limit((const void *)mla_exp_attend_kernel<8>, 0));
    K3C_CUDA_TRY(k3c_cuda_smem_limit((const void *)mla_exp_attend_kernel<16>, 0));
    return K3C_OK;
}

template <int VC>
static int attend_launch(const float *q, int n, int pos, int Hm, int nope, int rope, int vh, const float *kv,
                         const float *pe, int p0, int len, float scale, int round_kv, int first, int last, float *acc,
                         float *ml, int round_o, float *o, cudaStream_t stream) {
    size_t smem = attend_smem_bytes(nope + rope, vh);
    K3C_TRY(k3c_cuda_kernels_prepare()); /* above 48 KB: the limits raised once per device (cuda/kernel_limits.h) */
    dim3 grid((n + XQ - 1) / XQ, Hm);
    mla_exp_attend_kernel<VC><<<grid, XT, smem, stream>>>(q, n, pos, Hm, nope, rope, vh, kv, pe, p0, len, scale,
                                                          round_kv, first, last, acc, ml, round_o, o);
    K3C_CUDA_LAUNCHED("mla_exp_attend");
    return K3C_OK;
}

/* ---- the segment ---- */

static size_t al64(size_t floats) { return (floats + 63) & ~(size_t)63; } /* 256 bytes */

extern "C" size_t k3c_cuda_mla_expanded_scratch_bytes(int chunk, int max_rows, int Hm, int nope, int rope, int vh,
                                                      int kvl) {
    size_t C = (size_t)(chunk > 0 ? chunk : 1), R = (size_t)(max_rows > 0 ? max_rows : 1), H = (size_t)Hm;
    return sizeof(float) * (al64(C * kvl) + al64(C * rope + 1) + al64(C * H * (nope + vh)) + al64(R * H * vh) +
                            al64(R * H * 2));
}

extern "C" int k3c_cuda_mla_expanded(k3c_cuda_gemm *gemm, const uint16_t *kv_b, const float *q, int n, int pos,
                                     const int *table, int block_size, const void *cache, int elem_bytes, int Hm,
                                     int nope, int rope, int vh, int kvl, float scale, int round_bf16, void *scratch,
                                     int chunk, int max_rows, float *o, cudaStream_t stream) {
    if (n == 0) return K3C_OK;
    if (n < 0 || pos < 0 || Hm <= 0 || nope < 0 || rope < 0 || vh <= 0 || kvl <= 0 || nope + rope <= 0 ||
        block_size <= 0 || chunk <= 0)
        return k3c_errorf("k3c_cuda_mla_expanded: bad arguments n %d pos %d heads %d nope %d rope %d v %d kv_lora %d "
                          "block_size %d chunk %d", n, pos, Hm, nope, rope, vh, kvl, block_size, chunk);
    if (n > max_rows)
        return k3c_errorf("k3c_cuda_mla_expanded: %d query rows, scratch sized for %d (max_rows)", n, max_rows);
    if (elem_bytes != 1 && elem_bytes != 2 && elem_bytes != 4)
        return k3c_errorf("k3c_cuda_mla_expanded: cache element of %d bytes (1, 2 or 4)", elem_bytes);
    if (vh > K3C_CUDA_MLA_EXP_MAX_V)
        return k3c_errorf("k3c_cuda_mla_expanded: v_head_dim %d > %d", vh, K3C_CUDA_MLA_EXP_MAX_V);
    int dev = 0, optin = 0;
    K3C_CUDA_TRY(cudaGetDevice(&dev));
    K3C_CUDA_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    size_t smem = attend_smem_bytes(nope + rope, vh);
    if (smem > (size_t)optin)
        return k3c_errorf("k3c_cuda_mla_expanded: head dims nope %d + rope %d, v %d need %zu bytes of shared memory, "
                          "the device allows %d per block", nope, rope, vh, smem, optin);
    if (gemm && gemm->lt && chunk > K3C_CUDA_GEMV_MAX_T && (size_t)chunk * kvl > gemm->xbf_elems)
        return k3c_errorf_kind(K3C_ERROR_INTERNAL, "k3c_cuda_mla_expanded: cuBLASLt staging holds %zu elements, a pass of %d positions needs "
                          "%zu", gemm->xbf_elems, chunk, (size_t)chunk * kvl);

    size_t C = (size_t)chunk, R = (size_t)max_rows, H = (size_t)Hm;
    float *lat = (float *)scratch;
    float *pe = lat + al64(C * kvl);
    float *kv = pe + al64(C * rope + 1);
    float *acc = kv + al64(C * H * (nope + vh));
    float *ml = acc + al64(R * H * vh);
    int N = pos + n; /* positions attended: 0 .. pos + n - 1 */
    for (int p0 = 0; p0 < N; p0 += chunk) {
        int len = N - p0 < chunk ? N - p0 : chunk;
        mla_exp_gather_kernel<<<len, 128, 0, stream>>>(cache, elem_bytes, table, block_size, p0, kvl, rope, lat, pe);
        K3C_CUDA_LAUNCHED("mla_exp_gather");
        K3C_TRY(k3c_cuda_matmul_bf16(gemm, kv_b, Hm * (nope + vh), kvl, lat, len, kv, stream));
        int first = p0 == 0, last = p0 + len == N;
        if (vh <= 128)
            K3C_TRY(attend_launch<8>(q, n, pos, Hm, nope, rope, vh, kv, pe, p0, len, scale, round_bf16, first, last,
                                     acc, ml, round_bf16, o, stream));
        else
            K3C_TRY(attend_launch<16>(q, n, pos, Hm, nope, rope, vh, kv, pe, p0, len, scale, round_bf16, first, last,
                                      acc, ml, round_bf16, o, stream));
    }
    return K3C_OK;
}
