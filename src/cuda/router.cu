/* Router: scores and selection in shared memory (one block per token), top-k by a bitonic sort. */
#include "cuda/router.h"

#include "cuda/check.h"
#include "cuda/common.cuh"

#define ROUTER_THREADS 256

/* E rounded up to a power of two (the bitonic sort's length) */
static int route_pad(int E) {
    int p = 1;
    while (p < E) p <<= 1;
    return p;
}

/* Larger value wins; equal values go to the lower index; NaN never wins over a number. */
__device__ __forceinline__ void better(float &v, int &i, float v2, int i2) {
    if (i2 < 0) return;
    if (i < 0 || v2 > v || (v2 == v && i2 < i) || (v != v && v2 == v2)) {
        v = v2;
        i = i2;
    }
}

__global__ void route_kernel(k3c_cuda_router r, int P, const float *__restrict__ logits,
                             const float *__restrict__ bias, int *idx, float *weight) {
    extern __shared__ float sh[];
    float *score = sh, *sel = sh + r.num_experts;
    /* then the selection keys [route_pad(E)] (8-byte aligned: 2E floats before them) */
    unsigned long long *key = (unsigned long long *)(sh + 2 * r.num_experts);
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

    /* Top-k by a bitonic sort of all E selection keys in shared memory, largest first. A key is 64 bits:
     * the value's order in the high word (NaN below -inf, -0 as +0), the inverted id in the low word, so
     * the order is `better`'s total order (larger value, then lower id; NaNs last, by id), the same experts
     * in the same order as k arg-max passes or the cpu/ops.h reference. P = route_pad(E), the keys past E
     * are 0, below every expert's. log2(P) (log2(P) + 1) / 2 stages of one barrier each (36 at
     * 256 experts, 55 at 896). Why: the rank selection before it (every thread counting the keys above its
     * experts) cost O(E) instructions per winner thread, and a warp holding one winner ran them all: run 21
     * (H200, bench_gpu small, in a graph) 8.7 us for 256 experts top-8 and 26.8 us for 896 top-16, the
     * warp-serial selection before that 10.3 and 45.1. */
    for (int e = threadIdx.x; e < P; e += blockDim.x) {
        unsigned long long kv = 0ull;
        if (e < E) {
            float v = sel[e];
            unsigned int u = __float_as_uint(v == 0.0f ? 0.0f : v); /* -0 as +0 */
            unsigned int ord = v != v ? 0u : (u & 0x80000000u) ? ~u : (u | 0x80000000u);
            kv = ((unsigned long long)ord << 32) | (0xffffffffu - (unsigned int)e);
        }
        key[e] = kv;
    }
    __syncthreads();
    for (int size = 2; size <= P; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < (P >> 1); i += blockDim.x) {
                int lo = 2 * stride * (i / stride) + i % stride, hi = lo + stride;
                bool down = (lo & size) == 0; /* this run sorts descending */
                unsigned long long a = key[lo], b = key[hi];
                if ((a < b) == down) {
                    key[lo] = b;
                    key[hi] = a;
                }
            }
            __syncthreads();
        }
    /* the weights in winner order, as the reference: the sum of the k scores in that order (lane j holds
     * winner j's score; the adds run in order over shuffles), then a lane per weight */
    if (threadIdx.x < 32) {
        int lane = threadIdx.x;
        float wsum = 0.0f;
        for (int j0 = 0; j0 < k; j0 += 32) {
            int j = j0 + lane;
            float w = j < k ? score[0xffffffffu - (unsigned int)key[j]] : 0.0f;
            int n = min(32, k - j0);
            for (int t = 0; t < n; t++) wsum += __shfl_sync(0xffffffffu, w, t);
        }
        for (int j = lane; j < k; j += 32) {
            int i = (int)(0xffffffffu - (unsigned int)key[j]);
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
    /* score, sel [E] f32; the keys [E rounded up to a power of two] u64 */
    size_t E = (size_t)r->num_experts;
    size_t smem = 2 * E * sizeof(float) + (size_t)route_pad(r->num_experts) * sizeof(unsigned long long);
    if (smem > 48 * 1024)
        K3C_CUDA_TRY(cudaFuncSetAttribute(route_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    route_kernel<<<T, ROUTER_THREADS, smem, stream>>>(*r, route_pad(r->num_experts), logits, bias, idx, weight);
    K3C_CUDA_LAUNCHED("route");
    return K3C_OK;
}
