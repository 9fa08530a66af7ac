/* Glue kernels of the CUDA backend: row gathers and synthetic weight fills (cuda/backend_kernels.h). The
 * multi-request KDA kernels are in cuda/kda.cu. */
#include "cuda/backend_kernels.h"

#include "cuda/check.h"
#include "cuda/common.cuh"

static unsigned grid_for(size_t n, int threads, unsigned cap) {
    size_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    return (unsigned)(b > cap ? cap : b);
}

/* ---- gather ---- */

__global__ void gather_rows_kernel(const float *__restrict__ src, const int *__restrict__ rows, int D,
                                   float *__restrict__ dst) {
    const float *s = src + (size_t)rows[blockIdx.x] * D;
    float *d = dst + (size_t)blockIdx.x * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x) d[i] = s[i];
}

extern "C" int k3c_cuda_gather_rows(const float *src, const int *rows, int n, int D, float *dst, cudaStream_t stream) {
    if (n <= 0) return K3C_OK;
    gather_rows_kernel<<<n, 256, 0, stream>>>(src, rows, D, dst);
    K3C_CUDA_LAUNCHED("gather_rows");
    return K3C_OK;
}

/* ---- synthetic fills ---- */

/* splitmix64 finalizer of (seed, i): independent 64-bit words per index, no state. */
__device__ __forceinline__ uint64_t mix64(uint64_t seed, uint64_t i) {
    uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__global__ void fill_bf16_normal_kernel(uint16_t *w, size_t n, float std, uint64_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t h = mix64(seed, i);
        /* Box-Muller on two 24-bit uniforms; u1 in (0, 1] so the log is finite. */
        float u1 = ((float)(h & 0xffffff) + 1.0f) * 0x1p-24f;
        float u2 = (float)((h >> 24) & 0xffffff) * 0x1p-24f;
        float z = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
        w[i] = k3c_dev_to_bf16(std * z);
    }
}

extern "C" int k3c_cuda_fill_bf16_normal(uint16_t *w, size_t n, float std, uint64_t seed, cudaStream_t stream) {
    if (!n) return K3C_OK;
    fill_bf16_normal_kernel<<<grid_for(n, 256, 8192), 256, 0, stream>>>(w, n, std, seed);
    K3C_CUDA_LAUNCHED("fill_bf16_normal");
    return K3C_OK;
}

__global__ void fill_bytes_kernel(uint8_t *p, size_t n, uint64_t seed, int scale_byte) {
    size_t words = (n + 7) / 8;
    for (size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x; j < words; j += (size_t)gridDim.x * blockDim.x) {
        uint64_t h = mix64(seed, j);
        for (int b = 0; b < 8 && j * 8 + b < n; b++) {
            uint8_t v = (uint8_t)(h >> (8 * b));
            p[j * 8 + b] = scale_byte >= 0 ? (uint8_t)(scale_byte - (v & 1)) : v;
        }
    }
}

extern "C" int k3c_cuda_fill_mxfp4(uint8_t *packed, size_t n_packed, uint8_t *scale, size_t n_scale, int scale_byte,
                                   uint64_t seed, cudaStream_t stream) {
    if (scale_byte < 1 || scale_byte > 254)
        return k3c_errorf("k3c_cuda_fill_mxfp4: scale byte %d outside 1..254", scale_byte);
    if (n_packed) {
        fill_bytes_kernel<<<grid_for((n_packed + 7) / 8, 256, 8192), 256, 0, stream>>>(packed, n_packed, seed, -1);
        K3C_CUDA_LAUNCHED("fill_mxfp4 packed");
    }
    if (n_scale) {
        fill_bytes_kernel<<<grid_for((n_scale + 7) / 8, 256, 8192), 256, 0, stream>>>(scale, n_scale,
                                                                                     seed ^ 0x5ca1ab1eull, scale_byte);
        K3C_CUDA_LAUNCHED("fill_mxfp4 scale");
    }
    return K3C_OK;
}
