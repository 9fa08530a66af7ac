/* Router: scores and selection in shared memory (one block per token), top-k by rank. */
#include "cuda/router.h"

#include "cuda/check.h"
#include "cuda/common.cuh"

#define ROUTER_THREADS 256

/* Larger value wins; equal values go to the lower index; NaN never wins over a number. */
__device__ __forceinline__ void better(float &v, int &i, float v2, int i2) {
    if (i2 < 0) return;
    if (i < 0 || v2 > v || (v2 == v && i2 < i) || (v != v && v2 == v2)) {
        v = v2;
        i = i2;
    }
}

__global__ void route_kernel(k3c_cuda_router r, const float *__restrict__ logits, const float *__restrict__ bias,
                             int *idx, float *weight) {
    extern __shared__ float sh[];
    float *score = sh, *sel = sh + r.num_experts;
    /* then the selection keys [E] (8-byte aligned: 2E floats before them) and the winners [k] */
    unsigned long long *key = (unsigned long long *)(sh + 2 * r.num_experts);
    int *win = (int *)(key + r.num_experts);
    __shared__ float red[32];
    int E = r.num_experts, k = r.k;
    const float *lg = logits + (size_t)blockIdx.x * E;
    if (r.sigmoid) {
        for (int e = threadIdx.x; e < E; e += blockDim.x) score[e] = k3c_dev_sigmoid(lg[e]);
    } else {
        float mx = -INFINITY;
        for (int e = threadIdx.x; e < E; e += blockDim.x) mx = fmaxf(mx, lg[e]);
        mx = k3c_warp_max(mx);
        __syncthreads();
        if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = mx;
        __syncthreads();
        mx = -INFINITY;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) mx = fmaxf(mx, red[w]);
        float s = 0.0f;
        for (int e = threadIdx.x; e < E; e += blockDim.x) {
            score[e] = expf(lg[e] - mx);
            s += score[e];
        }
        s = k3c_block_sum(s, red);
        for (int e = threadIdx.x; e < E; e += blockDim.x) score[e] /= s;
    }
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        sel[e] = score[e] + (r.use_bias && bias ? bias[e] : 0.0f);
    }
    __syncthreads();

    int G = r.num_groups;
    if (G > 1 && E % G == 0 && r.topk_group < G) {
        /* Group score = sum of its top-2 selection scores (thread 0: G is small); keep topk_group groups. */
        if (threadIdx.x == 0) {
            int per = E / G, keep = r.topk_group > 0 ? r.topk_group : 1;
            float g[64]; /* G <= 64, checked by the launcher */
            for (int gr = 0; gr < G; gr++) {
                float a = -INFINITY, b = -INFINITY;
                int ai = -1, bi = -1;
                for (int e = gr * per; e < (gr + 1) * per; e++) {
                    float v = sel[e];
                    if (ai < 0 || v > a) {
                        b = a; bi = ai;
                        a = v; ai = e;
                    } else if (bi < 0 || v > b) {
                        b = v; bi = e;
                    }
                }
                g[gr] = bi >= 0 ? a + b : a;
            }
            /* Mark kept groups by repeated arg-max (ties to the lower group id). */
            unsigned long long kept = 0;
            for (int n = 0; n < keep && n < G; n++) {
                float bv = -INFINITY;
                int bi = -1;
                for (int gr = 0; gr < G; gr++)
                    if (!(kept >> gr & 1ull)) better(bv, bi, g[gr], gr);
                if (bi >= 0) kept |= 1ull << bi;
            }
            for (int gr = 0; gr < G; gr++)
                if (!(kept >> gr & 1ull))
                    for (int e = gr * per; e < (gr + 1) * per; e++) sel[e] = -INFINITY;
        }
        __syncthreads();
    }

    /* Top-k by rank: expert e's rank is the number of experts that beat it in `better`'s total order
     * (larger value, then lower id; a number beats NaN; NaNs by id; -0 and +0 equal), so the winners are
     * the ranks 0 .. k-1, the same experts in the same order as k arg-max passes or the cpu/ops.h reference.
     * Every thread ranks its experts against all E from shared memory at once, as 64-bit keys (value order
     * in the high word, inverted id in the low); a thread stops as soon as all of its experts have k
     * winners above them, so only the threads holding winners scan everything. Run 19 (H200, bench_gpu
     * small, in a graph) measured the warp-serial selection this replaces at 10.3 us a call for 256
     * experts top-8 and 45 us for 896 experts top-16: k rounds, each a warp arg-max and a lane's rescan of
     * its E / 32 candidates, one dependent chain. */
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        float v = sel[e];
        unsigned int u = __float_as_uint(v == 0.0f ? 0.0f : v); /* -0 as +0 */
        unsigned int ord = v != v ? 0u : (u & 0x80000000u) ? ~u : (u | 0x80000000u); /* NaN below -inf */
        key[e] = ((unsigned long long)ord << 32) | (0xffffffffu - (unsigned int)e);
    }
    __syncthreads();
    {
        constexpr int PER = 4; /* experts ranked per thread per pass (E <= 4 * ROUTER_THREADS: one pass) */
        for (int e0 = threadIdx.x; e0 < E; e0 += PER * blockDim.x) {
            unsigned long long mine[PER];
            int rank[PER];
#pragma unroll
            for (int i = 0; i < PER; i++) {
                int e = e0 + i * blockDim.x;
                mine[i] = e < E ? key[e] : ~0ull; /* a missing slot ranks 0 and is never stored */
                rank[i] = e < E ? 0 : k;
            }
            for (int j0 = 0; j0 < E; j0 += 32) {
                int j1 = min(E, j0 + 32);
                for (int j = j0; j < j1; j++) {
                    unsigned long long kj = key[j];
#pragma unroll
                    for (int i = 0; i < PER; i++) rank[i] += kj > mine[i];
                }
                bool done = true;
#pragma unroll
                for (int i = 0; i < PER; i++) done = done && rank[i] >= k;
                if (done) break;
            }
#pragma unroll
            for (int i = 0; i < PER; i++) {
                int e = e0 + i * blockDim.x;
                if (e < E && rank[i] < k) win[rank[i]] = e;
            }
        }
    }
    __syncthreads();
    /* the weights in winner order, as the reference: the sum of the k scores in that order (each lane the
     * same sum), then a lane per weight */
    if (threadIdx.x < 32) {
        int lane = threadIdx.x;
        float wsum = 0.0f;
        for (int j = 0; j < k; j++) wsum += score[win[j]];
        for (int j = lane; j < k; j += 32) {
            int i = win[j];
            float w = score[i];
            idx[(size_t)blockIdx.x * k + j] = i;
            weight[(size_t)blockIdx.x * k + j] = r.renormalize ? w / (wsum + 1e-20f) * r.scale : w * r.scale;
        }
    }
}

extern "C" int k3c_cuda_route(const k3c_cuda_router *r, const float *logits, const float *bias, int T, int *idx,
                              float *weight, cudaStream_t stream) {
    if (T == 0) return K3C_OK;
    if (r->num_experts <= 0 || r->k <= 0 || r->k > r->num_experts)
        return k3c_errorf("k3c_cuda_route: bad router: %d experts, top-%d", r->num_experts, r->k);
    if (r->num_groups > 64) return k3c_errorf("k3c_cuda_route: %d expert groups (at most 64 supported)", r->num_groups);
    /* score, sel [E] f32; the keys [E] u64; the winners [k] int */
    size_t E = (size_t)r->num_experts;
    size_t smem = 2 * E * sizeof(float) + E * sizeof(unsigned long long) + (size_t)r->k * sizeof(int);
    if (smem > 48 * 1024)
        K3C_CUDA_TRY(cudaFuncSetAttribute(route_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    route_kernel<<<T, ROUTER_THREADS, smem, stream>>>(*r, logits, bias, idx, weight);
    K3C_CUDA_LAUNCHED("route");
    return K3C_OK;
}
