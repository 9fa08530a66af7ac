/* Row-wise and elementwise kernels of the stock forward on the GPU (cpu/ops.h elementwise is the
 * reference). Activations are f32 row-major [T, width]; all pointers are device pointers; calls are
 * asynchronous on `stream`. */
#ifndef K3C_CUDA_ELEMENTWISE_H
#define K3C_CUDA_ELEMENTWISE_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "cuda/moe.h" /* k3c_cuda_act */

#ifdef __cplusplus
extern "C" {
#endif

/* y[t, 0:n] = x[t, 0:n] * rsqrt(mean(x[t, 0:n]^2) + eps) * w for T rows with strides x_stride, y_stride
 * (floats); y may alias x; round_bf16 rounds the output. */
int k3c_cuda_rmsnorm(const float *x, int x_stride, const float *w, int T, int n, float eps, int round_bf16, float *y,
                     int y_stride, cudaStream_t stream);

/* The residual add and the rmsnorm after it, in one launch, for T contiguous rows of n: per element
 * v = a2 ? r(a1 + a2) : a1, then p = r(p + v) stored back (r: the bf16 rounding when round_bf16), then
 * y = rmsnorm(p) as k3c_cuda_rmsnorm(p, n, w, T, n, eps, round_bf16, y, n). Bitwise the same as those
 * separate k3c_cuda_add / k3c_cuda_rmsnorm calls (the same operations per element, the same reduction
 * order). a1, a2 (NULL: none) and w must not alias p or y; y may alias p only if p's sum is not needed. */
int k3c_cuda_add_rmsnorm(float *p, const float *a1, const float *a2, const float *w, int T, int n, float eps,
                         int round_bf16, float *y, cudaStream_t stream);

/* out[t, i] = act(gate[t*gate_stride + i], up[t*up_stride + i]) for T rows of n (strides let gate and up be
 * the two halves of one fused projection's output). */
int k3c_cuda_gated_act(k3c_cuda_act act, const float *gate, int gate_stride, const float *up, int up_stride, int T,
                       int n, int round_bf16, float *out, cudaStream_t stream);

/* out[t] = f32(table[ids[t]]), table bf16 [V, D]. An id outside [0, V) gives a row of -0.0 (another
 * tensor-parallel rank's token, backend.h embed); the caller validates ids otherwise. */
int k3c_cuda_embed(const uint16_t *table, int V, int D, const int *ids, int T, float *out, cudaStream_t stream);

/* out = a + b over n elements (out may alias a or b); round_bf16: round the sum to bf16 (a bf16 store). */
int k3c_cuda_add(const float *a, const float *b, size_t n, int round_bf16, float *out, cudaStream_t stream);
/* x = bf16_round(x) in place. */
int k3c_cuda_round_bf16(float *x, size_t n, cudaStream_t stream);
/* out = sigmoid(x) (beta of KDA). */
int k3c_cuda_sigmoid(const float *x, size_t n, float *out, cudaStream_t stream);
/* y[i] = x[i] * sigmoid(z[i]) over n elements (the MLA output gate); y may alias x. */
int k3c_cuda_mul_sigmoid(const float *x, const float *z, size_t n, int round_bf16, float *y, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
