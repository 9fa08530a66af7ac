/* AttnRes mix: several blocks per row, each computing every source's logit (the same code on the same data,
 * so the same bits in every block of the row) and then mixing its own chunk of the row; softmax in f32. */
#include "cuda/attnres.h"

#include "cuda/check.h"
#include "cuda/common.cuh"

#define ATTNRES_THREADS 512
#define ATTNRES_SRC_TILE 4    /* sources reduced together: 8 partial sums per thread, one barrier pair */
#define ATTNRES_EPT 8         /* elements of a row per thread and pass in the logits: 4 x 8 loads in flight */
#define ATTNRES_MAX_CHUNKS 16 /* blocks per row at most */

/* The pending prefix of k3c_cuda_attnres_mix_pending: the last source, formed per element as the residual
 * adds would have stored it (add_kernel's a + b then the bf16 rounding, elementwise.cu). */
struct attnres_pending {
    const float *p_old, *a1, *a2;
    float *p_new;
    int round;
};

/* From the three loaded addends (a2v, pv unused when a2, p_old are NULL). */
__device__ __forceinline__ float attnres_pending_combine(const attnres_pending &q, float a1v, float a2v, float pv) {
    return k3c_dev_residual(a1v, q.a2 != NULL, a2v, q.p_old != NULL, pv, q.round);
}

__device__ __forceinline__ float attnres_pending_value(const attnres_pending &q, size_t i) {
    return attnres_pending_combine(q, q.a1[i], q.a2 ? q.a2[i] : 0.0f, q.p_old ? q.p_old[i] : 0.0f);
}

/* Grid (T, chunks): blockIdx.x the row, blockIdx.y its chunk. The old kernel (one block of 256 threads per
 * row, one source at a time with two block reductions each, then the mix reading every source again) took
 * 27.7 us a call at T = 1 on the H200, 24 calls per k3-slice step. Here 512 threads reduce 4 sources at once
 * (up to 4 x ATTNRES_EPT independent loads in flight per thread, one barrier pair per 4 sources), and the
 * mix is split over the row's blocks. Why redundant logits rather than a reduction across blocks: that would need a second launch
 * or a grid barrier, while re-reading the row's sources (L2-resident activations) in each block costs
 * chunks * nsrc * D * 4 bytes of L2 traffic, small at the T where chunks > 1. Reduction order: per thread,
 * d = tid, tid + 512, ... with fmaf; then warp shuffles (k3c_warp_sum); then the 16 warps in order. The mix:
 * per element, fmaf over the sources in order. out must not alias a source: other blocks of the row may
 * still be reading it. An op profile (2026-11-29) measured this kernel at 17.3 us a call, not the 3-5 predicted: every
 * source's pointer was re-read from the device array before its data, in the mix once per source and
 * element, a chain of dependent loads; the pointers now go to shared memory once, and the loads of a tile
 * (8 sources, two elements each in the logits) are issued together.
 * PRE: the last source is not in memory but formed from pend (attnres_pending_value) wherever the plain
 * kernel would load it, the same value, so the same logits and mix; the block that mixes a chunk also stores
 * the chunk's values to pend.p_new (the other blocks of the row only read pend's inputs). */
template <bool PRE>
__global__ void __launch_bounds__(ATTNRES_THREADS)
attnres_mix_kernel(const float *const *__restrict__ src, int nsrc, int D, const float *__restrict__ proj,
                   const float *__restrict__ norm, float eps, int round, float *__restrict__ out,
                   attnres_pending pend) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_ATTNRES_MIX);
    k3c_pdl_trigger(); /* a PDL-launched weight stream after this kernel may start (common.cuh) */
    extern __shared__ float sh[]; /* logit [npad], alpha [npad], then the source pointers [nsrc] */
    __shared__ float red[ATTNRES_THREADS / 32][2 * ATTNRES_SRC_TILE];
    int npad = (nsrc + 3) / 4 * 4 + 4;
    float *logit = sh, *alpha = sh + npad;
    const float **rows = (const float **)(sh + 2 * npad);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    size_t row = (size_t)blockIdx.x * D;
    /* The source pointers once into shared memory: read from the device array inside the loops they were a
     * dependent global load before every source's data (17 us a call, 4x the estimate). */
    int nmem = PRE ? nsrc - 1 : nsrc; /* sources read from memory; with PRE the last one is pend's */
    for (int j = threadIdx.x; j < nmem; j += blockDim.x) rows[j] = src[j] + row;
    __syncthreads();
    for (int j0 = 0; j0 < nsrc; j0 += ATTNRES_SRC_TILE) {
        int nj = min(ATTNRES_SRC_TILE, nsrc - j0);
        const float *p[ATTNRES_SRC_TILE];
        float ss[ATTNRES_SRC_TILE], dot[ATTNRES_SRC_TILE];
#pragma unroll
        for (int jj = 0; jj < ATTNRES_SRC_TILE; jj++) {
            p[jj] = jj < nj && j0 + jj < nmem ? rows[j0 + jj] : NULL;
            ss[jj] = dot[jj] = 0.0f;
        }
        /* ATTNRES_EPT of the thread's elements per pass (d0, d0 + B, ...), every load of the pass (all its
         * sources, the weights) issued before the sums: one memory round trip a pass. On 2026-11-30 a
         * stamped profile had this kernel at ~16 us a call with two elements a pass (7 dependent round
         * trips over a K3 row, the activations long evicted from L2 by the weight streams). The sums still
         * take d = tid, tid + B, ... in order per source, so the logits are bitwise those of before. */
        const int B = blockDim.x;
        const bool pend_here = PRE && nmem >= j0 && nmem < j0 + nj; /* this tile has the pending source */
        for (int d0 = threadIdx.x; d0 < D; d0 += ATTNRES_EPT * B) {
            float xv[ATTNRES_SRC_TILE][ATTNRES_EPT], wv[ATTNRES_EPT], pv[ATTNRES_EPT];
            /* loads only (the pending source's three addends too; its adds wait until all are issued) */
#pragma unroll
            for (int e = 0; e < ATTNRES_EPT; e++) {
                const int d = d0 + e * B;
                const bool in = d < D;
                wv[e] = in ? norm[d] * proj[d] : 0.0f;
#pragma unroll
                for (int jj = 0; jj < ATTNRES_SRC_TILE; jj++) xv[jj][e] = p[jj] && in ? p[jj][d] : 0.0f;
            }
            if (pend_here) {
                float a2v[ATTNRES_EPT], pov[ATTNRES_EPT];
#pragma unroll
                for (int e = 0; e < ATTNRES_EPT; e++) {
                    const int d = d0 + e * B;
                    const bool in = d < D;
                    pv[e] = in ? pend.a1[row + d] : 0.0f;
                    a2v[e] = in && pend.a2 ? pend.a2[row + d] : 0.0f;
                    pov[e] = in && pend.p_old ? pend.p_old[row + d] : 0.0f;
                }
#pragma unroll
                for (int e = 0; e < ATTNRES_EPT; e++) pv[e] = attnres_pending_combine(pend, pv[e], a2v[e], pov[e]);
            }
#pragma unroll
            for (int e = 0; e < ATTNRES_EPT; e++)
                if (d0 + e * B < D)
#pragma unroll
                    for (int jj = 0; jj < ATTNRES_SRC_TILE; jj++)
                        if (jj < nj) {
                            const float v = PRE && j0 + jj == nmem ? pv[e] : xv[jj][e];
                            ss[jj] = fmaf(v, v, ss[jj]);
                            dot[jj] = fmaf(v, wv[e], dot[jj]);
                        }
        }
#pragma unroll
        for (int jj = 0; jj < ATTNRES_SRC_TILE; jj++) {
            ss[jj] = k3c_warp_sum(ss[jj]);
            dot[jj] = k3c_warp_sum(dot[jj]);
        }
        if (lane == 0)
#pragma unroll
            for (int jj = 0; jj < ATTNRES_SRC_TILE; jj++) {
                red[warp][2 * jj] = ss[jj];
                red[warp][2 * jj + 1] = dot[jj];
            }
        __syncthreads();
        if ((int)threadIdx.x < nj) {
            float s = 0.0f, t = 0.0f;
            for (int w = 0; w < nw; w++) {
                s += red[w][2 * threadIdx.x];
                t += red[w][2 * threadIdx.x + 1];
            }
            logit[j0 + threadIdx.x] = t * rsqrtf(s / (float)D + eps);
        }
        __syncthreads(); /* red is free for the next tile; the logits are visible */
    }
    float mx = -INFINITY, sum = 0.0f;
    for (int j = 0; j < nsrc; j++) mx = fmaxf(mx, logit[j]);
    for (int j = 0; j < nsrc; j++) sum += expf(logit[j] - mx);
    float inv = 1.0f / sum;
    for (int j = threadIdx.x; j < nsrc; j += blockDim.x) alpha[j] = expf(logit[j] - mx) * inv;
    __syncthreads();
    /* this block's chunk of the row (multiples of 4 elements), element by element over the sources in order;
     * a tile's loads are issued together before its sums */
    int per = ((D + gridDim.y - 1) / gridDim.y + 3) & ~3;
    int d0 = blockIdx.y * per, d1 = min(D, d0 + per);
    for (int d = d0 + threadIdx.x; d < d1; d += blockDim.x) {
        float acc = 0.0f, pv = 0.0f;
        if (PRE) {
            pv = attnres_pending_value(pend, row + d);
            pend.p_new[row + d] = pv;
        }
        for (int j0 = 0; j0 < nsrc; j0 += ATTNRES_SRC_TILE) {
            int nj = min(ATTNRES_SRC_TILE, nsrc - j0);
            float v[ATTNRES_SRC_TILE];
#pragma unroll
            for (int jj = 0; jj < ATTNRES_SRC_TILE; jj++)
                v[jj] = PRE && j0 + jj == nmem ? pv : jj < nj ? rows[j0 + jj][d] : 0.0f;
#pragma unroll
            for (int jj = 0; jj < ATTNRES_SRC_TILE; jj++)
                if (jj < nj) acc = fmaf(alpha[j0 + jj], v[jj], acc);
        }
        out[row + d] = round ? k3c_dev_bf16(k3c_dev_to_bf16(acc)) : acc;
    }
    K3C_STAMP_BLOCK_END(K3C_KID_ATTNRES_MIX);
}

/* Both launchers: pend.a1 non-NULL selects the PRE kernel (nsrc then counts the pending source too). */
static int mix_launch(const float *const *src, int nsrc, int T, int D, const float *proj, const float *norm,
                      float eps, int round_bf16, float *out, attnres_pending pend, cudaStream_t stream) {
    /* blocks per row: about two blocks per SM over the step's rows, at most one per 512 elements (a thread
     * mixes at least one), 1 for prefill-sized T (no redundant reads there). More blocks shorten only the
     * mix (each block still reads every source for the logits). */
    int chunks = (2 * k3c_cuda_sm_count() + T - 1) / T;
    int by_width = (D + ATTNRES_THREADS - 1) / ATTNRES_THREADS;
    if (chunks > by_width) chunks = by_width;
    if (chunks > ATTNRES_MAX_CHUNKS) chunks = ATTNRES_MAX_CHUNKS;
    if (chunks < 1) chunks = 1;
    /* logits and weights padded to whole 16-byte vectors (compute-sanitizer saw a 12-byte shared read past a
     * 1- or 2-entry array in the forward test: the mix loop's reads are vectorized) */
    size_t smem = 2 * ((size_t)(nsrc + 3) / 4 * 4 + 4) * sizeof(float) + (size_t)nsrc * sizeof(float *);
    if (pend.a1) {
        attnres_mix_kernel<true><<<dim3(T, chunks), ATTNRES_THREADS, smem, stream>>>(src, nsrc, D, proj, norm, eps,
                                                                                    round_bf16, out, pend);
        K3C_CUDA_LAUNCHED("attnres_mix_pending");
    } else {
        attnres_mix_kernel<false><<<dim3(T, chunks), ATTNRES_THREADS, smem, stream>>>(src, nsrc, D, proj, norm, eps,
                                                                                     round_bf16, out, pend);
        K3C_CUDA_LAUNCHED("attnres_mix");
    }
    return K3C_OK;
}

extern "C" int k3c_cuda_attnres_mix(const float *const *src, int nsrc, int T, int D, const float *proj,
                                    const float *norm, float eps, int round_bf16, float *out, cudaStream_t stream) {
    if (T == 0) return K3C_OK;
    if (nsrc <= 0 || D <= 0 || T < 0)
        return k3c_errorf("k3c_cuda_attnres_mix: bad shape nsrc %d T %d D %d", nsrc, T, D);
    attnres_pending none = {NULL, NULL, NULL, NULL, 0};
    return mix_launch(src, nsrc, T, D, proj, norm, eps, round_bf16, out, none, stream);
}

extern "C" int k3c_cuda_attnres_mix_pending(const float *const *src, int nmem, const float *p_old, const float *a1,
                                            const float *a2, int round_add, float *p_new, int T, int D,
                                            const float *proj, const float *norm, float eps, int round_bf16,
                                            float *out, cudaStream_t stream) {
    if (T == 0) return K3C_OK;
    if (nmem < 0 || D <= 0 || T < 0 || !a1 || !p_new || (nmem > 0 && !src))
        return k3c_errorf("k3c_cuda_attnres_mix_pending: bad call nmem %d T %d D %d (a1 %p, p_new %p)", nmem, T, D,
                          (const void *)a1, (void *)p_new);
    attnres_pending pend = {p_old, a1, a2, p_new, round_add};
    return mix_launch(src, nmem + 1, T, D, proj, norm, eps, round_bf16, out, pend, stream);
}

K3C_STAMP_TU(attnres) /* K3C_CUDA_PROFILE=3: this file's stamped kernels (cuda/stamp.cuh) */
