/* Kimi Delta Attention kernels on the GPU (spec §2.2-2.3); cpu/ops.h KDA functions are the reference.
 * Shapes as there: activations [T, H*dk] f32, state [H, dk, dv] f32 (S[h][d][e], key channel major). All
 * pointers are device pointers; `round_bf16` rounds the op's output to bf16 (the model's bf16 stores). */
#ifndef K3C_CUDA_KDA_H
#define K3C_CUDA_KDA_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Causal depthwise conv + SiLU of T tokens of C channels; window [W-1, C] (oldest first) is read and
 * advanced in place; taps [C, W] (tap W-1 multiplies the current token); out [T, C]. */
int k3c_cuda_kda_conv(const float *x, int T, int C, int W, const float *taps, float *window, int round_bf16,
                      float *out, cudaStream_t stream);

/* g [T, H*dk] from f: safe gate lb * sigmoid(exp(A_log[h]) (f + dt_bias)) when has_lower_bound, else
 * -exp(A_log[h]) softplus(f + dt_bias); beta [T, H] = sigmoid(b) when b and beta are not NULL. */
int k3c_cuda_kda_gate(const float *f, const float *b, const float *a_log, const float *dt_bias, int T, int H, int dk,
                      int has_lower_bound, float lower_bound, float *g, float *beta, cudaStream_t stream);

/* Per (token, head) L2 norm of q and k in place (x / sqrt(sum x^2 + 1e-6)), q also scaled by dk^-1/2. */
int k3c_cuda_kda_qk_norm(float *q, float *k, int T, int H, int dk, cudaStream_t stream);

/* Gated delta rule over T tokens, one block per head, the head's state in registers (dk/32 slices of 32 key
 * rows per value column). dk must be a multiple of 32 and (dk/32) * dv <= 512. o [T, H, dv] may be NULL;
 * states (may be NULL) receives the state after each token ([T, H, dk, dv], verify). */
int k3c_cuda_kda_recurrent(float *state, const float *q, const float *k, const float *v, const float *g,
                           const float *beta, int T, int H, int dk, int dv, int round_bf16, float *o, float *states,
                           cudaStream_t stream);

/* The chunked (prefill) form: equal to the recurrence up to f32 rounding. For now it runs the recurrent
 * kernel over the tokens (correct first; a chunked tensor-core kernel is a later step). */
int k3c_cuda_kda_chunked(float *state, const float *q, const float *k, const float *v, const float *g,
                         const float *beta, int T, int H, int dk, int dv, int chunk, int round_bf16, float *o,
                         cudaStream_t stream);

/* y = o * rsqrt(mean(o^2) + eps) * w * act(z) per (token, head) row of dv; act = silu when silu_gate,
 * else sigmoid. */
int k3c_cuda_kda_gated_norm(const float *o, const float *z, const float *w, int T, int H, int dv, float eps,
                            int silu_gate, int round_bf16, float *y, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
