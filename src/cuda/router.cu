/* Router: scores and selection in shared memory (one block per token), top-k by one warp. */
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
    float *chosen = sh + 2 * r.num_experts; /* the k winners' scores, in order */
    unsigned char *taken = (unsigned char *)(chosen + r.k);
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
        taken[e] = 0;
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

    /* Top-k by one warp: each lane keeps the best untaken candidate of its strided share (e = lane + 32 n);
     * a round's winner is the warp arg-max of the lanes' bests, and only the lane that owned it rescans its
     * share. `better` is a total order (larger value, then lower id; a number beats NaN), so the winners are
     * the block-wide arg-max passes' and the cpu/ops.h reference's, with no block barrier per round. */
    if (threadIdx.x < 32) {
        int lane = threadIdx.x;
        float lv = -INFINITY;
        int li = -1;
        for (int e = lane; e < E; e += 32) better(lv, li, sel[e], e);
        float wsum = 0.0f;
        for (int j = 0; j < k; j++) {
            float v = lv;
            int i = li;
            for (int o = 16; o > 0; o >>= 1) {
                float v2 = __shfl_xor_sync(0xffffffffu, v, o);
                int i2 = __shfl_xor_sync(0xffffffffu, i, o);
                better(v, i, v2, i2);
            }
            float w = i >= 0 ? score[i] : 0.0f;
            wsum += w;
            if (lane == 0) {
                idx[(size_t)blockIdx.x * k + j] = i;
                chosen[j] = w;
            }
            if (i >= 0 && (i & 31) == lane) {
                taken[i] = 1;
                lv = -INFINITY;
                li = -1;
                for (int e = lane; e < E; e += 32)
                    if (!taken[e]) better(lv, li, sel[e], e);
            }
        }
        /* the weights from shared memory, a lane each (wsum is the same on every lane: the same winners in
         * the same order); lane 0 read-modify-writing them in global memory one after another cost a
         * dependent global round trip each (16 in a row at k3-slice; run 10: 15 us a call) */
        __syncwarp();
        for (int j = lane; j < k; j += 32) {
            float w = chosen[j];
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
    size_t smem = (2 * (size_t)r->num_experts + (size_t)r->k) * sizeof(float) + (size_t)r->num_experts;
    if (smem > 48 * 1024)
        K3C_CUDA_TRY(cudaFuncSetAttribute(route_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    route_kernel<<<T, ROUTER_THREADS, smem, stream>>>(*r, logits, bias, idx, weight);
    K3C_CUDA_LAUNCHED("route");
    return K3C_OK;
}
