/* Batched descriptor copies (cuda/decode_copy.h): one block row per descriptor, blocks of that row stride
 * over its floats with 16-byte accesses when both ends are 16-byte aligned. */
#include <stdint.h>

#include "cuda/check.h"
#include "cuda/decode_copy.h"
#include "cuda/stamp.cuh"

#define COPY_THREADS 256
#define COPY_BLOCKS_PER_DESC 8

__global__ void copy_batch_kernel(const k3c_cuda_copy *__restrict__ d) {
    K3C_STAMP_BLOCK_BEGIN(K3C_KID_COPY_BATCH);
    k3c_cuda_copy c = d[blockIdx.y];
    if (c.n <= 0) return;
    long long stride = (long long)gridDim.x * blockDim.x;
    long long i0 = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if ((((uintptr_t)c.src | (uintptr_t)c.dst) & 15) == 0) {
        long long n4 = c.n >> 2;
        const float4 *s = (const float4 *)c.src;
        float4 *t = (float4 *)c.dst;
        for (long long i = i0; i < n4; i += stride) t[i] = s[i];
        for (long long i = (n4 << 2) + i0; i < c.n; i += stride) c.dst[i] = c.src[i];
    } else {
        for (long long i = i0; i < c.n; i += stride) c.dst[i] = c.src[i];
    }
    K3C_STAMP_BLOCK_END(K3C_KID_COPY_BATCH);
}

extern "C" int k3c_cuda_copy_batch(const k3c_cuda_copy *d, int n, cudaStream_t stream) {
    if (n <= 0) return K3C_OK;
    if (n > 65535) return k3c_errorf("k3c_cuda_copy_batch: %d descriptors (at most 65535)", n);
    dim3 grid(COPY_BLOCKS_PER_DESC, (unsigned)n);
    copy_batch_kernel<<<grid, COPY_THREADS, 0, stream>>>(d);
    K3C_CUDA_LAUNCHED("copy_batch");
    return K3C_OK;
}

K3C_STAMP_TU(decode_copy) /* K3C_CUDA_PROFILE=3: this file's stamped kernels (cuda/stamp.cuh) */
