/* Helpers shared by the GPU tests and the GPU benchmark: device buffers, random fills, poisoning. */
#ifndef K3C_TESTS_GPU_UTIL_H
#define K3C_TESTS_GPU_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "util/bf16.h"
#include "util/rng.h"

/* Device copy of a host array (NULL on failure). */
static inline void *dev_upload(const void *h, size_t bytes) {
    void *d = NULL;
    if (cudaMalloc(&d, bytes ? bytes : 16) != cudaSuccess) return NULL;
    if (bytes && cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
        cudaFree(d);
        return NULL;
    }
    return d;
}

/* A device buffer filled with 0xff bytes: NaN as f32, so unwritten outputs show. */
static inline void *dev_poisoned(size_t bytes) {
    void *d = NULL;
    if (cudaMalloc(&d, bytes ? bytes : 16) != cudaSuccess) return NULL;
    if (cudaMemset(d, 0xff, bytes) != cudaSuccess) {
        cudaFree(d);
        return NULL;
    }
    return d;
}

static inline int dev_download(void *h, const void *d, size_t bytes) {
    return cudaDeviceSynchronize() == cudaSuccess && cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost) == cudaSuccess
               ? 0
               : -1;
}

static inline void fill_normal(k3c_rng *r, float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = (float)k3c_rng_normal(r) * scale;
}

static inline void fill_bf16(k3c_rng *r, uint16_t *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = f32_to_bf16((float)k3c_rng_normal(r) * scale);
}

static inline float *fmalloc(size_t n) { return (float *)malloc((n ? n : 1) * sizeof(float)); }

#endif
