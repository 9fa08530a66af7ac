/* Glue kernels of the CUDA backend (cuda/backend_cuda.c) that the kernel launchers of src/cuda do not
 * provide: row gathers and synthetic weight fills (device-synthetic models). All pointers are device
 * pointers; calls are asynchronous on `stream`. */
#ifndef K3C_CUDA_BACKEND_KERNELS_H
#define K3C_CUDA_BACKEND_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

/* k3c_cuda_seg and the multi-request KDA launchers (k3c_cuda_kda_conv_segs, _recurrent_segs, _chunked_segs)
 * live with the single-request ones in cuda/kda.h. */
#include "cuda/kda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dst[i, :] = src[rows[i], :] for i < n, rows of D floats. */
int k3c_cuda_gather_rows(const float *src, const int *rows, int n, int D, float *dst, cudaStream_t stream);

/* w[i] = bf16(std * N(0,1)), the normal drawn from a hash of (seed, i): deterministic, order-free. */
int k3c_cuda_fill_bf16_normal(uint16_t *w, size_t n, float std, uint64_t seed, cudaStream_t stream);
/* MXFP4: packed bytes uniformly random (two random E2M1 codes each), scale bytes scale_byte or
 * scale_byte - 1 (hash of (seed, i)), so a row's dot products keep a chosen magnitude. */
int k3c_cuda_fill_mxfp4(uint8_t *packed, size_t n_packed, uint8_t *scale, size_t n_scale, int scale_byte,
                        uint64_t seed, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
