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

/* The mix with its last source pending: sources are src[0..nmem-1] (a device array, as above: the blocks)
 * and then the prefix as the residual add(s) before the mix would have stored it, per element
 * v = a2 ? r(a1 + a2) : a1, then v = r(p_old + v) when p_old is non-NULL (r: the bf16 rounding when
 * round_add; p_old NULL: the prefix starts as a1, a copy). The mix is bitwise k3c_cuda_attnres_mix over
 * src[0..nmem-1] and a buffer holding v, and v is stored to p_new, which must alias none of src's rows,
 * p_old, a1, a2 or out (the row's other blocks still read p_old while a block stores its chunk). */
int k3c_cuda_attnres_mix_pending(const float *const *src, int nmem, const float *p_old, const float *a1,
                                 const float *a2, int round_add, float *p_new, int T, int D, const float *proj,
                                 const float *norm, float eps, int round_bf16, float *out, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
