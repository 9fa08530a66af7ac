/* AttnRes mixing (spec §4.2) on the GPU; cpu/ops.h k3c_attnres_mix is the reference. */
#ifndef K3C_CUDA_ATTNRES_H
#define K3C_CUDA_ATTNRES_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* For each of T rows: sources j < nsrc are src[j] + t * D (src: a *device* array of nsrc device pointers,
 * oldest block first, partial prefix last); s_j = rsqrt(mean(v_j^2) + eps) * sum_d v_j[d] norm[d] proj[d];
 * out = sum_j softmax(s)_j v_j, bf16-rounded when round_bf16. out must not alias a source (several blocks
 * of a row read every source while others write their part of out). */
int k3c_cuda_attnres_mix(const float *const *src, int nsrc, int T, int D, const float *proj, const float *norm,
                         float eps, int round_bf16, float *out, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
