/* CPU kernels of the stock forward: the numerical reference of every backend. Activations are f32 arrays,
 * row-major [T tokens, width]; weights are the model's bf16 / MXFP4 views (model/weights.h). All
 * reductions accumulate in f32 (the delta-rule state and the softmax are f32 throughout). Callers round to
 * bf16 (util/bf16.h bf16_round) wherever the model stores an activation in bf16; these kernels never do. */
#ifndef K3C_CPU_OPS_H
#define K3C_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "model/weights.h"

/* ---- thread pool (cpu/pool.c): a fixed set of workers for parallel-for over rows ---- */
typedef struct k3c_pool k3c_pool;
/* threads <= 0: one per online core. */
k3c_pool *k3c_pool_create(int threads);
void k3c_pool_free(k3c_pool *p);
int k3c_pool_threads(const k3c_pool *p);
/* Calls fn(ctx, begin, end) on disjoint ranges covering [0, n), in parallel; returns when all are done.
 * p == NULL runs fn(ctx, 0, n) on the caller. */
void k3c_pool_for(k3c_pool *p, int n, void (*fn)(void *ctx, int begin, int end), void *ctx);
/* As k3c_pool_for, and fn also gets the number of the thread running it: in [0, k3c_pool_threads(p)) (the
 * caller is 0), never the same for two calls of fn running at the same time, so it can index scratch
 * allocated once per thread. */
void k3c_pool_for_worker(k3c_pool *p, int n, void (*fn)(void *ctx, int begin, int end, int worker), void *ctx);
/* Per-thread scratch, allocated with the pool: K3C_POOL_SCRATCH bytes (64-byte aligned) for the thread
 * numbered `worker` by k3c_pool_for_worker, valid until k3c_pool_free; NULL when p is NULL. The matrix
 * products pack weight panels here (cpu/matmul.c); no other user may hold it across a k3c_pool_for_worker. */
#define K3C_POOL_SCRATCH ((size_t)384 << 10)
void *k3c_pool_scratch(k3c_pool *p, int worker);

/* ---- matrix products (cpu/matmul.c): y[t, r] = sum_c W[r, c] * x[t, c] ---- */
/* x: [T, W.cols], y: [T, W.rows]. Each weight row is read once for all T tokens. */
void k3c_matmul_bf16(k3c_pool *p, const k3c_mat *W, const float *x, int T, float *y);
void k3c_matmul_mxfp4(k3c_pool *p, const k3c_mxfp4_mat *W, const float *x, int T, float *y);
/* One product of a batch: y = W x for T tokens with bf16 (W) or MXFP4 (Wq) weights (exactly one set);
 * round: each output rounded to bf16 (bf16_round) as it is stored. ldx, ldy: floats between tokens of x
 * and y (0: dense, W.cols and W.rows). xbf16: every value of x is a bf16 value (the caller rounded it), so
 * an AVX512-BF16 build multiplies in bf16 (VDPBF16PS, cpu/matmul.c: its own fixed accumulation order, with
 * inputs below 2^-126 taken as zero); 0: the f32 products (exact inputs, as the f32 diagnostic needs). */
typedef struct k3c_mm {
    const k3c_mat *W;
    const k3c_mxfp4_mat *Wq;
    const float *x;
    int T;
    float *y;
    int round;
    size_t ldx, ldy;
    int xbf16;
} k3c_mm;
/* Independent products (none reads another's output) in one parallel-for over all their rows: one pool
 * wake-up instead of n. Without xbf16 each output equals what k3c_matmul_bf16 / k3c_matmul_mxfp4 give for
 * it (then rounded when round). All products here are batch invariant: an output depends on its weight row,
 * token row and xbf16 only, never on T or on the other tokens (same operation sequence for every T). */
void k3c_matmul_batch(k3c_pool *p, const k3c_mm *mm, int n);
/* One row of a bf16 matrix as f32 (embedding lookup). */
void k3c_bf16_row(const k3c_mat *W, int row, float *out);

/* ---- elementwise (cpu/elementwise.c) ---- */
/* y = x * rsqrt(mean(x^2) + eps) * w over n elements (y may alias x). */
void k3c_rmsnorm(const float *x, const float *w, int n, float eps, float *y);
/* out[i] = act(gate[i]) * up'[i]: SiLU -> silu(g) * u; SiTU -> beta*tanh(g/beta)*sigmoid(g) * lin(u),
 * lin(u) = beta_lin * tanh(u / beta_lin), or u when beta_lin == 0. */
void k3c_gated_act(const k3c_config *c, const float *gate, const float *up, int n, float *out);
static inline float k3c_sigmoidf(float x) { return 1.0f / (1.0f + __builtin_expf(-x)); }

/* ---- KDA (cpu/kda.c) ---- */
/* Short causal depthwise conv + SiLU for T new tokens of C channels. window: [W-1, C], the last W-1 inputs
 * before x (oldest first; zeros for a fresh sequence); it is advanced in place to end at the last token.
 * taps: [C, W]; out: [T, C]. */
void k3c_kda_conv(const float *x, int T, int C, int W, const float *taps, float *window, float *out);
/* The two halves of k3c_kda_conv, for splitting it over threads: output rows [t0, t1) (each row depends on
 * x and the window only), then the window advanced past all T rows. */
void k3c_kda_conv_rows(const float *x, int T, int C, int W, const float *taps, const float *window, int t0, int t1,
                       float *out);
void k3c_kda_conv_advance(const float *x, int T, int C, int W, float *window);
/* The decay gate g [T, P] (log space) from f = f_b(f_a(x)) [T, P]:
 * safe gate: lower_bound * sigmoid(exp(A_log[h]) * (f + dt_bias)); else -exp(A_log[h]) * softplus(f + dt_bias). */
void k3c_kda_gate(const k3c_config *c, const float *a_log, const float *dt_bias, const float *f, int T, float *g);
/* q, k: [T, H, dk] L2-normalized per head in place (x / sqrt(sum x^2 + 1e-6)), and q scaled by dk^-1/2. */
void k3c_kda_qk_norm(float *q, float *k, int T, int H, int dk);
/* Gated delta rule, token by token (spec §2.2 step 7). state: [H, dk, dv] f32, updated in place.
 * q (normalized and scaled), k (normalized), v: [T, H, dk|dv]; g: [T, H, dk]; beta: [T, H]; o: [T, H, dv].
 * When states != NULL the state after token t is also copied to states + t*H*dk*dv (verify). */
void k3c_kda_recurrent(float *state, const float *q, const float *k, const float *v, const float *g,
                       const float *beta, int T, int H, int dk, int dv, float *o, float *states);
/* The same function in chunked form (spec §2.3), chunks of `chunk` tokens (<= 0: 64); never exponentiates
 * a positive cumulative decay. Equal to k3c_kda_recurrent up to f32 rounding. A convenience for tests and
 * references: it allocates its scratch per call (K3C_ERR when that fails); the step path uses
 * k3c_kda_chunked_heads with scratch allocated once. */
int k3c_kda_chunked(float *state, const float *q, const float *k, const float *v, const float *g,
                    const float *beta, int T, int H, int dk, int dv, int chunk, float *o);
/* Floats of scratch k3c_kda_chunked_heads needs for this chunk (<= 0: 64), whatever T and the head range:
 * chunk * (2 dk + 2 chunk + dv) + 34 dk (for K3, chunk 64, dk = dv = 128: 37,120 floats). */
size_t k3c_kda_chunk_scratch(int chunk, int dk, int dv);
/* The two above for heads [h0, h1) only (state, q, ... o as above, all H heads wide; states not kept).
 * Heads are independent, so a head's result does not depend on the range it was run in.
 * scratch (chunked): k3c_kda_chunk_scratch(chunk, dk, dv) floats, not shared with a concurrent call; it is
 * required (no fallback: the recurrent form rounds differently), and its contents do not matter. */
void k3c_kda_recurrent_heads(float *state, const float *q, const float *k, const float *v, const float *g,
                             const float *beta, int T, int H, int h0, int h1, int dk, int dv, float *o);
void k3c_kda_chunked_heads(float *state, const float *q, const float *k, const float *v, const float *g,
                           const float *beta, int T, int H, int h0, int h1, int dk, int dv, int chunk,
                           float *scratch, float *o);
/* Gated RMSNorm per head: y = o * rsqrt(mean(o^2) + eps) * w * act(z); act = sigmoid (K3) or silu
 * (Kimi Linear as transformers 5.17 computes it). o, z, y: [T, H, dv]. */
void k3c_kda_gated_norm(const float *o, const float *z, const float *w, int T, int H, int dv, float eps,
                        int silu_gate, float *y);

/* ---- MLA attention core (cpu/mla.c), NoPE ---- */
/* Attention of Tq consecutive query rows of one request over its latent cache (absorbed form).
 * q_abs: [Tq, Hm, kv_lora + rope], per head [W_UK[h]^T q_nope | q_pe]; lat: [n_past + Tq, kv_lora + rope],
 * the request's cached latents [c_normed | k_pe] in order; query row i attends rows 0..n_past+i (causal).
 * o_lat: [Tq, Hm, kv_lora], the softmax-weighted sum of the first kv_lora entries. Softmax in f32. */
void k3c_mla_attend(const float *q_abs, int Tq, int Hm, int kv_lora, int rope, const float *lat, int n_past,
                    float scale, float *o_lat);
/* The same for heads [h0, h1) only, reading latent position p in place at cache row
 * block_table[p / block_size] * block_size + p % block_size (the MLA cache layout). Per row and head the
 * result is bit-identical to k3c_mla_attend over the gathered rows. */
void k3c_mla_attend_paged(const float *q_abs, int Tq, int Hm, int h0, int h1, int kv_lora, int rope,
                          const float *cache, const int32_t *block_table, int block_size, int n_past, float scale,
                          float *o_lat);
/* Decode context parallel: the same for the positions p % dcp == dcp_rank only, the cache holding them at
 * local slots p / dcp (through block_table as above); row i sees the rank's local slots of positions
 * 0 .. n_past + i. o_lat normalized over them; lse [Tq, Hm] (heads [h0, h1) written) = m + log(sum e^(s - m));
 * a row with none of the rank's positions gets o_lat 0 and lse -inf. */
void k3c_mla_attend_part(const float *q_abs, int Tq, int Hm, int h0, int h1, int kv_lora, int rope,
                         const float *cache, const int32_t *block_table, int block_size, int n_past, int dcp,
                         int dcp_rank, float scale, float *o_lat, float *lse);
/* lat [kv_lora] = the exact merge of n partials for row t, head h (backend.h mla_merge): part r's o_lat
 * [T, Hm, kv_lora] at o_parts + r * stride, its lse [T, Hm] at lses + r * stride; weights e^(lse_r - max)
 * summed and applied in r order, f32. */
void k3c_mla_merge(const float *o_parts, const float *lses, size_t stride, int n, int Hm, int kv_lora, int t, int h,
                   float *lat);
/* The same attention in the expanded form (spec §3.2), for heads [h0, h1) of Tq query rows of one request:
 * q [Tq, Hm, nope + rope] per head [q_nope | q_pe]; every latent [c | k_pe] of positions 0 .. n_past + Tq - 1
 * (cache read as in k3c_mla_attend_paged; block_table NULL: contiguous rows [n_past + Tq, kv_lora + rope])
 * is decompressed per head through kv_b ([Hm * (nope + vh), kv_lora], rows per head [k_nope | v]) in f32:
 * k_nope = W_UK[h] c, v = W_UV[h] c, each rounded to bf16 when round_kv (as a bf16 matmul output is in the
 * stock rounding contract); score = (q_nope . k_nope + q_pe . k_pe) * scale, causal softmax in f32,
 * o [Tq, Hm * vh] (heads [h0, h1) written, not rounded) = sum p v. Equal to the absorbed form in exact
 * arithmetic. Decompression costs O(context x (nope + vh) x kv_lora) per head and call, shared by the Tq
 * rows: meant for prompt chunks, not decode. A row's result does not depend on Tq or the head range. */
void k3c_mla_attend_expanded(const float *q, int Tq, int Hm, int h0, int h1, int nope, int rope, int vh,
                             int kv_lora, const k3c_mat *kv_b, const float *cache, const int32_t *block_table,
                             int block_size, int n_past, float scale, int round_kv, float *o);

/* ---- AttnRes (cpu/attnres.c), spec §4.2 ---- */
/* Mix of n sources (pointers to [D] rows): s_j = rsqrt(mean(v_j^2) + eps) * sum_d v_j[d] * norm[d] * proj[d];
 * alpha = softmax(s); out = sum_j alpha_j v_j. */
void k3c_attnres_mix(const float *const *sources, int n, int D, const float *proj, const float *norm, float eps,
                     float *out);

/* ---- router (cpu/router.c), spec §5.3 ---- */
/* From fp32 logits [E] of one token: scores (sigmoid or softmax), selection on score + bias (grouped top-k
 * when num_expert_group > 1), weights = selected scores (renormalized when moe_renormalize) times
 * routed_scaling_factor. idx, weight: [k]. Ties break to the lower expert id. */
void k3c_route(const k3c_config *c, const float *logits, const float *bias, int *idx, float *weight);
/* How close k3c_route's choice for these logits is to a different one: the k-th selected expert's selection
 * score minus the best unselected expert's (among the kept groups), and under grouped selection also the
 * last kept group's score minus the best dropped group's; the smaller, >= 0 (INFINITY when nothing is left
 * out). Tests use it to tell a routing near-tie from a wrong result. */
float k3c_route_margin(const k3c_config *c, const float *logits, const float *bias);

#endif
