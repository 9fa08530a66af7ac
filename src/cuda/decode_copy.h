/* Batched device copies for the specialized decode's captured steps (decode/executor_cuda.c). A captured
 * graph bakes every address it launches with, but which KDA slot a verify saves into changes from step to
 * step; so the copies read their (src, dst, length) descriptors from a fixed device buffer whose contents
 * the executor rewrites before each replay. All pointers are device pointers. */
#ifndef K3C_CUDA_DECODE_COPY_H
#define K3C_CUDA_DECODE_COPY_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct k3c_cuda_copy {
    const float *src;
    float *dst;
    long long n; /* floats; 0 skips the entry */
} k3c_cuda_copy;

/* dst_i[0:n_i] = src_i[0:n_i] for the n descriptors of d (a device array). The launch geometry depends on n
 * only, so the launch can be captured once and replayed with other descriptors. */
int k3c_cuda_copy_batch(const k3c_cuda_copy *d, int n, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
