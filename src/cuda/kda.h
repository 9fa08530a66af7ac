/* Kimi Delta Attention kernels on the GPU (spec §2.2-2.3); cpu/ops.h KDA functions are the reference.
 * Shapes as there: activations [T, H*dk] f32, state [H, dk, dv] f32 (S[h][d][e], key channel major). All
 * pointers are device pointers; `round_bf16` rounds the op's output to bf16 (the model's bf16 stores). */
#ifndef K3C_CUDA_KDA_H
#define K3C_CUDA_KDA_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One request's rows of a step and its KDA state / conv window for the current layer (device copy of the
 * host k3c_seg's fields the kernels need), for the multi-request (_segs) launchers below. */
typedef struct k3c_cuda_seg {
    int row0, n;
    float *state;  /* [H, dk, dv] */
    float *window; /* [3][W-1][P]; the conv adds which * (W-1) * P */
    /* 1: read the state and window, write neither back. A speculative verify's end state is thrown away
     * (its commit folds the accepted tokens from saved inputs into the committed slot), so the verify reads
     * the committed slot in place instead of a scratch copy of it (with the copies of its 6.3 MB of state a
     * layer, k3-slice's q = 4 verify step took 10.43 ms, without them 9.07: k3c bench, 2026-11-30). Every _segs
     * launcher and the fused provider honor it. */
    int read_only;
} k3c_cuda_seg;

/* Causal depthwise conv + SiLU of T tokens of C channels; window [W-1, C] (oldest first) is read and
 * advanced in place; taps [C, W] (tap W-1 multiplies the current token); out [T, C]. */
int k3c_cuda_kda_conv(const float *x, int T, int C, int W, const float *taps, float *window, int round_bf16,
                      float *out, cudaStream_t stream);
/* The same for nseg requests at once (segs: a device array): seg s's rows [row0, row0 + n) of x [*, C]
 * against its window segs[s].window + which * (W-1) * C, advanced in place. One kernel with the above, so
 * a channel's result is the same bits through either launcher. */
int k3c_cuda_kda_conv_segs(const float *x, const k3c_cuda_seg *segs, int nseg, int C, int W, const float *taps,
                           int which, int round_bf16, float *out, cudaStream_t stream);

/* g [T, H*dk] from f: safe gate lb * sigmoid(exp(A_log[h]) (f + dt_bias)) when has_lower_bound, else
 * -exp(A_log[h]) softplus(f + dt_bias); beta [T, H] = sigmoid(b) when b and beta are not NULL. */
int k3c_cuda_kda_gate(const float *f, const float *b, const float *a_log, const float *dt_bias, int T, int H, int dk,
                      int has_lower_bound, float lower_bound, float *g, float *beta, cudaStream_t stream);

/* Per (token, head) L2 norm of q and k in place (x / sqrt(sum x^2 + 1e-6)), q also scaled by dk^-1/2. */
int k3c_cuda_kda_qk_norm(float *q, float *k, int T, int H, int dk, cudaStream_t stream);

/* Gated delta rule over T tokens, token by token; per block one head and a slice of <= 32 value columns,
 * the slice's state in registers (dk/32 parts of 32 key rows per value column). dk must be a multiple of 32
 * and (dk/32) * min(dv, 32) <= 512. o [T, H, dv] may be NULL; states (may be NULL) receives the state after
 * each token ([T, H, dk, dv], verify). */
int k3c_cuda_kda_recurrent(float *state, const float *q, const float *k, const float *v, const float *g,
                           const float *beta, int T, int H, int dk, int dv, int round_bf16, float *o, float *states,
                           cudaStream_t stream);
/* The same for nseg requests at once, each on its own segs[s].state; rows of seg s are [row0, row0 + n) of
 * q, k, g [*, H*dk], v [*, H*dv], beta [*, H]; o may be NULL. One kernel with the above (same arithmetic and
 * order, bit-identical per request); same shape limits. */
int k3c_cuda_kda_recurrent_segs(const k3c_cuda_seg *segs, int nseg, const float *q, const float *k, const float *v,
                                const float *g, const float *beta, int H, int dk, int dv, int round_bf16, float *o,
                                cudaStream_t stream);

/* The chunked (prefill) form (spec §2.3): equal to the recurrence up to f32 rounding, same contract as
 * k3c_cuda_kda_recurrent without `states`. Fixed internal chunks of 32 tokens (`chunk` is ignored; it only
 * changes rounding); any T >= 1. Per block one head and 32 value columns, 256 threads working on a chunk
 * at a time (decay-weighted K K^T and Q K^T, the triangular solve, outputs and the state carried between
 * chunks; f32 CUDA-core math), 85 KB of shared memory at dk = 128. Takes dk a multiple of 32 in [32, 256]
 * and dv a multiple of 32 (every preset: dk = dv = 128); other dims run the recurrent kernel instead. */
int k3c_cuda_kda_chunked(float *state, const float *q, const float *k, const float *v, const float *g,
                         const float *beta, int T, int H, int dk, int dv, int chunk, int round_bf16, float *o,
                         cudaStream_t stream);
/* The chunked form for nseg requests in one launch (segs as k3c_cuda_kda_recurrent_segs); per request the
 * same bits as k3c_cuda_kda_chunked. Dims it does not take run k3c_cuda_kda_recurrent_segs. */
int k3c_cuda_kda_chunked_segs(const k3c_cuda_seg *segs, int nseg, const float *q, const float *k, const float *v,
                              const float *g, const float *beta, int H, int dk, int dv, int round_bf16, float *o,
                              cudaStream_t stream);

/* y = o * rsqrt(mean(o^2) + eps) * w * act(z) per (token, head) row of dv; act = silu when silu_gate,
 * else sigmoid. */
int k3c_cuda_kda_gated_norm(const float *o, const float *z, const float *w, int T, int H, int dv, float eps,
                            int silu_gate, int round_bf16, float *y, cudaStream_t stream);

/* The fused KDA decode provider (the executor's): one kernel computing, for nseg requests (segs as
 * above; together they must cover rows [0, T), each row once), bit for bit what these launches compute:
 *   k3c_cuda_kda_conv_segs(xq, segs, nseg, H*dk, W, taps_q, 0, round_bf16, cq)   (and xk -> ck with which 1,
 *       xv -> cv over H*dv channels with which 2; windows advanced in place)
 *   k3c_cuda_kda_gate(f, b, a_log, dt_bias, T, H, dk, has_lower_bound, lower_bound, g, beta)
 *   k3c_cuda_kda_qk_norm(cq, ck, T, H, dk)
 *   k3c_cuda_kda_recurrent_segs(segs, nseg, cq, ck, cv, g, beta, H, dk, dv, round_bf16, o)   (states updated)
 *   k3c_cuda_kda_gated_norm(o, z, norm_w, T, H, dv, eps, silu_gate, round_bf16, y)
 * (each of those kernels and the fused one call the same per-element device functions in kda.cu). Outputs:
 * cq, ck (normed), cv, g, beta [as above], y [T, H*dv], the states and windows; o [T, H*dv] (the delta-rule
 * output before the norm) may be NULL when k3c_cuda_kda_decode_fused_fits(dk, dv). No output aliases an
 * input; a request's window regions are those of the conv calls above (which * (W-1) * C with each call's
 * C, apart when dv >= dk; the model has dv = dk). Block per (head, request) owning all dv columns: takes dk a multiple of 32 with (dk/32) * dv <= 512
 * (every preset: dk = dv = 128); other dims run the separate launches above (o then required). */
int k3c_cuda_kda_decode_fused(const k3c_cuda_seg *segs, int nseg, int T, int H, int dk, int dv, int W,
                              const float *xq, const float *xk, const float *xv, const float *taps_q,
                              const float *taps_k, const float *taps_v, const float *f, const float *b,
                              const float *a_log, const float *dt_bias, int has_lower_bound, float lower_bound,
                              const float *z, const float *norm_w, float eps, int silu_gate, int round_bf16, float *cq,
                              float *ck, float *cv, float *g, float *beta, float *o, float *y, cudaStream_t stream);
/* Whether k3c_cuda_kda_decode_fused runs its one kernel for these dims (else the separate launches). */
int k3c_cuda_kda_decode_fused_fits(int dk, int dv);
/* The separate launches listed above, whatever the dims (o required). */
int k3c_cuda_kda_decode_separate(const k3c_cuda_seg *segs, int nseg, int T, int H, int dk, int dv, int W,
                                 const float *xq, const float *xk, const float *xv, const float *taps_q,
                                 const float *taps_k, const float *taps_v, const float *f, const float *b,
                                 const float *a_log, const float *dt_bias, int has_lower_bound, float lower_bound,
                                 const float *z, const float *norm_w, float eps, int silu_gate, int round_bf16,
                                 float *cq, float *ck, float *cv, float *g, float *beta, float *o, float *y,
                                 cudaStream_t stream);
/* Whether the fused kernel is the faster choice for nseg requests of H heads (it fits, and nseg x H blocks
 * stay under a limit measured on the H200: kda.cu); else the separate launches. Same outputs either way. */
int k3c_cuda_kda_decode_fused_prefer(int nseg, int H, int dk, int dv);

#ifdef __cplusplus
}
#endif

#endif
