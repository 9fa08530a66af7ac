/* Router: scores and selection in shared memory (one block per token), top-k by a bitonic sort held in
 * registers. */
#include "cuda/router.h"

#include "cuda/check.h"
#include "cuda/common.cuh"

#define ROUTER_THREADS 256

/* The bitonic sort's length: E rounded up to a power of two, at least one key per thread */
static int route_pad(int E) {
    int p = ROUTER_THREADS;
    while (p < E) p <<= 1;
    return p;
}
#define ROUTER_MAX_KEYS 8 /* keys per thread: up to 2048 experts */

/* One compare-exchange of the bitonic network, seen from element i (partner i ^ stride, its key other): the
 * lower index of a pair keeps the larger key in a run sorted descending ((i & size) == 0), the smaller in an
 * ascending one, and the higher index the other. */
__device__ __forceinline__ unsigned long long bitonic_pick(int i, int stride, int size, unsigned long long mine,
                                                           unsigned long long other) {
    bool lo = (i & stride) == 0, down = (i & size) == 0;
    bool want_max = lo == down;
    return (mine > other) == want_max ? mine : other;
}

/* Sorts the PV = ROUTER_THREADS * R keys descending, thread t holding keys t R .. t R + R - 1 in kv, and
 * leaves the sorted keys in key (shared, [PV]). The network is the one of the shared-memory version before
 * (the same compare-exchanges, so the same order), but each stage goes where its partners are: within a
 * thread's registers (stride < R), across the lanes of a warp by shuffles (stride < 32 R: lane ^ stride / R,
 * no barrier), and through shared memory with two barriers only for stride >= 32 R (6 of the 36 stages at
 * 256 experts, 6 of 55 at 896). Why: the shared-memory network paid a barrier, two 8-byte shared loads and
 * stores, and an integer division and modulo by the stride in every one of its stages (2026-11-30, bench_gpu small,
 * H200: 7.8 us for 256 experts top-8 and 18.4 us for 896 top-16 in a graph). */
template <int R>
__device__ __forceinline__ void bitonic_sort_keys(unsigned long long (&kv)[R], unsigned long long *key, int PV) {
    const int t = threadIdx.x;
    for (int size = 2; size <= PV; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            if (stride >= 32 * R) {
#pragma unroll
                for (int j = 0; j < R; j++) key[t * R + j] = kv[j];
                __syncthreads();
#pragma unroll
                for (int j = 0; j < R; j++) kv[j] = bitonic_pick(t * R + j, stride, size, kv[j], key[(t * R + j) ^ stride]);
                __syncthreads(); /* every partner read before the next stage's stores */
            } else if (stride >= R) {
#pragma unroll
                for (int j = 0; j < R; j++)
                    kv[j] = bitonic_pick(t * R + j, stride, size, kv[j], k3c_shfl_xor_u64(kv[j], stride / R));
            } else { /* stride < R: a compile-time stride per branch, so kv stays in registers */
#pragma unroll
                for (int sr = 1; sr < R; sr <<= 1)
                    if (sr == stride) {
                        unsigned long long nk[R];
#pragma unroll
                        for (int j = 0; j < R; j++) nk[j] = bitonic_pick(t * R + j, sr, size, kv[j], kv[j ^ sr]);
#pragma unroll
                        for (int j = 0; j < R; j++) kv[j] = nk[j];
                    }
            }
        }
#pragma unroll
    for (int j = 0; j < R; j++) key[t * R + j] = kv[j];
    __syncthreads();
}

/* Larger value wins; equal values go to the lower index; NaN never wins over a number. */
__device__ __forceinline__ void better(float &v, int &i, float v2, int i2) {
    if (i2 < 0) return;
    if (i < 0 || v2 > v || (v2 == v && i2 < i) || (v != v && v2 == v2)) {
        v = v2;
        i = i2;
    }
}

/* The routing of token tok by a whole block of ROUTER_THREADS threads: sh is the launch's dynamic shared
 * memory (route_plan's bytes), red 32 floats of scratch. route_kernel and route_act_kernel both run it, so
 * their ids and weights are the same bits. */
template <int R>
__device__ __forceinline__ void route_token(const k3c_cuda_router &r, const float *__restrict__ logits,
                                            const float *__restrict__ bias, int *idx, float *weight, unsigned tok,
                                            float *sh, float *red) {
    float *score = sh, *sel = sh + r.num_experts;
    /* then the selection keys [ROUTER_THREADS R] (8-byte aligned: 2E floats before them) */
    unsigned long long *key = (unsigned long long *)(sh + 2 * r.num_experts);
    int E = r.num_experts, k = r.k;
    const float *lg = logits + (size_t)tok * E;
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

    /* Top-k by a bitonic sort of all E selection keys, largest first. A key is 64 bits: the value's order in
     * the high word (NaN below -inf, -0 as +0), the inverted id in the low word, so the order is `better`'s
     * total order (larger value, then lower id; NaNs last, by id), the same experts in the same order as k
     * arg-max passes or the cpu/ops.h reference. The keys past E are 0, below every expert's. (The rank
     * selection before the sort, every thread counting the keys above its experts, cost O(E) instructions
     * per winner thread: 2026-11-30, 8.7 us at 256 experts, 26.8 us at 896.) */
    {
        unsigned long long kv[R];
#pragma unroll
        for (int j = 0; j < R; j++) {
            int e = threadIdx.x * R + j;
            kv[j] = e < E ? k3c_select_key(sel[e], e) : 0ull;
        }
        bitonic_sort_keys<R>(kv, key, ROUTER_THREADS * R);
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
            idx[(size_t)tok * k + j] = i;
            weight[(size_t)tok * k + j] = r.renormalize ? w / (wsum + 1e-20f) * r.scale : w * r.scale;
        }
    }
}

template <int R>
__global__ void __launch_bounds__(ROUTER_THREADS)
route_kernel(k3c_cuda_router r, const float *__restrict__ logits, const float *__restrict__ bias, int *idx,
             float *weight) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_ROUTE);
    extern __shared__ float sh[];
    __shared__ float red[32];
    route_token<R>(r, logits, bias, idx, weight, blockIdx.x, sh, red);
    K3C_STAMP_BLOCK_END(K3C_KID_ROUTE);
}

/* Routing and a gated activation in one launch (router.h k3c_cuda_route_act): blocks 0 .. T-1 route token
 * blockIdx.x exactly as route_kernel; the blocks after them are gated_act_kernel's grid (the same block size,
 * ROUTER_THREADS = 256, and the same per-element function, k3c_dev_gated_act_span), so every output is the
 * bits of the two separate launches. The branch is uniform per block, so the router's barriers see whole
 * blocks. The activation blocks carry the router's dynamic shared memory unused (15 KB at 896 experts: an SM
 * still holds 8 blocks of 256 threads; 32 KB at the 2048-expert limit: 7).
 *
 * PDL: neither input comes from a PDL hand-off (launched without the attribute, the kernel starts after the
 * one before it has completed), so there is no wait. Every block triggers at entry, as gated_act_kernel does:
 * a PDL-launched successor may start early but must wait (griddepcontrol.wait: this whole grid complete, its
 * writes visible) before it reads idx, weight or out. route_kernel alone never triggered; the successors in
 * the executor (moe_pair_gate_up_kernel waits first; the grouped and MXFP4 expert kernels are launched
 * without PDL) read nothing before their wait. */
template <int R>
__global__ void __launch_bounds__(ROUTER_THREADS)
route_act_kernel(k3c_cuda_router r, const float *__restrict__ logits, const float *__restrict__ bias, int T,
                 int *idx, float *weight, k3c_cuda_act act, const float *gate, int gs, const float *up, int us,
                 int n, int round, float *out) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_ROUTE_ACT);
    k3c_pdl_trigger();
    extern __shared__ float sh[];
    __shared__ float red[32];
    if ((int)blockIdx.x < T) {
        route_token<R>(r, logits, bias, idx, weight, blockIdx.x, sh, red);
        K3C_STAMP_BLOCK_END(K3C_KID_ROUTE_ACT);
        return;
    }
    k3c_dev_gated_act_span(act.kind, act.beta, act.beta_lin, gate, gs, up, us, T, n, round, out,
                           (size_t)(blockIdx.x - T) * blockDim.x + threadIdx.x, (size_t)(gridDim.x - T) * blockDim.x);
    K3C_STAMP_BLOCK_END(K3C_KID_ROUTE_ACT);
}

/* The checks and the launch shape of a routing launch: keys per thread *R, dynamic shared memory *smem.
 * fn names the caller in the error. */
static int route_plan(const k3c_cuda_router *r, const char *fn, int *R, size_t *smem) {
    if (r->num_experts <= 0 || r->k <= 0 || r->k > r->num_experts)
        return k3c_errorf("%s: bad router: %d experts, top-%d", fn, r->num_experts, r->k);
    if (r->num_groups > 64) return k3c_errorf("%s: %d expert groups (at most 64 supported)", fn, r->num_groups);
    int PV = route_pad(r->num_experts);
    *R = PV / ROUTER_THREADS;
    if (*R > ROUTER_MAX_KEYS)
        return k3c_errorf("%s: %d experts (at most %d supported)", fn, r->num_experts, ROUTER_MAX_KEYS * ROUTER_THREADS);
    /* score, sel [E] f32; the keys [PV] u64 (at most 16 KB + 16 KB: under the 48 KB a launch gets) */
    *smem = 2 * (size_t)r->num_experts * sizeof(float) + (size_t)PV * sizeof(unsigned long long);
    return K3C_OK;
}

extern "C" int k3c_cuda_route(const k3c_cuda_router *r, const float *logits, const float *bias, int T, int *idx,
                              float *weight, cudaStream_t stream) {
    if (T == 0) return K3C_OK;
    int R = 1; /* set by route_plan (initialized for gcc 14's -Wmaybe-uninitialized on the GPU host) */
    size_t smem = 0;
    K3C_TRY(route_plan(r, "k3c_cuda_route", &R, &smem));
    void (*kernel)(k3c_cuda_router, const float *, const float *, int *, float *) =
        R == 1 ? route_kernel<1> : R == 2 ? route_kernel<2> : R == 4 ? route_kernel<4> : route_kernel<8>;
    kernel<<<T, ROUTER_THREADS, smem, stream>>>(*r, logits, bias, idx, weight);
    K3C_CUDA_LAUNCHED("route");
    return K3C_OK;
}

extern "C" int k3c_cuda_route_act(const k3c_cuda_router *r, const float *logits, const float *bias, int T, int *idx,
                                  float *weight, k3c_cuda_act act, const float *gate, int gate_stride,
                                  const float *up, int up_stride, int n, int round_bf16, float *out,
                                  cudaStream_t stream) {
    if (T == 0) return K3C_OK;
    if (n < 0) return k3c_errorf("k3c_cuda_route_act: bad activation width %d", n);
    int R = 1; /* set by route_plan (initialized for gcc 14's -Wmaybe-uninitialized on the GPU host) */
    size_t smem = 0;
    K3C_TRY(route_plan(r, "k3c_cuda_route_act", &R, &smem));
    /* gated_act_kernel's grid (elementwise.cu grid_for(T n, 256)): blocks of 256 elements, at most 4096 */
    size_t total = (size_t)T * n, act_blocks = (total + ROUTER_THREADS - 1) / ROUTER_THREADS;
    if (act_blocks > 4096) act_blocks = 4096;
    void (*kernel)(k3c_cuda_router, const float *, const float *, int, int *, float *, k3c_cuda_act, const float *,
                   int, const float *, int, int, int, float *) =
        R == 1 ? route_act_kernel<1> : R == 2 ? route_act_kernel<2> : R == 4 ? route_act_kernel<4> : route_act_kernel<8>;
    kernel<<<(unsigned)(T + act_blocks), ROUTER_THREADS, smem, stream>>>(*r, logits, bias, T, idx, weight, act, gate,
                                                                         gate_stride, up, up_stride, n, round_bf16, out);
    K3C_CUDA_LAUNCHED("route_act");
    return K3C_OK;
}

K3C_STAMP_TU(router) /* K3C_CUDA_PROFILE=3: this file's stamped kernels (cuda/stamp.cuh) */
