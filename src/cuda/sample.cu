/* Greedy sampling on the GPU (cuda/sample.h). */
#include "cuda/sample.h"

#include "cuda/check.h"
#include "cuda/common.cuh"

#define ARGMAX_THREADS 1024

__device__ __forceinline__ uint64_t key_max(uint64_t a, uint64_t b) {
    return a > b ? a : b;
}

#define ARGMAX_U 8 /* 16-byte loads in flight per thread */

/* The best key of elements i, i + stride, ... below n of row (one at a time: the generic path) */
__device__ __forceinline__ uint64_t argmax_scalar(const float *__restrict__ row, int i, int n, int stride, uint64_t k) {
    for (; i < n; i += stride) k = key_max(k, k3c_select_key(row[i], i)); /* common.cuh */
    return k;
}

/* The best key of part blockIdx.x of row blockIdx.y (of gridDim.x equal parts): each thread the best key of
 * its share, then the warps' butterflies and the warps' bests in shared memory. A maximum of keys does not
 * depend on the order it is taken in, so every split of the row gives the same id. Rows of a multiple of 4
 * floats starting on 16 bytes are read as float4 (a part a whole number of float4), ARGMAX_U loads in flight
 * per thread before any comparison: the strided loop of one float at a time waited for each load in turn,
 * 160 round trips a thread for a 163840-wide row (k3c bench, 2026-11-30: SPECID 2.832 against SPEC 2.727 ms on
 * kimi-linear-48b b=1). keys non-NULL: thread 0 writes the part's key to keys[row * parts + part]; else (one
 * part) the row's id to ids[row]. */
__global__ void __launch_bounds__(ARGMAX_THREADS) argmax_parts_kernel(const float *__restrict__ logits, int V,
                                                                     uint64_t *keys, int32_t *ids) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_ARGMAX);
    __shared__ uint64_t best[ARGMAX_THREADS / 32];
    const float *row = logits + (size_t)blockIdx.y * V;
    const int part = blockIdx.x, parts = gridDim.x;
    uint64_t k = 0ull; /* below every element's key (an index's low word is never 0xffffffff - i < 0) */
    if ((V & 3) == 0 && ((uintptr_t)row & 15) == 0) {
        const float4 *r4 = (const float4 *)row;
        const int n4 = V >> 2, per = (n4 + parts - 1) / parts, lo = part * per, hi = min(n4, lo + per);
        const int step = blockDim.x * ARGMAX_U;
        for (int base = lo + threadIdx.x; base < hi; base += step) {
            float4 v[ARGMAX_U];
#pragma unroll
            for (int u = 0; u < ARGMAX_U; u++) {
                const int j = base + u * (int)blockDim.x;
                v[u] = j < hi ? __ldg(r4 + j) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int u = 0; u < ARGMAX_U; u++) {
                const int j = base + u * (int)blockDim.x;
                if (j < hi) {
                    k = key_max(k, k3c_select_key(v[u].x, 4 * j));
                    k = key_max(k, k3c_select_key(v[u].y, 4 * j + 1));
                    k = key_max(k, k3c_select_key(v[u].z, 4 * j + 2));
                    k = key_max(k, k3c_select_key(v[u].w, 4 * j + 3));
                }
            }
        }
    } else {
        const int per = (V + parts - 1) / parts, lo = part * per, hi = min(V, lo + per);
        k = argmax_scalar(row, lo + threadIdx.x, hi, blockDim.x, k);
    }
    for (int o = 16; o > 0; o >>= 1) k = key_max(k, k3c_shfl_xor_u64(k, o));
    if ((threadIdx.x & 31) == 0) best[threadIdx.x >> 5] = k;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) k = key_max(k, best[w]);
        if (keys) keys[(size_t)blockIdx.y * parts + part] = k;
        else ids[blockIdx.y] = (int32_t)(0xffffffffu - (unsigned int)k);
    }
    K3C_STAMP_BLOCK_END(K3C_KID_ARGMAX);
}

extern "C" int k3c_cuda_argmax_parts(int rows) {
    if (rows < 1) return 1;
    int parts = K3C_ARGMAX_KEYS_MAX / rows;
    return parts < 1 ? 1 : parts > K3C_ARGMAX_PARTS_MAX ? K3C_ARGMAX_PARTS_MAX : parts;
}

extern "C" int k3c_cuda_argmax_keys(const float *logits, int rows, int V, int parts, uint64_t *keys,
                                    cudaStream_t stream) {
    if (rows == 0) return K3C_OK;
    if (rows < 0 || V <= 0 || parts < 1 || parts > K3C_ARGMAX_PARTS_MAX || !keys)
        return k3c_errorf("k3c_cuda_argmax_keys: %d rows of %d in %d parts (at most %d)", rows, V, parts,
                          K3C_ARGMAX_PARTS_MAX);
    /* a part of a few thousand floats needs no more than 256 threads: one round of ARGMAX_U loads each */
    argmax_parts_kernel<<<dim3(parts, rows), parts > 1 ? 256 : ARGMAX_THREADS, 0, stream>>>(logits, V, keys, NULL);
    K3C_CUDA_LAUNCHED("argmax_keys");
    return K3C_OK;
}

extern "C" int k3c_cuda_argmax_rows(const float *logits, int rows, int V, int32_t *ids, cudaStream_t stream) {
    if (rows == 0) return K3C_OK;
    if (rows < 0 || V <= 0) return k3c_errorf("k3c_cuda_argmax_rows: %d rows of %d", rows, V);
    argmax_parts_kernel<<<dim3(1, rows), ARGMAX_THREADS, 0, stream>>>(logits, V, NULL, ids);
    K3C_CUDA_LAUNCHED("argmax_rows");
    return K3C_OK;
}

K3C_STAMP_TU(sample) /* K3C_CUDA_PROFILE=3: this file's stamped kernels (cuda/stamp.cuh) */
