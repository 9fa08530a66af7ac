/* Greedy sampling on the GPU (cuda/sample.h). */
#include "cuda/sample.h"

#include "cuda/check.h"
#include "cuda/common.cuh"

#define ARGMAX_THREADS 1024

__device__ __forceinline__ uint64_t key_max(uint64_t a, uint64_t b) {
    return a > b ? a : b;
}

/* One block a row: each thread the best key of its strided share, then the warps' butterflies and the
 * warps' bests in shared memory. A maximum of keys does not depend on the order it is taken in. */
__global__ void __launch_bounds__(ARGMAX_THREADS) argmax_rows_kernel(const float *__restrict__ logits, int V,
                                                                    int32_t *ids) {
    __shared__ uint64_t best[ARGMAX_THREADS / 32];
    const float *row = logits + (size_t)blockIdx.x * V;
    uint64_t k = 0ull; /* below every element's key (an index's low word is never 0xffffffff - i < 0) */
    for (int i = threadIdx.x; i < V; i += blockDim.x) k = key_max(k, k3c_select_key(row[i], i)); /* common.cuh */
    for (int o = 16; o > 0; o >>= 1) k = key_max(k, k3c_shfl_xor_u64(k, o));
    if ((threadIdx.x & 31) == 0) best[threadIdx.x >> 5] = k;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) k = key_max(k, best[w]);
        ids[blockIdx.x] = (int32_t)(0xffffffffu - (unsigned int)k);
    }
}

extern "C" int k3c_cuda_argmax_rows(const float *logits, int rows, int V, int32_t *ids, cudaStream_t stream) {
    if (rows == 0) return K3C_OK;
    if (rows < 0 || V <= 0) return k3c_errorf("k3c_cuda_argmax_rows: %d rows of %d", rows, V);
    argmax_rows_kernel<<<rows, ARGMAX_THREADS, 0, stream>>>(logits, V, ids);
    K3C_CUDA_LAUNCHED("argmax_rows");
    return K3C_OK;
}
